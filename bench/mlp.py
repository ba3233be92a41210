"""The two-phase mlp recipe on the GPU: one cooperative launch of both GEMMs against
the same two GEMMs as two launches of PipeLink kernels (gemm_swiglu, then gemm), the
monolithic build, and the fastest MLP a PyTorch user writes (cuBLAS on the
concatenated gate/up weight, a torch.compile'd SwiGLU, cuBLAS for the down projection;
and torch.compile of the whole function).

    python -m tests.gpu.build mlp gemm gemm_swiglu     # on the build machine
    python bench/mlp.py [--json out.json]             # on the GPU machine
    python bench/mlp.py --report bench/mlp.json       # -> the RESULTS.md section

Timing as bench/gemm_swiglu.py: interleaved CUDA-event medians over rotated inputs,
and triton's do_bench (L2 flushed). The floor is both GEMMs at the measured bf16 peak.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch

from pipelink import interleave_gate_up

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemm_swiglu import ROTATE, ceilings, flushed, geomean, interleaved  # noqa: E402
from results_md import bench_main, put_section  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHAPES = [(4096, 2 * 11008, 4096)]          # (K, N = 2 I, D): a Llama-7B MLP
MS = [128, 512, 2048, 8192]
BASELINES = ("cublas_act", "compiled")


def baselines() -> dict:
    silu = torch.nn.functional.silu
    act = torch.compile(lambda g, u: silu(g) * u, dynamic=True)

    def mlp(x, w, w2):  # noqa: ANN001, ANN202
        half = w.shape[0] // 2
        h = torch.mm(x, w.t())
        return torch.mm(act(h[:, :half], h[:, half:]), w2.t())

    def whole(x, wg, wu, w2):  # noqa: ANN001, ANN202
        return (silu(x @ wg.t()) * (x @ wu.t())) @ w2.t()

    compiled = torch.compile(whole, dynamic=True)
    return {"cublas_act": lambda s: mlp(s["x"], s["w_cat"], s["w2"]),
            "compiled": lambda s: compiled(s["x"], s["wg"], s["wu"], s["w2"])}


def inputs(m: int, k: int, n: int, d: int) -> list[dict[str, torch.Tensor]]:
    sets = []
    for _ in range(ROTATE):
        wg, wu = torch.randn(2, n // 2, k, device="cuda", dtype=torch.bfloat16) / math.sqrt(k)
        w2 = torch.randn(d, n // 2, device="cuda", dtype=torch.bfloat16) / math.sqrt(n // 2)
        sets.append({"x": torch.randn(m, k, device="cuda", dtype=torch.bfloat16),
                     "wg": wg, "wu": wu, "w_cat": torch.cat([wg, wu]),
                     "w1": interleave_gate_up(wg, wu),
                     "w2": w2,
                     "h": torch.empty(m, n // 2, device="cuda", dtype=torch.bfloat16),
                     "y": torch.empty(m, d, device="cuda", dtype=torch.bfloat16)})
    return sets


class Sets:
    """ROTATE input sets handed out in turn, so the weights come from HBM each call."""

    def __init__(self, m: int, k: int, n: int, d: int) -> None:
        self.sets, self.i = inputs(m, k, n, d), 0

    def next(self) -> dict[str, torch.Tensor]:
        self.i = (self.i + 1) % ROTATE
        return self.sets[self.i]


def variants(ops: dict, base: dict, sets: Sets) -> dict:  # noqa: ANN001
    def one(op):  # noqa: ANN001, ANN202
        def call() -> None:
            s = sets.next()
            op(s["x"], s["w1"], s["w2"], out={"h": s["h"], "y": s["y"]})
        return call

    def two() -> None:
        s = sets.next()
        ops["gemm_swiglu"](s["x"], s["w1"], out={"y": s["h"]})
        ops["gemm"](s["h"], s["w2"], out={"c": s["y"]})

    return {"linked": one(ops["linked"]), "mono": one(ops["mono"]), "two_launches": two,
            **{name: (lambda f=f: f(sets.next())) for name, f in base.items()}}


def run(build: Path, rounds: int, out: Path | None) -> list[dict]:
    import pipelink
    peak, _ = ceilings()
    ops = {"linked": pipelink.load(build / "sm_90a" / "mlp"),
           "mono": pipelink.load(build / "mono" / "mlp"),
           "gemm_swiglu": pipelink.load(build / "sm_90a" / "gemm_swiglu"),
           "gemm": pipelink.load(build / "sm_90a" / "gemm")}
    base = baselines()
    rows = []
    for k, n, d in SHAPES:
        for m in MS:
            fns = variants(ops, base, Sets(m, k, n, d))
            flops = 2 * m * k * n + 2 * m * (n // 2) * d
            reps = max(1, min(20, int(2e12 // flops)))
            row = {"M": m, "K": k, "N": n, "D": d, "events": interleaved(fns, rounds, reps),
                   "do_bench": flushed(fns), "floor": flops / peak / 1e9}
            rows.append(row)
            if out is not None:
                out.write_text(json.dumps(rows, indent=1))
            e = row["events"]
            best = min(e[b] for b in BASELINES)
            print(f"M={m:5d} | mlp linked {e['linked']:.3f} mono {e['mono']:.3f} two launches "
                  f"{e['two_launches']:.3f} best torch {best:.3f} ms ({best / e['linked']:.2f}x)"
                  f" floor {row['floor']:.3f}", flush=True)
    return rows


def report(path: Path) -> None:
    """Writes the '## MLP in two phases' section of RESULTS.md from a results JSON."""
    rows = json.loads(path.read_text())
    head = ("| M | linked ms | mono | two launches | best torch | linked vs torch | "
            "vs two launches | do_bench linked / torch | floor ms |")
    lines = ["## MLP in two phases (recipes/mlp.yaml)", "",
             f"Generated from {path.name} by `python bench/mlp.py --report {path.name}` "
             f"(H200). Y = SwiGLU(X W1^T) W2^T, K = {rows[0]['K']}, I = {rows[0]['N'] // 2}, "
             f"D = {rows[0]['D']}: one cooperative launch, phase 'down' after 'up' grid-wide, "
             "against the two PipeLink kernels launched one after the other and the fastest "
             "PyTorch MLP (cuBLAS + compiled SwiGLU + cuBLAS, or torch.compile of the whole).",
             "", head, "|" + "---|" * 9]
    ratios = []
    for r in rows:
        e, f = r["events"], r.get("do_bench") or {}
        best = min(e[b] for b in BASELINES)
        ratios.append(best / e["linked"])
        fb = (f"{min(f[b] for b in BASELINES) / f['linked']:.2f}x" if f else "n/a")
        lines.append(f"| {r['M']} | {e['linked']:.3f} | {e['mono']:.3f} | "
                     f"{e['two_launches']:.3f} | {best:.3f} | {best / e['linked']:.2f}x | "
                     f"{e['two_launches'] / e['linked']:.3f}x | {fb} | {r['floor']:.3f} |")
    lines += ["", f"Geometric mean, linked vs the best PyTorch MLP (events): "
                  f"{geomean(ratios):.3f}x.", ""]
    put_section("## MLP in two phases", "\n".join(lines))


def main() -> None:
    bench_main(run, report)


if __name__ == "__main__":
    main()
