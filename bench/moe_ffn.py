"""The MoE expert FFN (recipes/moe_ffn.yaml: grouped SwiGLU up-projection, then the
grouped down-projection, two phases of one launch) against the fastest path a PyTorch
user writes today: torch._grouped_mm on the concatenated gate/up weight, a compiled
SwiGLU, torch._grouped_mm again (the tokens already in expert order, as both paths
take them; routing and permutation are not timed here).

    python -m tests.gpu.build moe_ffn                  # on the build machine
    python bench/moe_ffn.py [--json out.json]          # on the GPU machine
    python bench/moe_ffn.py --report bench/moe_ffn.json

Configurations are the MoE training issue's (Mixtral-like: 8192 tokens, top-2, E 8,
D 4096, F 14336; fine-grained: 16384 tokens, top-6, E 64, D 2048, F 1408), with expert
loads from a skewed router. Timing as bench/gemm_swiglu.py: interleaved CUDA-event
medians over rotated inputs, and triton's do_bench (L2 flushed).
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
from grouped_gemm import routed_sizes  # noqa: E402
from results_md import bench_main, put_section  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = [("mixtral-like", 8192, 2, 8, 4096, 14336), ("fine-grained", 16384, 6, 64, 2048, 1408)]


def torch_ffn():  # noqa: ANN201
    silu = torch.nn.functional.silu
    act = torch.compile(lambda g, u: silu(g) * u, dynamic=True)

    def ffn(x, w_cat, w2, ends):  # noqa: ANN001, ANN202
        f = w_cat.shape[1] // 2
        gu = torch._grouped_mm(x, w_cat.transpose(-2, -1), offs=ends, out_dtype=torch.bfloat16)
        h = act(gu[:, :f], gu[:, f:])
        return torch._grouped_mm(h, w2.transpose(-2, -1), offs=ends, out_dtype=torch.bfloat16)
    return ffn


def inputs(rows: int, e: int, d: int, f: int) -> list[dict[str, torch.Tensor]]:
    sets = []
    for _ in range(ROTATE):
        wg, wu = torch.randn(2, e, f, d, device="cuda", dtype=torch.bfloat16) / math.sqrt(d)
        sets.append({"x": torch.randn(rows, d, device="cuda", dtype=torch.bfloat16),
                     "w_cat": torch.cat([wg, wu], dim=1),
                     "w1": interleave_gate_up(wg, wu),
                     "w2": torch.randn(e, d, f, device="cuda", dtype=torch.bfloat16)
                     / math.sqrt(f),
                     "h": torch.empty(rows, f, device="cuda", dtype=torch.bfloat16),
                     "y": torch.empty(rows, d, device="cuda", dtype=torch.bfloat16)})
    return sets


class Sets:
    def __init__(self, sets: list[dict[str, torch.Tensor]]) -> None:
        self.sets, self.i = sets, 0

    def next(self) -> dict[str, torch.Tensor]:
        self.i = (self.i + 1) % ROTATE
        return self.sets[self.i]


def run(build: Path, rounds: int, out: Path | None) -> list[dict]:
    import pipelink
    peak, _ = ceilings()
    ops = {"linked": pipelink.load(build / "sm_90a" / "moe_ffn"),
           "mono": pipelink.load(build / "mono" / "moe_ffn")}
    ffn = torch_ffn()
    rows_out = []
    for name, tokens, k, e, d, f in CONFIGS:
        sizes = routed_sizes(e, tokens * k, seed=tokens + e)
        ends = torch.tensor(sizes, device="cuda").cumsum(0).to(torch.int32)
        sets = Sets(inputs(tokens * k, e, d, f))

        def ours(op, sets=sets, ends=ends):  # noqa: ANN001, ANN202
            def call() -> None:
                s = sets.next()
                op(s["x"], s["w1"], s["w2"], ends, out={"h": s["h"], "y": s["y"]})
            return call

        def theirs(sets=sets, ends=ends) -> torch.Tensor:  # noqa: ANN001
            s = sets.next()
            return ffn(s["x"], s["w_cat"], s["w2"], ends)

        fns = {"linked": ours(ops["linked"]), "mono": ours(ops["mono"]),
               "grouped_mm": theirs}
        error = agree(fns, sets, ends)
        flops = 2 * tokens * k * d * 2 * f + 2 * tokens * k * f * d
        row = {"config": name, "tokens": tokens, "top_k": k, "E": e, "D": d, "F": f,
               "sizes": sizes, "max_rel_diff": error, "events": interleaved(fns, rounds, 1),
               "do_bench": flushed(fns), "floor": flops / peak / 1e9, "flops": flops}
        rows_out.append(row)
        if out is not None:
            out.write_text(json.dumps(rows_out, indent=1))
        ev = row["events"]
        print(f"{name}: linked {ev['linked']:.3f} mono {ev['mono']:.3f} grouped_mm path "
              f"{ev['grouped_mm']:.3f} ms ({ev['grouped_mm'] / ev['linked']:.2f}x, "
              f"{flops / ev['linked'] / 1e9:.0f} TFLOP/s) floor {row['floor']:.3f}", flush=True)
    return rows_out


def agree(fns: dict, sets: Sets, ends: torch.Tensor) -> float:  # noqa: ARG001
    """Y of the linked kernel against the torch path on one input set (both bf16)."""
    sets.i = ROTATE - 1
    fns["linked"]()
    ours = sets.sets[0]["y"].float()
    sets.i = ROTATE - 1
    theirs = fns["grouped_mm"]().float()
    torch.cuda.synchronize()
    diff = float(((ours - theirs).abs().max() / theirs.abs().max()).item())
    if not diff < 3e-2:
        raise SystemExit(f"moe_ffn disagrees with the torch path: {diff:.3g} x max |Y|")
    return diff


def report(path: Path) -> None:
    """Writes the '## MoE expert FFN' section of RESULTS.md from a results JSON."""
    rows = json.loads(path.read_text())
    lines = ["## MoE expert FFN in two phases (recipes/moe_ffn.yaml)", "",
             f"Generated from {path.name} by `python bench/moe_ffn.py --report "
             f"{path.name}` (H200). Tokens already in expert order (routing and permutation "
             "not timed), expert loads from a skewed router. Baseline: torch._grouped_mm on "
             "the concatenated gate/up weight, a compiled SwiGLU, torch._grouped_mm.", "",
             "| config | rows | E | D | F | linked ms | mono | grouped_mm path | x | "
             "do_bench x | TFLOP/s | floor ms |", "|" + "---|" * 12]
    ratios = []
    for r in rows:
        e, f = r["events"], r.get("do_bench") or {}
        x = e["grouped_mm"] / e["linked"]
        ratios.append(x)
        fx = f"{f['grouped_mm'] / f['linked']:.2f}x" if f else "n/a"
        lines.append(f"| {r['config']} | {r['tokens'] * r['top_k']} | {r['E']} | {r['D']} | "
                     f"{r['F']} | {e['linked']:.3f} | {e['mono']:.3f} | {e['grouped_mm']:.3f} "
                     f"| {x:.2f}x | {fx} | {r['flops'] / e['linked'] / 1e9:.0f} | "
                     f"{r['floor']:.3f} |")
    lines += ["", f"Geometric mean vs the torch._grouped_mm path (events): "
                  f"{geomean(ratios):.3f}x.", ""]
    put_section("## MoE expert FFN", "\n".join(lines))


def main() -> None:
    bench_main(run, report)


if __name__ == "__main__":
    main()
