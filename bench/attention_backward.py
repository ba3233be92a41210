"""Attention backward on the GPU: the backward kernels of attn_causal, attn_dense,
attn_sliding, attn_document, attn_document_ids and attn_block_sparse (linked and monolithic; one
attn_bwd_core object) against SDPA's backward (FlashAttention for causal and dense; for
the window, the documents and the block-sparse mask,
the efficient kernel over a boolean mask, the fastest SDPA has for them) and
torch.compile'd FlexAttention's backward with the same mask_mod, side by side in one
run. attn_document packs the same B S tokens as one sequence of documents of 256 to 3072
tokens, as bench/attention.py does (attn_document_ids: the same documents by an id per
token).

    python -m tests.gpu.build attn_causal attn_causal_deterministic attn_dense \
        attn_sliding attn_document attn_document_ids attn_block_sparse attn_causal_d64 \
        attn_dense_d64 attn_sliding_d64 attn_block_sparse_d64                       # build
    python bench/attention_backward.py --json bench/attention_backward.json   # GPU
    python bench/attention_backward.py --report bench/attention_backward.json

Q, dO [B, S, H, D] and K, V [B, S, H, D] bf16; each variant is timed from the forward's
saved state to dQ, dK and dV (ours: the backward kernel alone, its delta prep and dQ
conversion phases included; the baselines: torch.autograd.grad through their forward,
whose graph holds what they saved). TFLOP/s count the unmasked work, 10 D flops per
(query, key) pair a query sees (the five GEMMs of the backward). Medians in ms: CUDA
events, interleaved over two input sets; and triton.testing.do_bench (L2 flushed). Every
variant's gradients are checked against SDPA's first. Where the build has a
phase-clocked copy of a recipe (build/gpu/phases/, tests/gpu/build.py's PHASE_CLOCKED),
each case also records its backward's time phase by phase.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from results_md import bench_main, put_section, write_rows, write_text  # noqa: E402

from bench.attention import (  # noqa: E402
    DOCUMENTS,
    SCORED,
    cell,
    dense_mask,
    document_lengths,
    mask_mod_of,
    mask_recipe,
    score_mod_of,
    shapes_of,
    summary_lines,
    table_lines,
    tflops_svg,
)
from bench.gemm_swiglu import ceilings, interleaved, phase_medians  # noqa: E402
from bench.gemm_swiglu import flushed as flushed_medians  # noqa: E402

ROTATE = 2
RECIPES = ("attn_causal", "attn_causal_deterministic", "attn_dense", "attn_sliding",
           "attn_document", "attn_document_ids", "attn_block_sparse", "attn_softcap",
           "attn_alibi", "attn_causal_d64", "attn_dense_d64", "attn_sliding_d64",
           "attn_block_sparse_d64")
FLOPS_PER_PAIR_AND_DIM = 10       # S, dP, dV, dK, dQ: five GEMMs of 2 D flops per pair
TOLERANCE = 5e-2                  # max |diff| vs the reference, relative to its max
PHASE_LAUNCHES = 9                # phase-clocked launches a case (after one warm-up)


def dq_turns(recipe: str, rows: int, b: int, extra: tuple) -> int:
    """The recipe's dq_turns per head: one per 64-row query tile, and one more per
    sequence (per document by offsets; by ids, at most one document a token)."""
    if recipe == "attn_document":
        return rows // 64 + len(extra[0])
    if recipe == "attn_document_ids":
        return rows // 64 + rows + 1
    return rows // 64 + b + 1


def bench_case(kernels: dict, b: int, h: int, s: int, d: int, recipe: str,
               rounds: int, phased: object = None) -> dict:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    import pipelink
    recipe = mask_recipe(recipe)
    documents = recipe in DOCUMENTS
    doc, extra = None, ()
    if documents:                  # the same tokens as one packed sequence of B S rows
        b, s = 1, b * s
        lengths = document_lengths(s, seed=s)
        doc = torch.repeat_interleave(torch.arange(len(lengths), device="cuda"),
                                      torch.tensor(lengths, device="cuda"))
        extra = ((torch.tensor([0, *lengths], device="cuda").cumsum(0).to(torch.int32),)
                 if recipe == "attn_document" else (doc.to(torch.int32),))
    mask_mod = mask_mod_of(recipe, doc)
    block_mask = create_block_mask(mask_mod, None, None, s, s) if mask_mod else None
    # The forward's extra inputs, and the backward's (a BlockMask's transposed half).
    saved = extra
    if recipe == "attn_block_sparse":
        extra = pipelink.block_mask_tensors(block_mask)
        saved = extra[4:]
    boolean = (dense_mask(mask_mod, s)
               if recipe in ("attn_sliding", "attn_block_sparse", *DOCUMENTS) else None)
    causal = recipe in ("attn_causal", "attn_causal_deterministic", *SCORED)
    score_mod = score_mod_of(recipe, h)    # SDPA has none: Flex is then the reference
    pairs = s * (s + 1) // 2 if causal else (s * s if boolean is None else int(boolean.sum()))
    flex_compiled = torch.compile(flex_attention)

    def leaves(t):  # noqa: ANN001, ANN202
        return t.detach().transpose(1, 2).requires_grad_(True)

    sets = []
    for _ in range(ROTATE):
        q, k, v, d_o = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
                        for _ in range(4))
        ours = tuple(t[0] if documents else t for t in (d_o, q, k, v))
        o, lse = kernels["linked"].forward(*ours[1:], *extra)
        sdpa_in = [leaves(t) for t in (q, k, v)]
        sdpa_o = (F.scaled_dot_product_attention(*sdpa_in, attn_mask=boolean, is_causal=causal)
                  if score_mod is None else None)
        flex_in = [leaves(t) for t in (q, k, v)]
        flex_o = flex_compiled(*flex_in, score_mod=score_mod, block_mask=block_mask)
        turns = dq_turns(recipe, b * s, b, extra)
        grads = tuple(torch.empty_like(t) for t in ours[1:]) + (
            torch.empty(h, 2, b * s, device="cuda"), torch.empty_like(ours[1], dtype=torch.float32),
            torch.empty(h, turns, device="cuda", dtype=torch.int32))
        sets.append({"ours": (*ours, o, lse, *saved), "grads": grads, "d_o": d_o,
                     "sdpa": (sdpa_o, sdpa_in), "flex": (flex_o, flex_in)})
    turn = [0]

    def pick() -> dict:
        turn[0] = (turn[0] + 1) % ROTATE
        return sets[turn[0]]

    def ours(op):  # noqa: ANN001, ANN202
        def call() -> tuple:
            x = pick()
            return op(*x["ours"], out=x["grads"])[:3]
        return call

    def autograd(name: str):  # noqa: ANN202
        def call() -> tuple:
            x = pick()
            out, inputs = x[name]
            grads = torch.autograd.grad(out, inputs, x["d_o"].transpose(1, 2),
                                        retain_graph=True)
            return tuple(g.transpose(1, 2) for g in grads)
        return call

    fns = {"linked": ours(kernels["linked"].backward), "mono": ours(kernels["mono"].backward),
           "flex": autograd("flex")}
    if score_mod is None:
        fns["sdpa"] = autograd("sdpa")
    reference = "sdpa" if score_mod is None else "flex"
    errors = {}
    for name, fn in fns.items():
        turn[0] = ROTATE - 1
        got = fn()
        turn[0] = ROTATE - 1
        want = fns[reference]()
        errors[name] = max(float((g.float() - w.float()).abs().max() / w.float().abs().max())
                           for g, w in zip(got, want, strict=True))
        if not errors[name] < TOLERANCE:
            raise SystemExit(f"{recipe} {name} is wrong: max relative |diff| vs {reference} "
                             f"{errors[name]:.3g}")
    events = interleaved(fns, rounds, 1)
    flushed = flushed_medians(fns)
    out = {"events_ms": events, "do_bench_ms": flushed, "reference": reference,
           f"max_rel_diff_vs_{reference}": errors, "pairs": pairs * b}
    if phased is not None:        # the phase-clocked build, on the first input set
        x = sets[0]
        out["phase_ms"] = phase_medians(lambda: phased.backward(*x["ours"], out=x["grads"]),
                                        phased["backward"], PHASE_LAUNCHES)
    return out


def run(build: Path, rounds: int, out: Path | None,
        recipes: tuple[str, ...] = RECIPES) -> None:
    import torch

    import pipelink
    torch._dynamo.config.cache_size_limit = 64    # one Flex compile per mask and shape
    # Flex's compiled backward donates its buffers unless told not to, and the timing
    # loop runs it many times over one graph (retain_graph).
    torch._functorch.config.donated_buffer = False
    peak, _ = ceilings()
    rows, gpu = [], torch.cuda.get_device_name()
    for recipe in recipes:
        kernels = {"linked": pipelink.load(build / "sm_90a" / recipe),
                   "mono": pipelink.load(build / "mono" / recipe)}
        for ks in kernels.values():
            # As bench/attention.py: timed without the per-call index checks (attn_document's
            # cu_seqlens), as a caller that vouches for its offsets runs.
            ks.check_contents = False
        clocked = build / "phases" / recipe
        phased = pipelink.load(clocked) if clocked.exists() else None
        if phased is not None:
            phased.check_contents = False
        for b, h, s, d in shapes_of(recipe):
            r = bench_case(kernels, b, h, s, d, recipe, rounds, phased)
            flops = FLOPS_PER_PAIR_AND_DIM * h * d * r["pairs"]
            r.update(recipe=recipe, B=b, H=h, S=s, D=d, flops=flops,
                     floor_ms=flops / peak / 1e9)
            rows.append(r)
            e = r["events_ms"]
            print(f"{recipe} B{b} H{h} S{s} D{d} | linked {e['linked']:.3f} mono "
                  f"{e['mono']:.3f} sdpa {cell(e.get('sdpa'), '.3f')} flex "
                  f"{e['flex']:.3f} | {flops / e['linked'] / 1e9:.0f} TFLOP/s", flush=True)
            if out:     # after each case: a run cut short keeps what it measured
                data = {"gpu": gpu, "torch": torch.__version__, "peak_tflops": peak,
                        "rows": rows}
                write_rows(out, data, RECIPES)


def report(path: Path) -> None:
    """Writes the '## Attention backward' section of RESULTS.md and its plot."""
    data = json.loads(path.read_text())
    rows = data["rows"]
    lines = [f"## Attention backward ({data['gpu']})", "",
             f"Generated by `python bench/attention_backward.py --report bench/{path.name}`; "
             f"torch {data['torch']}. The backward kernels of recipes/attn_causal, attn_dense, "
             "attn_sliding (window 1024), attn_document (packed documents of 256-3072 "
             "tokens, causal within each; attn_document_ids: the same documents by an id per "
             "token), attn_block_sparse (a strided BlockMask, bench/attention.py's), "
             "attn_softcap and attn_alibi (causal with a score modifier: against Flex's "
             "score_mod alone, SDPA has none): one attn_bwd_core object, the mask, score "
             "modifier and scheduler linked in (attn_causal_d64 and attn_dense_d64: head "
             "dim 64, one object of their own, dQ split between the warpgroups by keys); "
             "against SDPA's "
             "backward (a boolean mask for the window, the documents and the blocks) and "
             "torch.compile'd "
             "FlexAttention's backward (the same mask_mod), from the forward's saved state "
             "to dQ, dK and dV (index checks off). Medians in ms (CUDA events, "
             "interleaved; do_bench with L2 flushed); TFLOP/s of unmasked work (10 D "
             "flops per visible pair); floor: that "
             f"work at the measured bf16 matmul peak ({data['peak_tflops']:.0f} TFLOP/s).", ""]
    lines += summary_lines(rows, RECIPES) + [""] + table_lines(rows)
    lines += ["", "![TFLOP/s per case](attention_backward.svg)"] + phase_lines(rows)
    put_section("## Attention backward", "\n".join(lines))
    write_text(ROOT / "bench" / "attention_backward.svg",
               tflops_svg(rows, data["peak_tflops"], "attention backward"))


def phase_lines(rows: list[dict]) -> list[str]:
    """Where a backward's time goes, phase by phase, where a phase-clocked build ran."""
    rows = [r for r in rows if r.get("phase_ms")]
    if not rows:
        return []
    lines = ["", "Where the time goes, phase by phase (`python -m tests.gpu.build` links a "
             "third, phase-clocked build of these recipes; `op.phase_times()` reads when the "
             f"last CTA finished each phase; medians of {PHASE_LAUNCHES} launches on one "
             "input set): `prep` (delta and the base-2 LSE, dQ's fp32 sums zeroed) and `dq` "
             "(dQ to bf16) are memory-bound passes, `main` the GEMMs. The clocks run from "
             "the first CTA's start to the last CTA's end, so their total is below the "
             "event-timed column above.", "",
             "| recipe | B | H | S | D | total ms | prep | main | dq | prep + dq share |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        t = r["phase_ms"]
        lines.append(f"| {r['recipe']} | {r['B']} | {r['H']} | {r['S']} | {r['D']} | "
                     f"{t['total']:.3f} | {t['prep']:.3f} | {t['main']:.3f} | {t['dq']:.3f} | "
                     f"{(t['prep'] + t['dq']) / t['total']:.0%} |")
    return lines


if __name__ == "__main__":
    bench_main(run, report, rounds=7, recipes=RECIPES)
