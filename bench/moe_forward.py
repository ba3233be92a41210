"""An MoE layer's forward after routing (recipes/moe_forward.yaml: dispatch, permute,
up, down, combine in one launch) against the path a PyTorch user writes today: a
stable sort of the choices, index_select of the tokens, torch._grouped_mm on the
concatenated gate/up weight, a compiled SwiGLU, torch._grouped_mm, and a weighted
gather-sum back to token order. Both start from the same top-k ids and weights. Where
moe_layer is built and the config routes top-2, the whole layer is timed too
(recipes/moe_layer.yaml, router included) against the same torch path behind
softmax(x Wr^T).topk(2), renormalised.

    python -m tests.gpu.build moe_forward               # on the build machine
    python bench/moe_forward.py [--json out.json]       # on the GPU machine
    python bench/moe_forward.py --report bench/moe_forward.json

Times: interleaved CUDA-event medians over rotated inputs and triton's do_bench (L2
flushed), as bench/gemm_swiglu.py; peak memory: torch.cuda.max_memory_allocated over
one call of each, from the same baseline.
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
from moe_ffn import CONFIGS  # noqa: E402  (the same two model shapes)
from results_md import bench_main, put_section  # noqa: E402


def torch_forward():  # noqa: ANN201
    silu = torch.nn.functional.silu
    act = torch.compile(lambda g, u: silu(g) * u, dynamic=True)

    def forward(x, ids, p, w_cat, w2):  # noqa: ANN001, ANN202
        e, k, f = w_cat.shape[0], ids.shape[1], w_cat.shape[1] // 2
        order = torch.sort(ids.flatten(), stable=True).indices
        slot = torch.empty_like(order)
        slot[order] = torch.arange(order.numel(), device=order.device)
        ends = torch.bincount(ids.flatten(), minlength=e).cumsum(0).to(torch.int32)
        xp = x.index_select(0, order // k)
        gu = torch._grouped_mm(xp, w_cat.transpose(-2, -1), offs=ends, out_dtype=torch.bfloat16)
        h = act(gu[:, :f], gu[:, f:])
        yp = torch._grouped_mm(h, w2.transpose(-2, -1), offs=ends, out_dtype=torch.bfloat16)
        return (yp[slot.view(-1, k)].float() * p[..., None]).sum(1).to(torch.bfloat16)
    return forward


def torch_layer(forward, top_k: int = 2):  # noqa: ANN001, ANN201
    """The router as a PyTorch user writes it, then ``forward``."""
    def layer(x, wr, w_cat, w2):  # noqa: ANN001, ANN202
        w, ids = torch.softmax(x @ wr.t(), dim=1, dtype=torch.float32).topk(top_k, dim=1)
        p = w / w.sum(1, keepdim=True)
        return forward(x, ids.to(torch.int32), p, w_cat, w2)
    return layer


def routing(t: int, e: int, k: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k of softmaxed logits with a log-normal expert popularity (skewed loads)."""
    bias = torch.randn(e, device="cuda", generator=gen) * 0.8
    logits = torch.randn(t, e, device="cuda", generator=gen) + bias
    w, ids = torch.softmax(logits, dim=1).topk(k, dim=1)
    return ids.to(torch.int32).contiguous(), (w / w.sum(1, keepdim=True)).float().contiguous()


def inputs(t: int, k: int, e: int, d: int, f: int, seed: int) -> list[dict]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    sets = []
    for _ in range(ROTATE):
        wg, wu = (torch.randn(2, e, f, d, device="cuda", generator=gen) / math.sqrt(d)) \
            .to(torch.bfloat16)
        ids, p = routing(t, e, k, gen)
        sets.append({"x": torch.randn(t, d, device="cuda", generator=gen).to(torch.bfloat16),
                     "ids": ids, "p": p, "w_cat": torch.cat([wg, wu], dim=1),
                     "w1": interleave_gate_up(wg, wu),
                     "wr": (torch.randn(e, d, device="cuda", generator=gen)
                            / math.sqrt(d)).to(torch.bfloat16),
                     "w2": (torch.randn(e, d, f, device="cuda", generator=gen)
                            / math.sqrt(f)).to(torch.bfloat16)})
    return sets


def peak_mb(fn) -> float:  # noqa: ANN001
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2 ** 20


def run(build: Path, rounds: int, out: Path | None) -> list[dict]:
    import pipelink
    peak, _ = ceilings()
    ops = {"linked": pipelink.load(build / "sm_90a" / "moe_forward"),
           "mono": pipelink.load(build / "mono" / "moe_forward")}
    if (build / "sm_90a" / "moe_layer").is_dir():
        ops["layer"] = pipelink.load(build / "sm_90a" / "moe_layer")
    forward = torch_forward()
    layer = torch_layer(forward)
    rows = []
    for name, t, k, e, d, f in CONFIGS:
        sets, turn = inputs(t, k, e, d, f, seed=t + e), [0]

        def pick(sets=sets, turn=turn) -> dict:  # noqa: ANN001
            turn[0] = (turn[0] + 1) % ROTATE
            return sets[turn[0]]

        def ours(op, pick=pick):  # noqa: ANN001, ANN202
            return lambda: (lambda s: op(s["x"], s["ids"], s["p"], s["w1"], s["w2"]))(pick())

        def theirs(pick=pick):  # noqa: ANN001, ANN202
            s = pick()
            return forward(s["x"], s["ids"], s["p"], s["w_cat"], s["w2"])

        fns = {"linked": ours(ops["linked"]), "mono": ours(ops["mono"]), "torch": theirs}
        if "layer" in ops and k == 2:
            fns["layer"] = lambda op=ops["layer"], pick=pick: (
                lambda s: op(s["x"], s["wr"], s["w1"], s["w2"]))(pick())
            fns["torch_layer"] = lambda pick=pick: (
                lambda s: layer(s["x"], s["wr"], s["w_cat"], s["w2"]))(pick())
        turn[0] = ROTATE - 1
        y_ours = fns["linked"]()[-1].float()
        turn[0] = ROTATE - 1
        y_theirs = fns["torch"]().float()
        diff = float(((y_ours - y_theirs).abs().max() / y_theirs.abs().max()).item())
        if not diff < 3e-2:
            raise SystemExit(f"{name}: moe_forward disagrees with the torch path ({diff:.3g})")
        memory = {v: peak_mb(fns[v]) for v in ("linked", "torch")}
        flops = 2 * t * k * d * 2 * f + 2 * t * k * f * d
        row = {"config": name, "tokens": t, "top_k": k, "E": e, "D": d, "F": f,
               "max_rel_diff": diff, "events": interleaved(fns, rounds, 1),
               "do_bench": flushed(fns), "peak_mb": memory, "flops": flops,
               "floor": flops / peak / 1e9}
        rows.append(row)
        if out is not None:
            out.write_text(json.dumps(rows, indent=1))
        ev = row["events"]
        print(f"{name}: linked {ev['linked']:.3f} mono {ev['mono']:.3f} torch {ev['torch']:.3f}"
              f" ms ({ev['torch'] / ev['linked']:.2f}x) peak MB {memory}"
              + (f"; layer {ev['layer']:.3f} torch {ev['torch_layer']:.3f} ms "
                 f"({ev['torch_layer'] / ev['layer']:.2f}x)" if "layer" in ev else ""),
              flush=True)
    return rows


def report(path: Path) -> None:
    rows = json.loads(path.read_text())
    lines = ["## MoE forward after routing, one launch (recipes/moe_forward.yaml)", "",
             f"Generated from {path.name} by `python bench/moe_forward.py --report "
             f"{path.name}` (H200). Five phases (dispatch, permute, up, down, combine) "
             "against torch: stable sort + index_select + torch._grouped_mm + compiled "
             "SwiGLU + torch._grouped_mm + weighted gather-sum. Both from the same top-k ids "
             "and weights (router not timed). Peak memory: max_memory_allocated over one "
             "call, outputs included.", "",
             "| config | T | k | E | linked ms | mono | torch | x | do_bench x | TFLOP/s | "
             "peak MB linked / torch | floor ms |", "|" + "---|" * 12]
    ratios = []
    for r in rows:
        e, f, m = r["events"], r.get("do_bench") or {}, r["peak_mb"]
        ratios.append(e["torch"] / e["linked"])
        fx = f"{f['torch'] / f['linked']:.2f}x" if f else "n/a"
        lines.append(f"| {r['config']} | {r['tokens']} | {r['top_k']} | {r['E']} | "
                     f"{e['linked']:.3f} | {e['mono']:.3f} | {e['torch']:.3f} | "
                     f"{e['torch'] / e['linked']:.2f}x | {fx} | "
                     f"{r['flops'] / e['linked'] / 1e9:.0f} | {m['linked']:.0f} / "
                     f"{m['torch']:.0f} | {r['floor']:.3f} |")
    lines += ["", f"Geometric mean vs the torch path (events): {geomean(ratios):.3f}x.", ""]
    for r in rows:
        e, f = r["events"], r.get("do_bench") or {}
        if "layer" not in e:
            continue
        fx = (f" ({f['torch_layer'] / f['layer']:.2f}x do_bench)" if "layer" in f else "")
        lines += [f"The whole layer, router included (recipes/moe_layer.yaml, top-2), "
                  f"{r['config']}: {e['layer']:.3f} ms against {e['torch_layer']:.3f} ms "
                  f"for softmax(x Wr^T).topk(2) + the torch path: "
                  f"**{e['torch_layer'] / e['layer']:.2f}x** (events){fx}.", ""]
    put_section("## MoE forward after routing", "\n".join(lines))


def main() -> None:
    bench_main(run, report)


if __name__ == "__main__":
    main()
