"""Attention forward on the GPU: the attn_* recipes (linked and monolithic) against
SDPA (PyTorch's fastest dense/causal path: FlashAttention or cuDNN; for the sliding
window, a boolean mask) and torch.compile'd FlexAttention with the same mask_mod,
side by side in one run.

    python -m tests.gpu.build attn_causal attn_dense attn_sliding  # build machine
    python bench/attention.py --json bench/attention.json        # GPU machine
    python bench/attention.py --report bench/attention.json      # RESULTS.md section

Q [B, S, H, D], K and V [B, S, H, D], bf16; the baselines get the same tensors
(SDPA and Flex take [B, H, S, D], so they are handed transposed views, as a user with
this layout would). TFLOP/s count the unmasked work only: 4 D flops per (query, key)
pair a query sees. Times are medians in ms: CUDA events, interleaved over two input
sets; and triton.testing.do_bench (L2 flushed). Every variant is checked against SDPA
first. The floor is the unmasked FLOPs at the measured bf16 matmul peak.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from results_md import bench_main, put_section  # noqa: E402

from bench.gemm_swiglu import ceilings, geomean, interleaved  # noqa: E402

ROTATE = 2
SHAPES = [(4, 16, 4096, 128), (1, 16, 16384, 128)]   # B, H, S, D
WINDOW = 1024
# recipe -> the FlexAttention mask_mod of the same mask (None: dense)
MASKS = {"attn_causal": lambda b, h, q, kv: q >= kv,
         "attn_dense": None,
         "attn_sliding": lambda b, h, q, kv: (q >= kv) & (q - kv <= WINDOW)}


def pairs_seen(s: int, recipe: str) -> int:
    """(query, key) pairs the mask keeps."""
    if recipe == "attn_dense":
        return s * s
    if recipe == "attn_causal":
        return s * (s + 1) // 2
    w = min(WINDOW, s - 1)   # sliding: keys q - WINDOW .. q
    return (w + 1) * s - w * (w + 1) // 2


def bench_case(ops: dict, b: int, h: int, s: int, d: int, recipe: str, rounds: int) -> dict:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    sets = [tuple(torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
                  for _ in range(3)) for _ in range(ROTATE)]
    outs = [(torch.empty(b, s, h, d, device="cuda", dtype=torch.bfloat16),
             torch.empty(b, h, s, device="cuda", dtype=torch.float32)) for _ in range(ROTATE)]
    turn = [0]

    def pick() -> int:
        turn[0] = (turn[0] + 1) % ROTATE
        return turn[0]

    def ours(op):  # noqa: ANN001, ANN202
        def call() -> object:
            i = pick()
            return op(*sets[i], out=outs[i])[0]
        return call

    window = None
    if recipe == "attn_sliding":   # SDPA takes the window as a dense boolean mask
        q_at = torch.arange(s, device="cuda")
        window = (q_at[:, None] >= q_at[None, :]) & (q_at[:, None] - q_at[None, :] <= WINDOW)

    def sdpa() -> object:
        q, k, v = (t.transpose(1, 2) for t in sets[pick()])
        return F.scaled_dot_product_attention(q, k, v, attn_mask=window,
                                              is_causal=recipe == "attn_causal").transpose(1, 2)

    mask_mod = MASKS[recipe]
    block_mask = create_block_mask(mask_mod, None, None, s, s) if mask_mod else None
    flex_compiled = torch.compile(flex_attention)

    def flex() -> object:
        q, k, v = (t.transpose(1, 2) for t in sets[pick()])
        return flex_compiled(q, k, v, block_mask=block_mask).transpose(1, 2)

    fns = {"linked": ours(ops["linked"]), "mono": ours(ops["mono"]), "sdpa": sdpa,
           "flex": flex}
    errors = {}
    for name, fn in fns.items():
        turn[0] = ROTATE - 1
        got = fn().float()
        turn[0] = ROTATE - 1
        want = sdpa().float()
        errors[name] = float((got - want).abs().max())
        if not errors[name] < 3e-2:
            raise SystemExit(f"{name} is wrong: max |diff| vs SDPA {errors[name]:.3g}")
    events = interleaved(fns, rounds, 1)
    try:
        from triton.testing import do_bench
        flushed = {k: do_bench(f, warmup=10, rep=100, return_mode="median")
                   for k, f in fns.items()}
    except ImportError:
        flushed = None
    return {"events_ms": events, "do_bench_ms": flushed, "max_abs_diff_vs_sdpa": errors}


def run(build: Path, rounds: int, out: Path | None) -> None:
    import torch

    import pipelink
    peak, _ = ceilings()
    rows = []
    for recipe in MASKS:
        ops = {"linked": pipelink.load(build / "sm_90a" / recipe),
               "mono": pipelink.load(build / "mono" / recipe)}
        for b, h, s, d in SHAPES:
            r = bench_case(ops, b, h, s, d, recipe, rounds)
            flops = 4 * b * h * d * pairs_seen(s, recipe)
            r.update(recipe=recipe, B=b, H=h, S=s, D=d, flops=flops,
                     floor_ms=flops / peak / 1e9)
            rows.append(r)
            e = r["events_ms"]
            print(f"{recipe} B{b} H{h} S{s} D{d} | linked {e['linked']:.3f} mono "
                  f"{e['mono']:.3f} sdpa {e['sdpa']:.3f} flex {e['flex']:.3f} | "
                  f"{flops / e['linked'] / 1e9:.0f} TFLOP/s, sdpa "
                  f"{flops / e['sdpa'] / 1e9:.0f}", flush=True)
    data = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "peak_tflops": peak, "rows": rows}
    if out:
        out.write_text(json.dumps(data, indent=1) + "\n")


def report(path: Path) -> None:
    """Writes the '## Attention forward' section of RESULTS.md."""
    data = json.loads(path.read_text())
    rows = data["rows"]
    lines = [f"## Attention forward ({data['gpu']})", "",
             f"Generated by `python bench/attention.py --report bench/{path.name}`; torch "
             f"{data['torch']}. recipes/attn_causal.yaml, attn_dense.yaml and "
             "attn_sliding.yaml (window 1024; one attn_fwd_core object, the mask linked "
             "in) against SDPA and torch.compile'd FlexAttention (the same mask_mod) on "
             "the same [B, S, H, D] tensors. Medians in ms (CUDA events, "
             "interleaved; do_bench with L2 flushed); TFLOP/s of unmasked work; floor: "
             f"that work at the measured bf16 matmul peak ({data['peak_tflops']:.0f} "
             "TFLOP/s).", ""]
    for recipe in MASKS:
        mine = [r for r in rows if r["recipe"] == recipe]
        if mine:
            def ratio(num: str, den: str, rows: list[dict] = mine) -> float:
                return geomean([r["events_ms"][num] / r["events_ms"][den] for r in rows])
            lines.append(f"- {recipe}: vs SDPA geometric mean {ratio('sdpa', 'linked'):.3f}x, "
                         f"vs FlexAttention {ratio('flex', 'linked'):.3f}x, linked/mono "
                         f"{ratio('linked', 'mono'):.4f}")
    lines += ["", "| recipe | B | H | S | D | linked | mono | SDPA | Flex | x SDPA | x Flex "
              "| TFLOP/s linked | TFLOP/s SDPA | do_bench linked | do_bench SDPA | floor |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- "
              "| --- | --- | --- |"]
    for r in rows:
        e, d = r["events_ms"], r["do_bench_ms"] or {}
        lines.append(f"| {r['recipe']} | {r['B']} | {r['H']} | {r['S']} | {r['D']} | "
                     f"{e['linked']:.3f} | {e['mono']:.3f} | {e['sdpa']:.3f} | "
                     f"{e['flex']:.3f} | {e['sdpa'] / e['linked']:.2f} | "
                     f"{e['flex'] / e['linked']:.2f} | {r['flops'] / e['linked'] / 1e9:.0f} | "
                     f"{r['flops'] / e['sdpa'] / 1e9:.0f} | {d.get('linked', 0):.3f} | "
                     f"{d.get('sdpa', 0):.3f} | {r['floor_ms']:.3f} |")
    put_section("## Attention forward", "\n".join(lines))


if __name__ == "__main__":
    bench_main(run, report, rounds=7)
