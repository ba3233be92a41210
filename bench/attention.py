"""Attention forward on the GPU: the attn_* recipes (linked and monolithic) against
SDPA (PyTorch's fastest dense/causal path: FlashAttention or cuDNN; for the other
masks, the mask as a dense boolean tensor) and torch.compile'd FlexAttention with the
same mask_mod (and, for attn_block_sparse, the very BlockMask our op reads), side by
side in one run. attn_document packs the same B S tokens as one sequence of documents
of 256 to 3072 tokens (by cu_seqlens; attn_document_ids: the same documents named by an
id per token, as FlexAttention's document mask reads them); attn_paged reads K and V
from shuffled 64-token pages, which the baselines gather first (timed with them).

    python -m tests.gpu.build attn_causal attn_dense attn_sliding attn_block_sparse \
        attn_document attn_document_ids attn_paged attn_causal_d64 attn_dense_d64 \
        attn_sliding_d64 attn_block_sparse_d64 attn_paged_d64    # build machine
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
from results_md import (  # noqa: E402
    Bar,
    BarGroup,
    BarLayout,
    bar_chart,
    bench_main,
    put_section,
    write_rows,
    write_text,
)

from bench.gemm_swiglu import ceilings, geomean, interleaved  # noqa: E402
from bench.gemm_swiglu import flushed as flushed_medians  # noqa: E402

ROTATE = 2
# B, H, S, D per head dim: the *_d64 recipes are built for 64, the others for 128.
SHAPES = {128: [(4, 16, 4096, 128), (1, 16, 16384, 128)], 64: [(8, 16, 2048, 64)]}
WINDOW = 1024
RECIPES = ("attn_causal", "attn_dense", "attn_sliding", "attn_block_sparse", "attn_document",
           "attn_document_ids", "attn_paged", "attn_softcap", "attn_alibi", "attn_causal_d64",
           "attn_dense_d64", "attn_sliding_d64", "attn_block_sparse_d64", "attn_paged_d64")
# Causal with a score modifier: SDPA has none (ALiBi only as an [H, S, S] bias tensor),
# so FlexAttention's score_mod is both the baseline and the reference.
SCORED = ("attn_softcap", "attn_alibi")
SOFTCAP = 30.0
HEAD_DIM_64 = "_d64"    # in the name of a recipe built at head dim 64
# Packed documents: by offsets (rows without a batch), or by an id per token (B = 1).
DOCUMENTS = ("attn_document", "attn_document_ids")


def shapes_of(recipe: str) -> list[tuple[int, int, int, int]]:
    return SHAPES[64 if HEAD_DIM_64 in recipe else 128]


def mask_recipe(recipe: str) -> str:
    """The head-dim-128 recipe whose mask (and baselines) a recipe shares."""
    return recipe.replace(HEAD_DIM_64, "")
PAGE = 64   # attn_paged's cache: 64-token pages in shuffled blocks


def sparse_blocks(b, h, q, kv):  # noqa: ANN001, ANN201
    """attn_block_sparse's mask: causal, over every third key block back and the one
    just before the query's (a strided sparse pattern)."""
    qb, kb = q // 128, kv // 128
    return (q >= kv) & (((qb - kb) % 3 == 0) | (qb - kb == 1))


def document_lengths(total: int, seed: int) -> list[int]:
    """Documents of 256 to 3072 tokens (uniform), the last one cut to fill `total`."""
    import random
    rng, out = random.Random(seed), []
    while sum(out) < total:
        out.append(min(rng.randint(256, 3072), total - sum(out)))
    return out


def page_cache(t, seed: int):  # noqa: ANN001, ANN201
    """[B, S, HKV, D] scattered into shuffled 64-token pages, and the block table."""
    import torch
    b, s, hkv, d = t.shape
    pages = -(-s // PAGE)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    table = torch.randperm(b * pages, generator=gen).view(b, pages).cuda()
    cache = torch.empty(b * pages, PAGE, hkv, d, device="cuda", dtype=t.dtype)
    cache[table.flatten()] = t.reshape(b * pages, PAGE, hkv, d)
    return cache, table.to(torch.int32)


def mask_mod_of(recipe: str, doc=None):  # noqa: ANN001, ANN201
    """The FlexAttention mask_mod of a recipe's mask (None: dense)."""
    if recipe == "attn_dense":
        return None
    if recipe == "attn_sliding":
        return lambda b, h, q, kv: (q >= kv) & (q - kv <= WINDOW)
    if recipe == "attn_block_sparse":
        return sparse_blocks
    if recipe in DOCUMENTS:
        return lambda b, h, q, kv: (doc[q] == doc[kv]) & (q >= kv)
    return lambda b, h, q, kv: q >= kv


def score_mod_of(recipe: str, heads: int):  # noqa: ANN201
    """The FlexAttention score_mod of a recipe's score modifier (None: the identity)."""
    import torch
    if recipe == "attn_softcap":
        return lambda score, b, h, q, kv: SOFTCAP * torch.tanh(score / SOFTCAP)
    if recipe == "attn_alibi":
        slopes = torch.exp2(-8.0 * torch.arange(1, heads + 1, device="cuda") / heads)
        return lambda score, b, h, q, kv: score + slopes[h] * (kv - q)
    return None


def dense_mask(mask_mod, s: int):  # noqa: ANN001, ANN201
    """[s, s] booleans of a mask_mod (for SDPA and for counting the work)."""
    import torch
    at = torch.arange(s, device="cuda")
    zero = torch.zeros((), dtype=torch.long, device="cuda")
    return mask_mod(zero, zero, at[:, None], at[None, :])


def bench_case(ops: dict, b: int, h: int, s: int, d: int, recipe: str, rounds: int) -> dict:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    import pipelink
    documents = rows = recipe in DOCUMENTS   # rows: [T, H, D] without a batch dimension
    if documents:                  # the same tokens as one packed sequence of B S rows
        b, s = 1, b * s
    sets = [tuple(torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
                  for _ in range(3)) for _ in range(ROTATE)]
    outs = [(torch.empty(b, s, h, d, device="cuda", dtype=torch.bfloat16),
             torch.empty(b, h, s, device="cuda", dtype=torch.float32)) for _ in range(ROTATE)]
    doc, extra = None, ()
    if documents:
        lengths = document_lengths(s, seed=s)
        cu = torch.tensor([0, *lengths], device="cuda").cumsum(0).to(torch.int32)
        doc = torch.repeat_interleave(torch.arange(len(lengths), device="cuda"),
                                      torch.tensor(lengths, device="cuda"))
        extra = (cu,) if recipe == "attn_document" else (doc.to(torch.int32),)
        # Packed rows: [T, H, D] without a batch dimension, LSE [H, T]
        sets = [tuple(t[0] for t in qkv) for qkv in sets]
        outs = [(o[0], lse[0]) for o, lse in outs]
    recipe = mask_recipe(recipe)
    mask_mod = mask_mod_of("attn_causal" if recipe == "attn_paged" else recipe, doc)
    block_mask = create_block_mask(mask_mod, None, None, s, s) if mask_mod else None
    if recipe == "attn_block_sparse":
        extra = pipelink.block_mask_tensors(block_mask)
    gathered = recipe == "attn_paged"
    if gathered:    # the op reads the caches; the baselines gather K and V first
        caches = [(*page_cache(k, seed=i), page_cache(v, seed=i)[0])
                  for i, (_, k, v) in enumerate(sets)]
    score_mod = score_mod_of(recipe, h)
    causal = recipe in ("attn_causal", "attn_paged", *SCORED)
    boolean = (dense_mask(mask_mod, s)
               if not causal and recipe != "attn_dense" else None)
    pairs = s * (s + 1) // 2 if causal else (
        s * s if boolean is None else int(boolean.sum()))
    turn = [0]

    def pick() -> int:
        turn[0] = (turn[0] + 1) % ROTATE
        return turn[0]

    def batched(t):  # noqa: ANN001, ANN202
        return (t[None] if rows else t).transpose(1, 2)

    def operands() -> tuple:
        """The next input set as the baselines take it (paged: K and V gathered)."""
        i = pick()
        if not gathered:
            return tuple(batched(t) for t in sets[i])
        k_cache, table, v_cache = caches[i]
        k, v = (c[table.flatten()].view(b, -1, *c.shape[2:])[:, :s] for c in (k_cache, v_cache))
        return sets[i][0].transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def ours(op):  # noqa: ANN001, ANN202
        def call() -> object:
            i = pick()
            args = (sets[i][0], caches[i][0], caches[i][2], caches[i][1]) if gathered \
                else sets[i]
            o = op(*args, *extra, out=outs[i])[0]
            return o[None] if rows else o
        return call

    def sdpa() -> object:
        q, k, v = operands()
        return F.scaled_dot_product_attention(q, k, v, attn_mask=boolean,
                                              is_causal=causal).transpose(1, 2)

    flex_compiled = torch.compile(flex_attention)

    def flex() -> object:
        q, k, v = operands()
        return flex_compiled(q, k, v, score_mod=score_mod,
                             block_mask=block_mask).transpose(1, 2)

    fns = {"linked": ours(ops["linked"]), "mono": ours(ops["mono"]), "flex": flex}
    if score_mod is None:
        fns["sdpa"] = sdpa
    reference = "sdpa" if score_mod is None else "flex"
    errors = {}
    for name, fn in fns.items():
        turn[0] = ROTATE - 1
        got = fn().float()
        turn[0] = ROTATE - 1
        want = fns[reference]().float()
        errors[name] = float((got - want).abs().max())
        if not errors[name] < 3e-2:
            raise SystemExit(f"{name} is wrong: max |diff| vs {reference} {errors[name]:.3g}")
    events = interleaved(fns, rounds, 1)
    flushed = flushed_medians(fns)
    return {"events_ms": events, "do_bench_ms": flushed, "reference": reference,
            f"max_abs_diff_vs_{reference}": errors, "pairs": pairs * b}


def run(build: Path, rounds: int, out: Path | None,
        recipes: tuple[str, ...] = RECIPES) -> None:
    import torch

    import pipelink
    # Each case compiles FlexAttention for its own mask: past dynamo's default of 8
    # recompiles Flex would fall back to its unfused eager path and be timed as that.
    torch._dynamo.config.cache_size_limit = 64
    peak, _ = ceilings()
    rows = []
    for recipe in recipes:
        ops = {"linked": pipelink.load(build / "sm_90a" / recipe),
               "mono": pipelink.load(build / "mono" / recipe)}
        for op in ops.values():
            # The index checks (launch.contents) synchronise per call: timed without
            # them, as a caller that vouches for its offsets and page tables runs.
            op.check_contents = False
        for b, h, s, d in shapes_of(recipe):
            r = bench_case(ops, b, h, s, d, recipe, rounds)
            flops = 4 * h * d * r["pairs"]
            r.update(recipe=recipe, B=b, H=h, S=s, D=d, flops=flops,
                     floor_ms=flops / peak / 1e9)
            rows.append(r)
            e = r["events_ms"]
            print(f"{recipe} B{b} H{h} S{s} D{d} | linked {e['linked']:.3f} mono "
                  f"{e['mono']:.3f} sdpa {cell(e.get('sdpa'), '.3f')} flex "
                  f"{e['flex']:.3f} | {flops / e['linked'] / 1e9:.0f} TFLOP/s", flush=True)
            if out:     # after each case: a run cut short keeps what it measured
                data = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                        "peak_tflops": peak, "rows": rows}
                write_rows(out, data, RECIPES)


def cell(value: float | None, spec: str) -> str:
    """A number for a table, or '-' where the baseline has no such case (SDPA has no
    score modifiers)."""
    return "-" if value is None else format(value, spec)


def summary_lines(rows: list[dict], recipes: tuple[str, ...]) -> list[str]:
    """Per recipe: geomean ratios against SDPA (where it has the case) and Flex (both
    timers), linked/mono."""
    lines = []
    for recipe in recipes:
        mine = [r for r in rows if r["recipe"] == recipe]
        if not mine:
            continue
        parts = [versus(mine, "SDPA", "sdpa")] if all("sdpa" in r["events_ms"]
                                                       for r in mine) else []
        parts += [versus(mine, "FlexAttention", "flex"),
                  f"linked/mono {ratio(mine, 'linked', 'mono'):.3f}"]
        lines.append(f"- {recipe}: " + "; ".join(parts))
    return lines


def ratio(rows: list[dict], num: str, den: str, timer: str = "events_ms") -> float:
    """Geomean of num's time over den's across the rows."""
    return geomean([r[timer][num] / r[timer][den] for r in rows])


def versus(rows: list[dict], name: str, baseline: str) -> str:
    """The speed-up over a baseline by events, and by do_bench where every row has it."""
    text = f"vs {name} {ratio(rows, baseline, 'linked'):.2f}x (events)"
    if all(r["do_bench_ms"] for r in rows):
        text += f", {ratio(rows, baseline, 'linked', 'do_bench_ms'):.2f}x (do_bench)"
    return text


def table_lines(rows: list[dict]) -> list[str]:
    """One table row per case: both timers, TFLOP/s of unmasked work, the floor."""
    lines = ["| recipe | B | H | S | D | linked | mono | SDPA | Flex | x SDPA | x Flex "
             "| TFLOP/s linked | TFLOP/s SDPA | do_bench linked | do_bench SDPA | "
             "do_bench Flex | floor |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- "
             "| --- | --- | --- | --- |"]
    for r in rows:
        e, d = r["events_ms"], r["do_bench_ms"] or {}
        sdpa = e.get("sdpa")
        lines.append(f"| {r['recipe']} | {r['B']} | {r['H']} | {r['S']} | {r['D']} | "
                     f"{e['linked']:.3f} | {e['mono']:.3f} | {cell(sdpa, '.3f')} | "
                     f"{e['flex']:.3f} | "
                     f"{cell(sdpa and sdpa / e['linked'], '.2f')} | "
                     f"{e['flex'] / e['linked']:.2f} | {r['flops'] / e['linked'] / 1e9:.0f} | "
                     f"{cell(sdpa and r['flops'] / sdpa / 1e9, '.0f')} | "
                     f"{d.get('linked', 0):.3f} | {cell(d.get('sdpa'), '.3f')} | "
                     f"{d.get('flex', 0):.3f} | {r['floor_ms']:.3f} |")
    return lines


PLOT_BARS = (("linked", "#4878d0"), ("sdpa", "#ee854a"), ("flex", "#6acc64"))


def tflops_svg(rows: list[dict], peak: float, what: str) -> str:
    """TFLOP/s of unmasked work per case (do_bench, L2 flushed; events where do_bench
    is missing): linked, SDPA and FlexAttention side by side, the measured matmul peak
    as a line."""
    groups = []
    for r in rows:
        times = r["do_bench_ms"] or r["events_ms"]
        case = f'{r["recipe"]} B{r["B"]} H{r["H"]} S{r["S"]} D{r["D"]}'
        bars: list[Bar | None] = []
        for variant, color in PLOT_BARS:
            tflops = r["flops"] / times[variant] / 1e9 if variant in times else None
            bars.append(None if tflops is None else
                        Bar(tflops, color, f"{case} {variant}: {tflops:.0f} TFLOP/s"))
        label = r["recipe"].removeprefix("attn_")
        groups.append(BarGroup(bars, (label[:8], f'S{r["S"] // 1024}k D{r["D"]}')))
    layout = BarLayout(width=60 + 46 * len(rows), height=300, group=46, step=13, bar=12)
    return bar_chart(groups, layout, top=peak * 1.05, reference=peak,
                     title=f"{what}, TFLOP/s of unmasked work (do_bench): linked (blue), "
                           "SDPA (orange), FlexAttention (green); line: bf16 matmul peak")


def report(path: Path) -> None:
    """Writes the '## Attention forward' section of RESULTS.md and its plot."""
    data = json.loads(path.read_text())
    rows = data["rows"]
    lines = [f"## Attention forward ({data['gpu']})", "",
             f"Generated by `python bench/attention.py --report bench/{path.name}`; torch "
             f"{data['torch']}. recipes/attn_causal, attn_dense, attn_sliding (window "
             "1024), attn_block_sparse (a strided causal BlockMask), attn_document "
             "(packed documents of 256-3072 tokens, causal within each), "
             "attn_document_ids (the same documents named by an id per token), "
             "attn_softcap and attn_alibi (causal with tanh soft-capping at 30 or "
             "ALiBi's bias: against Flex's score_mod alone, SDPA has neither): one "
             "attn_fwd_core object, the mask, score modifier, scheduler and block layout "
             "linked in "
             "(attn_causal_d64 and attn_dense_d64: the same components at head dim 64, "
             "one object of their own); "
             "against SDPA (a boolean mask where not dense or causal) and "
             "torch.compile'd FlexAttention (the same mask_mod) on the same tensors. "
             "Medians in ms (CUDA events, interleaved; do_bench with L2 flushed; index "
             "checks off, op.check_contents = False); "
             "TFLOP/s of unmasked work; floor: "
             f"that work at the measured bf16 matmul peak ({data['peak_tflops']:.0f} "
             "TFLOP/s).", ""]
    lines += summary_lines(rows, RECIPES)
    lines += ["", "Events time one call at a time, so they include each call's host overhead "
              "where the GPU waits for it (for torch.compile'd Flex the gap between the two, "
              "0.1-0.35 ms, is mostly that: its short masked kernels wait); do_bench "
              "queues calls back to back and flushes L2, which hides it. Both are what a "
              "user can see: an eager model one, a captured or compiled one the other.", ""]
    lines += table_lines(rows) + ["", "![TFLOP/s per case](attention.svg)"]
    put_section("## Attention forward", "\n".join(lines))
    write_text(ROOT / "bench" / "attention.svg",
               tflops_svg(rows, data["peak_tflops"], "attention forward"))


if __name__ == "__main__":
    bench_main(run, report, rounds=7, recipes=RECIPES)
