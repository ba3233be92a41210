"""grouped_wgrad (the MoE expert weight gradients) on the GPU: linked vs monolithic vs
torch._grouped_mm over K-packed groups (what a PyTorch user's backward calls) and a
per-expert loop of torch.mm.

    python -m tests.gpu.build grouped_wgrad                          # build machine
    python bench/grouped_wgrad.py --json bench/grouped_wgrad.json     # GPU machine
    python bench/grouped_wgrad.py --report bench/grouped_wgrad.json   # RESULTS.md section

dW[g] = dY_g^T X_g for the two projections of the issue's two MoE configurations
(Mixtral-like T 8192, top-2, E 8, H 4096, F 14336; fine-grained T 16384, top-6, E 64,
H 2048, F 1408): dW2 [E, H, F] from dYp [R, H] and the activations [R, F], dW1
[E, 2F, H] from dA [R, 2F] and Xp [R, H]. Expert sizes are router-like (log-normal
popularity, so some experts are far larger), each segment padded to 64 rows with
zeros (the recipe's contract; torch gets the same padded tensors). Times are medians
in ms: CUDA events, interleaved, over rotating input sets; and triton.testing.do_bench
(L2 flushed). Each variant is checked against fp32 first. The floor is the larger of
the FLOPs at the measured bf16 peak and the bytes (dY, X, dW) at the copy bandwidth.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from results_md import bench_main, put_section  # noqa: E402

from bench.gemm_swiglu import ceilings, geomean, interleaved  # noqa: E402
from bench.gemm_swiglu import flushed as flushed_medians  # noqa: E402
from bench.grouped_gemm import routed_sizes  # noqa: E402

ALIGN = 64
ROTATE = 2
# (configuration, experts, tokens x top-k, hidden H, expert F)
CONFIGS = [("mixtral-like", 8, 8192 * 2, 4096, 14336),
           ("fine-grained", 64, 16384 * 6, 2048, 1408)]


def padded_ends(sizes: list[int]) -> list[int]:
    ends, at = [], 0
    for s in sizes:
        at += -(-s // ALIGN) * ALIGN
        ends.append(at)
    return ends


def operands(sizes: list[int], ends: list[int], m: int, n: int):  # noqa: ANN202
    """dY [R, M] and X [R, N], each segment's padding rows zero."""
    import torch
    rows = ends[-1]
    dy = torch.randn(rows, m, device="cuda") / 16
    x = torch.randn(rows, n, device="cuda")
    begin = 0
    for s, end in zip(sizes, ends, strict=True):
        dy[begin + s:end] = 0
        x[begin + s:end] = 0
        begin = end
    return dy.to(torch.bfloat16), x.to(torch.bfloat16)


def bench_case(ops: dict, sizes: list[int], m: int, n: int, rounds: int) -> dict:
    import torch
    ends_list = padded_ends(sizes)
    ends = torch.tensor(ends_list, dtype=torch.int32, device="cuda")
    groups = len(sizes)
    sets = [(*operands(sizes, ends_list, m, n),
             torch.empty(groups, m, n, device="cuda", dtype=torch.bfloat16))
            for _ in range(ROTATE)]
    turn = [0]

    def inputs() -> tuple:
        turn[0] = (turn[0] + 1) % ROTATE
        return sets[turn[0]]

    def ours(op):  # noqa: ANN001, ANN202
        def call() -> object:
            dy, x, dw = inputs()
            return op(dy, x, ends, out=dw)
        return call

    def grouped_mm() -> object:
        dy, x, _ = inputs()
        return torch._grouped_mm(dy.t(), x, offs=ends, out_dtype=torch.bfloat16)

    def loop() -> object:
        dy, x, dw = inputs()
        begin = 0
        for g, end in enumerate(ends_list):
            torch.mm(dy[begin:end].t(), x[begin:end], out=dw[g])
            begin = end
        return dw

    fns = {"linked": ours(ops["linked"]), "mono": ours(ops["mono"]),
           "grouped_mm": grouped_mm, "loop": loop}
    errors = check(fns, sets, ends_list, turn)
    events = interleaved(fns, rounds, 1)
    flushed = flushed_medians(fns)
    return {"events_ms": events, "do_bench_ms": flushed, "max_rel_err": errors}


def check(fns: dict, sets: list, ends: list[int], turn: list[int]) -> dict:
    """Each variant on the first input set against fp32, problem by problem (largest
    error relative to the reference's largest magnitude)."""
    import torch
    dy, x, _ = sets[0]
    out = {}
    for name, fn in fns.items():
        turn[0] = ROTATE - 1
        dw = fn().float()
        torch.cuda.synchronize()
        worst, begin = 0.0, 0
        for g, end in enumerate(ends):
            ref = dy[begin:end].float().t() @ x[begin:end].float()
            worst = max(worst, float((dw[g] - ref).abs().max() / ref.abs().max().clamp(min=1e-6)))
            begin = end
        out[name] = worst
        if not worst < 2e-2:
            raise SystemExit(f"{name} is wrong: max error {worst:.3g} x max |ref|")
    return out


def run(build: Path, rounds: int, out: Path | None) -> None:
    import torch

    import pipelink
    peak, bw = ceilings()
    ops = {"linked": pipelink.load(build / "sm_90a" / "grouped_wgrad"),
           "mono": pipelink.load(build / "mono" / "grouped_wgrad")}
    rows = []
    for name, experts, routed, hidden, ffn in CONFIGS:
        sizes = routed_sizes(experts, routed, seed=experts + routed)
        r_rows = padded_ends(sizes)[-1]
        for grad, m, n in (("dW2", hidden, ffn), ("dW1", 2 * ffn, hidden)):
            r = bench_case(ops, sizes, m, n, rounds)
            flops = 2 * r_rows * m * n
            bytes_ = 2 * (r_rows * (m + n) + experts * m * n)
            r.update(config=name, grad=grad, E=experts, R=r_rows, M=m, N=n,
                     largest=max(sizes), empty=sum(s == 0 for s in sizes), flops=flops,
                     floor_ms=max(flops / peak / 1e9, bytes_ / bw / 1e6))
            rows.append(r)
            e = r["events_ms"]
            print(f"{name} {grad} E={experts} R={r_rows} M={m} N={n} | linked {e['linked']:.3f} "
                  f"mono {e['mono']:.3f} grouped_mm {e['grouped_mm']:.3f} loop {e['loop']:.3f} "
                  f"floor {r['floor_ms']:.3f}", flush=True)
    data = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "peak_tflops": peak, "copy_gbs": bw, "rows": rows}
    if out:
        out.write_text(json.dumps(data, indent=1) + "\n")


def report(path: Path) -> None:
    """Writes the '## Grouped weight gradients' section of RESULTS.md."""
    data = json.loads(path.read_text())
    rows = data["rows"]
    ev = [r["events_ms"]["grouped_mm"] / r["events_ms"]["linked"] for r in rows]
    lm = [abs(r["events_ms"]["linked"] / r["events_ms"]["mono"] - 1) for r in rows]
    lines = [f"## Grouped weight gradients ({data['gpu']})", "",
             f"Generated by `python bench/grouped_wgrad.py --report bench/{path.name}`; "
             f"torch {data['torch']}. recipes/grouped_wgrad.yaml: dW[g] = dY_g^T X_g over "
             "expert segments packed along K (padded to 64 rows), both operands read "
             "MN-major in place, against torch._grouped_mm over the same offsets and a "
             "per-expert torch.mm loop. Medians in ms (CUDA events, interleaved; "
             "do_bench with L2 flushed).", "",
             f"- vs torch._grouped_mm, geometric mean: **{geomean(ev):.3f}x** (events); "
             f"|linked/mono - 1| median {statistics.median(lm) * 100:.2f}%", "",
             "| config | grad | E | R | M | N | linked | mono | _grouped_mm | loop | x "
             "_grouped_mm | TFLOP/s | do_bench linked | do_bench _grouped_mm | floor |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- "
             "| --- | --- |"]
    for r in rows:
        e, d = r["events_ms"], r["do_bench_ms"] or {}
        lines.append(f"| {r['config']} | {r['grad']} | {r['E']} | {r['R']} | {r['M']} | "
                     f"{r['N']} | {e['linked']:.3f} | {e['mono']:.3f} | "
                     f"{e['grouped_mm']:.3f} | {e['loop']:.3f} | "
                     f"{e['grouped_mm'] / e['linked']:.2f} | "
                     f"{r['flops'] / e['linked'] / 1e9:.0f} | {d.get('linked', 0):.3f} | "
                     f"{d.get('grouped_mm', 0):.3f} | {r['floor_ms']:.3f} |")
    put_section("## Grouped weight gradients", "\n".join(lines))


if __name__ == "__main__":
    bench_main(run, report, rounds=7)
