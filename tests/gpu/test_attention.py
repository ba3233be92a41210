"""The attention recipes (attn_causal, attn_dense, attn_sliding, attn_document,
attn_block_sparse, attn_softcap, attn_alibi: one core object, the masks, score
modifiers, block layouts and schedulers linked into it) against an fp32 PyTorch
reference, per element, on fresh random inputs. O and LSE are poisoned with NaN first,
so a tile left unwritten, a row written for the wrong sequence or head, or one wrong
key tile fails. The backward kernels of attn_causal, attn_dense, attn_sliding,
attn_document, attn_block_sparse, attn_softcap and attn_alibi (one attn_bwd_core object,
the score modifiers' derivatives linked in) against autograd through the fp32 reference
(and FlexAttention's backward for BlockMasks), every output poisoned, directly and
through the recipes' autograd ops."""

from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.gpu

O_ATOL, O_RTOL = 1.5e-2, 2e-2   # P rounded to bf16 before P V, O rounded to bf16
LSE_ATOL = 2e-3                  # fp32 softmax statistics (MUFU exp2 and log)
SOFTCAP = 30.0
ATTENTION = ("attn_causal", "attn_dense", "attn_softcap", "attn_alibi", "attn_sliding",
             "attn_document", "attn_block_sparse", "attn_paged", "attn_causal_deterministic",
             "attn_document_ids")
# Recipes built at head dim 64 (their own core objects); every other one is at 128.
HEAD_DIM_64 = ("attn_causal_d64", "attn_dense_d64", "attn_causal_d64_deterministic",
               "attn_sliding_d64", "attn_block_sparse_d64", "attn_paged_d64",
               "attn_document_d64")
# Of those, the ones whose forward takes 192-row query tiles (q_tile: three consumer
# warpgroups); the others take 128, as at head dim 128.
QUERY_TILE_192 = ("attn_causal_d64", "attn_dense_d64", "attn_causal_d64_deterministic",
                  "attn_paged_d64")


def head_dim(recipe: str) -> int:
    return 64 if recipe in HEAD_DIM_64 else 128


def mask_of(recipe: str) -> str:
    """The reference mask a recipe shares with its head-dim-128 original."""
    return recipe.removesuffix("_deterministic").removesuffix("_d64")


WINDOW = 1024   # attn_sliding: window_mask left 1024, right 0


def alibi(s, heads):  # noqa: ANN001, ANN201
    import torch
    h, q, kv = (torch.arange(n, device=s.device) for n in (heads, s.shape[-2], s.shape[-1]))
    slope = torch.exp2(-8.0 * (h + 1) / heads)
    return s + slope[:, None, None] * (kv[None, None, :] - q[None, :, None]).float()


def scores_of(recipe: str, s):  # noqa: ANN001, ANN201
    """The recipe's score modifier and mask on fp32 scores [..., H, Sq, Skv]."""
    import torch
    if recipe == "attn_softcap":
        s = SOFTCAP * torch.tanh(s / SOFTCAP)
    if recipe == "attn_alibi":
        s = alibi(s, s.shape[-3])
    q = torch.arange(s.shape[-2], device=s.device)[:, None]
    kv = torch.arange(s.shape[-1], device=s.device)[None, :]
    keep = {"attn_dense": torch.ones_like(q * kv, dtype=torch.bool),
            "attn_sliding": (kv <= q) & (kv >= q - WINDOW)}.get(mask_of(recipe), kv <= q)
    return s.masked_fill(~keep, float("-inf"))


def reference(q, k, v, recipe: str, keep=None):  # noqa: ANN001, ANN201
    """O [B, S, H, D] and LSE [B, H, S] in fp32; K/V heads repeated for GQA. `keep`
    (broadcast to [B, H, S, S]), where given, is the mask instead of the recipe's; a row
    it leaves without keys gets O = 0 and LSE = -inf."""
    import torch
    groups = q.shape[2] // k.shape[2]
    qf, kf, vf = (t.float().transpose(1, 2) for t in (q, k, v))
    kf, vf = kf.repeat_interleave(groups, dim=1), vf.repeat_interleave(groups, dim=1)
    s = qf @ kf.transpose(-1, -2) / math.sqrt(q.shape[-1])
    s = scores_of(recipe, s) if keep is None else s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    o = torch.nan_to_num(torch.softmax(s, dim=-1), nan=0.0) @ vf
    return o.transpose(1, 2), lse


def inputs(b: int, s: int, h: int, hkv: int, d: int, seed: int):  # noqa: ANN201
    import torch
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, s, h, d, device="cuda", generator=gen).to(torch.bfloat16)
    k = torch.randn(b, s, hkv, d, device="cuda", generator=gen).to(torch.bfloat16)
    v = torch.randn(b, s, hkv, d, device="cuda", generator=gen).to(torch.bfloat16)
    return q, k, v


CASES = [  # recipe, B, S, H, HKV
    ("attn_causal", 2, 1000, 4, 4),     # S not a multiple of the 128-row tile
    ("attn_causal", 3, 256, 8, 2),      # GQA, whole tiles
    ("attn_causal", 1, 333, 3, 1),      # MQA
    ("attn_causal", 1, 70, 2, 2),       # one partial tile
    ("attn_dense", 2, 777, 4, 2),
    ("attn_dense", 1, 129, 2, 1),       # a key tile with one valid key
    ("attn_softcap", 2, 600, 2, 2),
    ("attn_alibi", 1, 300, 16, 4),
    ("attn_sliding", 1, 2500, 2, 1),    # windows that start mid-tile, full tiles between
    ("attn_sliding", 2, 1100, 2, 2),
    ("attn_causal_d64", 2, 1000, 4, 2),     # 192-row query tiles: 5 and a partial one
    ("attn_causal_d64", 1, 2048, 2, 2),     # 10 whole 192-row tiles and one of 128
    ("attn_causal_d64", 2, 384, 4, 4),      # whole 192-row tiles only
    ("attn_causal_d64", 1, 193, 2, 1),      # a last tile of one row, MQA
    ("attn_causal_d64", 1, 77, 2, 1),       # one partial tile
    ("attn_dense_d64", 1, 333, 2, 2),
    ("attn_dense_d64", 2, 1000, 6, 2),      # GQA, a partial last tile
    ("attn_dense_d64", 1, 2048, 2, 1),
    ("attn_sliding_d64", 1, 2500, 2, 1),
]


@pytest.mark.parametrize("mode", ["sm_90a", "mono"])
@pytest.mark.parametrize("recipe,b,s,h,hkv", CASES)
def test_attention_matches_pytorch(build_dir, mode, recipe, b, s, h, hkv):
    import torch

    import pipelink
    op = pipelink.load(build_dir / mode / recipe)
    d = head_dim(recipe)
    q, k, v = inputs(b, s, h, hkv, d, seed=b * 1000 + s + h)
    o = torch.full((b, s, h, d), float("nan"), device="cuda", dtype=torch.bfloat16)
    lse = torch.full((b, h, s), float("nan"), device="cuda", dtype=torch.float32)
    op(q, k, v, out=(o, lse))
    want_o, want_lse = reference(q, k, v, recipe)
    torch.testing.assert_close(lse, want_lse, atol=LSE_ATOL, rtol=0)
    torch.testing.assert_close(o.float(), want_o, atol=O_ATOL, rtol=O_RTOL)


@pytest.mark.parametrize("mode", ["sm_90a", "mono"])
@pytest.mark.parametrize("recipe", ["attn_causal", "attn_dense", "attn_causal_d64"])
def test_row_maxima_that_climb_tile_after_tile(build_dir, mode, recipe):
    """Keys whose size grows along the sequence raise each row's max tile after tile, by
    a factor of e^1 to e^10 (random inputs barely move it after the first tile): O's
    rescale and the LSE must follow every move."""
    import torch

    import pipelink
    op = pipelink.load(build_dir / mode / recipe)
    b, s, h, hkv, d = 2, 1000, 4, 2, head_dim(recipe)
    q, k, v = inputs(b, s, h, hkv, d, seed=7)
    growth = 1.0 + 3.0 * torch.arange(s, device="cuda") / s
    q = (q.float() * 4.0).to(torch.bfloat16)
    k = (k.float() * growth[None, :, None, None]).to(torch.bfloat16)
    o = torch.full((b, s, h, d), float("nan"), device="cuda", dtype=torch.bfloat16)
    lse = torch.full((b, h, s), float("nan"), device="cuda", dtype=torch.float32)
    op(q, k, v, out=(o, lse))
    want_o, want_lse = reference(q, k, v, recipe)
    torch.testing.assert_close(lse, want_lse, atol=LSE_ATOL * 4, rtol=1e-4)
    torch.testing.assert_close(o.float(), want_o, atol=O_ATOL, rtol=O_RTOL)


BACKWARD = ("attn_causal", "attn_dense", "attn_sliding", "attn_document",
            "attn_causal_deterministic", "attn_block_sparse", "attn_softcap", "attn_alibi")
BACKWARD_64 = ("attn_causal_d64", "attn_dense_d64", "attn_causal_d64_deterministic",
               "attn_sliding_d64", "attn_document_d64", "attn_block_sparse_d64")
GRAD_CASES = [  # recipe, B, S, H, HKV
    ("attn_causal", 2, 256, 4, 4),      # whole tiles
    ("attn_causal", 1, 1000, 4, 2),     # S not a multiple of either tile, GQA
    ("attn_causal", 1, 77, 2, 1),       # MQA, one partial tile
    ("attn_dense", 2, 333, 2, 2),
    ("attn_sliding", 1, 2200, 2, 1),    # key tiles the window leaves out entirely
    ("attn_causal_d64", 2, 256, 4, 4),  # head dim 64: dQ split by keys
    ("attn_causal_d64", 1, 1000, 4, 2),
    ("attn_dense_d64", 2, 333, 2, 1),
    ("attn_sliding_d64", 1, 2200, 2, 1),
    ("attn_softcap", 2, 600, 2, 2),     # scores scaled into the cap's bend (SCORE_SCALE)
    ("attn_softcap", 1, 333, 4, 1),
    ("attn_alibi", 1, 300, 16, 4),
    ("attn_alibi", 2, 200, 16, 16),
]
# Q scaled so that scores reach the soft cap's bend (|s| ~ 30): with unit inputs they stay
# where tanh is linear and a wrong derivative of the cap would pass unseen.
SCORE_SCALE = {"attn_softcap": 12.0}
GRAD_RTOL = 5e-2     # P and dS rounded to bf16 for their GEMMs, gradients to bf16


def _close_grad(name: str, got, want) -> None:  # noqa: ANN001
    """Per element, relative to the gradient's scale: one wrong tile fails. The floor:
    a one-token document's dQ is exactly 0 in fp32 (P = 1, dS = dP - delta = 0), and
    the kernel's rounding leaves a few 1e-7 there."""
    import torch
    scale = float(want.abs().max())
    torch.testing.assert_close(got.float(), want, rtol=GRAD_RTOL, atol=2e-2 * scale + 1e-5,
                               msg=lambda m: f"{name}: {m}")


def grad_reference(q, k, v, d_o, recipe: str, keep=None):  # noqa: ANN001, ANN201
    """dQ, dK, dV in fp32 by autograd through the fp32 reference."""
    leaves = [t.float().requires_grad_(True) for t in (q, k, v)]
    o, _ = reference(*leaves, recipe, keep)
    o.backward(d_o.float())
    return [t.grad for t in leaves]


@pytest.mark.parametrize("mode", ["sm_90a", "mono"])
@pytest.mark.parametrize("recipe,b,s,h,hkv", GRAD_CASES)
def test_backward_matches_pytorch(build_dir, mode, recipe, b, s, h, hkv):
    """The backward kernel launched directly with every output poisoned, then the
    recipe's autograd op (loss.backward()), against autograd through fp32."""
    import torch

    import pipelink
    ks = pipelink.load(build_dir / mode / recipe)
    q, k, v = inputs(b, s, h, hkv, head_dim(recipe), seed=7 * b + s + h)
    q = (q.float() * SCORE_SCALE.get(recipe, 1.0)).to(q.dtype)
    d_o = torch.randn(q.shape, device="cuda",
                      generator=torch.Generator(device="cuda").manual_seed(s)).to(q.dtype)
    want = grad_reference(q, k, v, d_o, recipe)
    o, lse = ks.forward(q, k, v)
    nan = float("nan")
    out = (torch.full_like(q, nan), torch.full_like(k, nan), torch.full_like(v, nan),
           torch.full((h, 2, b * s), nan, device="cuda"),
           torch.full(q.shape, nan, device="cuda"),
           torch.full((h, b * s // 64 + b + 1), -7, device="cuda", dtype=torch.int32))
    ks.backward(d_o, q, k, v, o, lse, out=out)
    for name, got, ref in zip(("dq", "dk", "dv"), out, want, strict=False):
        _close_grad(name, got, ref)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    o2, _ = ks(*leaves)
    o2.backward(d_o)
    for name, leaf, ref in zip(("q.grad", "k.grad", "v.grad"), leaves, want, strict=True):
        _close_grad(name, leaf.grad, ref)


@pytest.mark.parametrize("mode", ["sm_90a", "mono"])
@pytest.mark.parametrize("recipe", ["attn_causal_deterministic", "attn_causal_d64_deterministic"])
def test_the_deterministic_backward_repeats_its_bits(build_dir, mode, recipe):
    """The deterministic recipes add dQ's partial sums in key-tile order (at head dim
    64 also warpgroup by warpgroup): two runs give the same bits (many key tiles per
    query tile, GQA), and the gradients are right."""
    import torch

    import pipelink
    ks = pipelink.load(build_dir / mode / recipe)
    b, s, h, hkv = 2, 1500, 4, 2
    q, k, v = inputs(b, s, h, hkv, head_dim(recipe), seed=21)
    d_o = torch.randn(q.shape, device="cuda",
                      generator=torch.Generator(device="cuda").manual_seed(22)).to(q.dtype)
    o, lse = ks.forward(q, k, v)
    first = [t.clone() for t in ks.backward(d_o, q, k, v, o, lse)[:3]]
    again = ks.backward(d_o, q, k, v, o, lse)[:3]
    for name, x, y in zip(("dq", "dk", "dv"), first, again, strict=True):
        assert torch.equal(x, y), f"{name} differs between two runs"
    for name, got, ref in zip(("dq", "dk", "dv"), first,
                              grad_reference(q, k, v, d_o, recipe), strict=True):
        _close_grad(name, got, ref)


DOCUMENTS = [  # document lengths, H, HKV
    ([300, 0, 1, 129, 700, 0], 4, 2),   # empty documents, one of one token
    ([128, 256, 17], 2, 2),
    ([0, 0], 2, 1),                     # no tokens at all: nothing is written
]


@pytest.mark.parametrize("mode", ["sm_90a", "mono"])
@pytest.mark.parametrize("recipe", ["attn_document", "attn_document_d64"])
@pytest.mark.parametrize("lengths,h,hkv", DOCUMENTS)
def test_documents_attend_within_themselves(build_dir, mode, recipe, lengths, h, hkv):
    """attn_document (and at head dim 64): packed documents, each causal within itself;
    rows past the last document (there are none here) and documents of no rows write
    nothing."""
    import torch

    import pipelink
    op = pipelink.load(build_dir / mode / recipe)
    total, d = sum(lengths), head_dim(recipe)
    q, k, v = (t[0] for t in inputs(1, max(total, 1), h, hkv, d, seed=total + h))
    q, k, v = q[:total], k[:total], v[:total]
    cu = torch.tensor([0, *lengths], device="cuda", dtype=torch.int32).cumsum(0).to(torch.int32)
    o = torch.full((total, h, d), float("nan"), device="cuda", dtype=torch.bfloat16)
    lse = torch.full((h, total), float("nan"), device="cuda", dtype=torch.float32)
    op(q, k, v, cu, out=(o, lse))
    begin = 0
    for n in lengths:
        if n:
            rows = slice(begin, begin + n)
            want_o, want_lse = reference(q[None, rows], k[None, rows], v[None, rows],
                                         "attn_causal")
            torch.testing.assert_close(lse[:, rows], want_lse[0], atol=LSE_ATOL, rtol=0)
            torch.testing.assert_close(o[rows].float(), want_o[0], atol=O_ATOL, rtol=O_RTOL)
        begin += n


@pytest.mark.parametrize("mode", ["sm_90a", "mono"])
@pytest.mark.parametrize("recipe", ["attn_document", "attn_document_d64"])
@pytest.mark.parametrize("lengths,h,hkv", DOCUMENTS[:2])
def test_document_gradients_stay_within_documents(build_dir, mode, recipe, lengths, h, hkv):
    """attn_document's backward kernel, every output poisoned, then its autograd op:
    each document's dQ, dK and dV against autograd through that document alone (a key
    tile or query tile reaching into the next document must add nothing)."""
    import torch

    import pipelink
    ks = pipelink.load(build_dir / mode / recipe)
    total = sum(lengths)
    q, k, v = (t[0] for t in inputs(1, total, h, hkv, head_dim(recipe), seed=3 * total + h))
    d_o = torch.randn(q.shape, device="cuda",
                      generator=torch.Generator(device="cuda").manual_seed(total)).to(q.dtype)
    cu = torch.tensor([0, *lengths], device="cuda", dtype=torch.int32).cumsum(0).to(torch.int32)
    o, lse = ks.forward(q, k, v, cu)
    nan = float("nan")
    out = (torch.full_like(q, nan), torch.full_like(k, nan), torch.full_like(v, nan),
           torch.full((h, 2, total), nan, device="cuda"), torch.full(q.shape, nan, device="cuda"),
           torch.full((h, total // 64 + len(lengths) + 1), -7, device="cuda", dtype=torch.int32))
    ks.backward(d_o, q, k, v, o, lse, cu, out=out)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    ks(*leaves, cu)[0].backward(d_o)
    begin = 0
    for n in lengths:
        rows = slice(begin, begin + n)
        if n:
            want = grad_reference(q[None, rows], k[None, rows], v[None, rows],
                                  d_o[None, rows], "attn_causal")
            for name, got, auto, ref in zip(("dq", "dk", "dv"), out, leaves, want, strict=False):
                _close_grad(f"{name} rows {rows}", got[rows], ref[0])
                _close_grad(f"{name} (autograd) rows {rows}", auto.grad[rows], ref[0])
        begin += n


DOCUMENT_IDS = [  # document lengths, the first document's id, the step between ids, H, HKV
    ([300, 1, 129, 700], 0, 1, 4, 2),   # a one-token document, boundaries inside tiles
    ([128, 256, 17], 5, 3, 2, 2),       # ids need not start at 0 nor run without gaps
    ([1] * 37 + [64, 500, 3], 0, 1, 2, 2),   # many tiny documents before long ones
    ([1000], 0, 1, 2, 1),               # one document: causal attention, MQA
]


def document_ids(lengths: list[int], first: int, step: int = 1):  # noqa: ANN201
    """The id of each token's document: `first`, `first` + `step`, ... run by run."""
    import torch
    ids = torch.arange(first, first + step * len(lengths), step, device="cuda")
    return ids.repeat_interleave(torch.tensor(lengths, device="cuda")).to(torch.int32)


def document_keep(ids):  # noqa: ANN001, ANN201
    """FlexAttention's document mask_mod, causal, as a [S, S] mask."""
    import torch
    at = torch.arange(ids.numel(), device=ids.device)
    return (ids[:, None] == ids[None, :]) & (at[:, None] >= at[None, :])


@pytest.mark.parametrize("mode", ["sm_90a", "mono"])
@pytest.mark.parametrize("lengths,first,step,h,hkv", DOCUMENT_IDS)
def test_document_ids_match_pytorch_and_flex(build_dir, mode, lengths, first, step, h, hkv):
    """attn_document_ids: packed rows, a document id per token; each token attends
    causally within its document. Against the fp32 reference of the same mask and
    FlexAttention with the document mask_mod, O and LSE poisoned first."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    import pipelink
    op = pipelink.load(build_dir / mode / "attn_document_ids")
    total = sum(lengths)
    q, k, v = inputs(1, total, h, hkv, 128, seed=total + first)
    ids = document_ids(lengths, first, step)
    o = torch.full((total, h, 128), float("nan"), device="cuda", dtype=torch.bfloat16)
    lse = torch.full((h, total), float("nan"), device="cuda", dtype=torch.float32)
    op(q[0], k[0], v[0], ids, out=(o, lse))
    want_o, want_lse = reference(q, k, v, "attn_causal", document_keep(ids))
    torch.testing.assert_close(lse, want_lse[0], atol=LSE_ATOL, rtol=0)
    torch.testing.assert_close(o.float(), want_o[0], atol=O_ATOL, rtol=O_RTOL)

    def mask_mod(b, hh, qi, kv):  # noqa: ANN001, ANN202
        return (ids[qi] == ids[kv]) & (qi >= kv)

    bm = create_block_mask(mask_mod, None, None, total, total, device="cuda")
    flex = flex_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                          block_mask=bm, enable_gqa=h != hkv).transpose(1, 2)
    torch.testing.assert_close(o.float(), flex[0].float(), atol=O_ATOL, rtol=O_RTOL)


@pytest.mark.parametrize("mode", ["sm_90a", "mono"])
@pytest.mark.parametrize("lengths,first,step,h,hkv", DOCUMENT_IDS[:3])
def test_document_id_gradients_match_pytorch(build_dir, mode, lengths, first, step, h, hkv):
    """attn_document_ids' backward kernel, every output poisoned, then its autograd op:
    dQ, dK and dV against fp32 autograd through the document mask over the whole
    sequence (a tile reaching into the next document must add nothing)."""
    import torch

    import pipelink
    ks = pipelink.load(build_dir / mode / "attn_document_ids")
    total = sum(lengths)
    q, k, v = inputs(1, total, h, hkv, 128, seed=7 * total + first)
    d_o = torch.randn(q.shape, device="cuda",
                      generator=torch.Generator(device="cuda").manual_seed(total)).to(q.dtype)
    ids = document_ids(lengths, first, step)
    want = grad_reference(q, k, v, d_o, "attn_causal", document_keep(ids))
    q, k, v, d_o = q[0], k[0], v[0], d_o[0]
    o, lse = ks.forward(q, k, v, ids)
    nan = float("nan")
    out = (torch.full_like(q, nan), torch.full_like(k, nan), torch.full_like(v, nan),
           torch.full((h, 2, total), nan, device="cuda"), torch.full(q.shape, nan, device="cuda"),
           torch.full((h, total // 64 + total + 1), -7, device="cuda", dtype=torch.int32))
    ks.backward(d_o, q, k, v, o, lse, ids, out=out)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    ks(*leaves, ids)[0].backward(d_o)
    begin = 0
    for n in lengths:             # each document at its own scale
        rows = slice(begin, begin + n)
        for name, got, auto, ref in zip(("dq", "dk", "dv"), out, leaves, want, strict=False):
            _close_grad(f"{name} rows {rows}", got[rows], ref[0][rows])
            _close_grad(f"{name} (autograd) rows {rows}", auto.grad[rows], ref[0][rows])
        begin += n


def test_bad_document_ids_are_refused_before_launch(build_dir):
    """Ids that run backwards (one document in two places) and ids of another length
    than the rows are refused; nothing is written."""
    import torch

    import pipelink
    from pipelink.errors import PipeLinkError
    op = pipelink.load(build_dir / "sm_90a" / "attn_document_ids")
    q, k, v = (t[0] for t in inputs(1, 300, 2, 2, 128, seed=13))
    o = torch.full((300, 2, 128), float("nan"), device="cuda", dtype=torch.bfloat16)
    ids = document_ids([100, 200], 0)
    ids[150] = 0
    with pytest.raises(PipeLinkError, match="must not decrease, but entry 150 is 0 after 1"):
        op(q, k, v, ids, out=(o, torch.empty(2, 300, device="cuda")))
    assert bool(o.isnan().all())
    with pytest.raises(PipeLinkError, match="doc_ids"):
        op(q, k, v, document_ids([100, 100], 0))
    torch.cuda.synchronize()


def sparse_mask_mod(kind: str):  # noqa: ANN201
    """A block-sparse causal mask_mod: causal inside each 128 x 128 block, and a block
    pattern over blocks (per head for 'per_head'; 'holes' leaves query block 1 seeing
    no key at all)."""
    def mask_mod(b, h, q, kv):  # noqa: ANN001, ANN202
        qb, kb = q // 128, kv // 128
        stride = 2 + h if kind == "per_head" else 3
        keep = (q >= kv) & (((qb - kb) % stride == 0) | (qb - kb == 1))
        return keep & (qb != 1) if kind == "holes" else keep
    return mask_mod


SPARSE = [  # B, S, H, HKV, BlockMask kind
    (1, 1000, 4, 2, "broadcast"),
    (2, 640, 2, 2, "per_head"),
    (1, 500, 2, 1, "holes"),
]


@pytest.mark.parametrize("mode", ["sm_90a", "mono"])
@pytest.mark.parametrize("recipe", ["attn_block_sparse", "attn_block_sparse_d64"])
@pytest.mark.parametrize("b,s,h,hkv,kind", SPARSE)
def test_block_sparse_reads_flex_block_masks(build_dir, mode, recipe, b, s, h, hkv, kind):
    """attn_block_sparse takes the BlockMask create_block_mask built, as is, and
    matches the fp32 reference of the same mask_mod and FlexAttention itself. A query
    row that sees no key (kind 'holes') gets O = 0 and LSE = -inf."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    import pipelink
    op = pipelink.load(build_dir / mode / recipe)
    d = head_dim(recipe)
    q, k, v = inputs(b, s, h, hkv, d, seed=s + h)
    mask_mod = sparse_mask_mod(kind)
    broadcast = kind != "per_head"
    bm = create_block_mask(mask_mod, None if broadcast else b, None if broadcast else h, s, s,
                           device="cuda")
    o = torch.full((b, s, h, d), float("nan"), device="cuda", dtype=torch.bfloat16)
    lse = torch.full((b, h, s), float("nan"), device="cuda", dtype=torch.float32)
    op(q, k, v, *pipelink.block_mask_tensors(bm), out=(o, lse))
    at = torch.arange(s, device="cuda")
    keep = mask_mod(torch.arange(b, device="cuda")[:, None, None, None],
                    torch.arange(h, device="cuda")[None, :, None, None],
                    at[None, None, :, None], at[None, None, None, :])
    groups = h // hkv
    want_o, want_lse = reference(q, k, v, recipe, keep)
    torch.testing.assert_close(lse, want_lse, atol=LSE_ATOL, rtol=0)
    torch.testing.assert_close(o.float(), want_o, atol=O_ATOL, rtol=O_RTOL)
    seen = keep.any(dim=-1)                                   # [b or 1, h or 1, s]
    assert bool((lse[~seen.expand(b, h, s)] == float("-inf")).all())
    flex = flex_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                          block_mask=bm, enable_gqa=groups > 1).transpose(1, 2)
    torch.testing.assert_close(o.float(), flex.float(), atol=O_ATOL, rtol=O_RTOL)


SPARSE_GRADS = [  # B, S, H, HKV, BlockMask kind: one column for every head, or one per
    (1, 1000, 4, 2, "broadcast"),         # head with a K/V head each
    (2, 640, 2, 2, "per_head"),
    (1, 500, 2, 1, "holes"),              # query block 1 sees nothing: its rows add nothing
]


@pytest.mark.parametrize("mode", ["sm_90a", "mono"])
@pytest.mark.parametrize("recipe", ["attn_block_sparse", "attn_block_sparse_d64"])
@pytest.mark.parametrize("b,s,h,hkv,kind", SPARSE_GRADS)
def test_block_sparse_gradients_follow_the_block_mask(build_dir, mode, recipe, b, s, h, hkv,
                                                      kind):
    """attn_block_sparse's backward walks each key tile's query blocks from the
    BlockMask's transposed tensors: the kernel launched directly with every output
    poisoned, then the autograd op, against autograd through the fp32 reference of the
    same mask_mod and against FlexAttention's backward."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    import pipelink
    ks = pipelink.load(build_dir / mode / recipe)
    d = head_dim(recipe)
    q, k, v = inputs(b, s, h, hkv, d, seed=5 * s + h)
    d_o = torch.randn(q.shape, device="cuda",
                      generator=torch.Generator(device="cuda").manual_seed(s + 1)).to(q.dtype)
    mask_mod = sparse_mask_mod(kind)
    broadcast = kind != "per_head"
    bm = create_block_mask(mask_mod, None if broadcast else b, None if broadcast else h, s, s,
                           device="cuda")
    at = torch.arange(s, device="cuda")
    keep = mask_mod(torch.arange(b, device="cuda")[:, None, None, None],
                    torch.arange(h, device="cuda")[None, :, None, None],
                    at[None, None, :, None], at[None, None, None, :])
    groups = h // hkv

    def masked_reference(qx, kx, vx):  # noqa: ANN001, ANN202
        """Softmax over the kept keys, a row with none giving 0 (and no NaN in its
        gradient: exp of finite values only, times the mask)."""
        qf, kf, vf = (t.float().transpose(1, 2) for t in (qx, kx, vx))
        kf, vf = kf.repeat_interleave(groups, dim=1), vf.repeat_interleave(groups, dim=1)
        scores = qf @ kf.transpose(-1, -2) / math.sqrt(d)
        lse = torch.logsumexp(scores.masked_fill(~keep, float("-inf")), dim=-1, keepdim=True)
        lse = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse).detach()
        p = torch.exp(scores.masked_fill(~keep, 0.0) - lse) * keep
        p = p / p.sum(-1, keepdim=True).clamp_min(1e-30)
        return (p @ vf).transpose(1, 2)

    leaves = [t.float().requires_grad_(True) for t in (q, k, v)]
    masked_reference(*leaves).backward(d_o.float())
    want = [t.grad for t in leaves]
    tensors = pipelink.block_mask_tensors(bm)
    o, lse = ks.forward(q, k, v, *tensors)
    nan = float("nan")
    out = (torch.full_like(q, nan), torch.full_like(k, nan), torch.full_like(v, nan),
           torch.full((h, 2, b * s), nan, device="cuda"),
           torch.full(q.shape, nan, device="cuda"),
           torch.full((h, b * s // 64 + b + 1), -7, device="cuda", dtype=torch.int32))
    ks.backward(d_o, q, k, v, o, lse, *tensors[4:], out=out)
    for name, got, ref in zip(("dq", "dk", "dv"), out, want, strict=False):
        _close_grad(name, got, ref)
    ours = [t.clone().requires_grad_(True) for t in (q, k, v)]
    ks(*ours, *tensors)[0].backward(d_o)
    flex = [t.clone().transpose(1, 2).requires_grad_(True) for t in (q, k, v)]
    flex_attention(*flex, block_mask=bm, enable_gqa=groups > 1).backward(d_o.transpose(1, 2))
    for name, leaf, ref, theirs in zip(("q", "k", "v"), ours, want, flex, strict=True):
        _close_grad(f"{name}.grad", leaf.grad, ref)
        _close_grad(f"{name}.grad against Flex", leaf.grad, theirs.grad.transpose(1, 2).float())


def test_a_per_head_block_mask_with_shared_kv_heads_is_refused(build_dir):
    """The backward walks one BlockMask column for all query heads of a K/V head: a mask
    that differs per head needs one query head per K/V head, and says so before launch."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask

    import pipelink
    from pipelink.errors import PipeLinkError
    ks = pipelink.load(build_dir / "sm_90a" / "attn_block_sparse")
    q, k, v = inputs(1, 256, 4, 2, 128, seed=9)
    bm = create_block_mask(sparse_mask_mod("per_head"), 1, 4, 256, 256, device="cuda")
    tensors = pipelink.block_mask_tensors(bm)
    o, lse = ks.forward(q, k, v, *tensors)
    with pytest.raises(PipeLinkError, match=r"\(MH - 1\) \* \(H - HKV\) == 0"):
        ks.backward(torch.randn_like(q), q, k, v, o, lse, *tensors[4:])
    torch.cuda.synchronize()


def paged(k, page: int, spare: int, seed: int):  # noqa: ANN001, ANN201
    """K [B, S, HKV, D] scattered into a cache of shuffled pages (vLLM's layout) with
    `spare` unused blocks, and the block table that finds them again."""
    import torch
    b, s, hkv, d = k.shape
    pages = -(-s // page)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    order = torch.randperm(b * pages + spare, generator=gen)[:b * pages].view(b, pages)
    cache = torch.randn(b * pages + spare, page, hkv, d, device="cuda").to(k.dtype)
    padded = torch.zeros(b, pages * page, hkv, d, device="cuda", dtype=k.dtype)
    padded[:, :s] = k
    cache[order.flatten().cuda()] = padded.view(b * pages, page, hkv, d)
    return cache, order.to(torch.int32).cuda()


@pytest.mark.parametrize("mode", ["sm_90a", "mono"])
@pytest.mark.parametrize("recipe", ["attn_paged", "attn_paged_d64"])
@pytest.mark.parametrize("b,s,h,hkv", [(2, 1000, 4, 2), (1, 130, 2, 2), (3, 256, 2, 1),
                                        (1, 2048, 2, 1)])
def test_paged_kv_matches_contiguous(build_dir, mode, recipe, b, s, h, hkv):
    """attn_paged: K and V through a shuffled block table give the causal recipe's
    answer on the contiguous tensors (pages past a sequence's end hold noise)."""
    import torch

    import pipelink
    op = pipelink.load(build_dir / mode / recipe)
    d = head_dim(recipe)
    q, k, v = inputs(b, s, h, hkv, d, seed=s * 3 + h)
    k_cache, table = paged(k, 64, spare=5, seed=s)
    v_cache, same = paged(v, 64, spare=5, seed=s)    # the same shuffle
    assert torch.equal(table, same)
    o = torch.full((b, s, h, d), float("nan"), device="cuda", dtype=torch.bfloat16)
    lse = torch.full((b, h, s), float("nan"), device="cuda", dtype=torch.float32)
    op(q, k_cache, v_cache, table, out=(o, lse))
    want_o, want_lse = reference(q, k, v, "attn_causal")
    torch.testing.assert_close(lse, want_lse, atol=LSE_ATOL, rtol=0)
    torch.testing.assert_close(o.float(), want_o, atol=O_ATOL, rtol=O_RTOL)


def _manifest(folder, kernel: str) -> dict:  # noqa: ANN001
    import json
    return json.loads((folder / kernel / "kernel.json").read_text())


def test_the_core_object_is_shared(build_dir):
    """Every attention recipe links one attn_fwd_core object, and every backward one
    attn_bwd_core object: the masks, the score modifiers and the schedulers are other
    objects, inlined into it by LTO."""
    forward = {_manifest(build_dir / "sm_90a" / r, "forward")["inputs"]["core"]
               for r in ATTENTION}                # instance -> sha256 of its object
    backward = {_manifest(build_dir / "sm_90a" / r, "backward")["inputs"]["core"]
                for r in BACKWARD}
    assert len(forward) == 1, forward
    assert len(backward) == 1, backward
    # At head dim 64 likewise: one backward object, and one forward object per query
    # tile (192 rows, 128 rows), each other than head dim 128's.
    forward_64 = [{_manifest(build_dir / "sm_90a" / r, "forward")["inputs"]["core"]
                   for r in HEAD_DIM_64 if (r in QUERY_TILE_192) == tall}
                  for tall in (True, False)]
    backward_64 = {_manifest(build_dir / "sm_90a" / r, "backward")["inputs"]["core"]
                   for r in BACKWARD_64}
    assert [len(f) for f in forward_64] == [1, 1], forward_64
    assert not forward_64[0] & forward_64[1] and not (forward_64[0] | forward_64[1]) & forward
    assert len(backward_64) == 1 and backward_64 != backward, backward_64


def test_bad_input_is_refused_before_launch(build_dir):
    import torch

    import pipelink
    from pipelink.errors import PipeLinkError
    op = pipelink.load(build_dir / "sm_90a" / "attn_causal")
    q, k, v = inputs(1, 256, 4, 2, 128, seed=5)
    with pytest.raises(PipeLinkError, match="D == 128"):
        op(q[..., :64].contiguous(), k[..., :64].contiguous(), v[..., :64].contiguous())
    with pytest.raises(PipeLinkError, match="H % HKV == 0"):
        op(q[:, :, :3].contiguous(), k, v)
    with pytest.raises(PipeLinkError, match="D == 64"):   # head dim 128 into the 64 build
        pipelink.load(build_dir / "sm_90a" / "attn_causal_d64")(q, k, v)
    with pytest.raises(PipeLinkError):
        op(q, k[:, :128].contiguous(), v)   # K shorter than Q
    with pytest.raises(PipeLinkError):
        op(q, k.float(), v)
    torch.cuda.synchronize()


def test_bad_offsets_and_pages_are_refused_before_launch(build_dir):
    """launch.contents: cu_seqlens that run backwards or leave rows out, and a page
    table pointing past the cache, are refused naming the entry; nothing is written."""
    import torch

    import pipelink
    from pipelink.errors import PipeLinkError
    docs = pipelink.load(build_dir / "sm_90a" / "attn_document")
    q, k, v = (t[0] for t in inputs(1, 600, 2, 2, 128, seed=11))
    o = torch.full((600, 2, 128), float("nan"), device="cuda", dtype=torch.bfloat16)
    for offsets, needle in (([0, 400, 300, 600], "entry 2 is 300 after 400"),
                            ([0, 300, 599], "last entry must be 600")):
        cu = torch.tensor(offsets, device="cuda", dtype=torch.int32)
        with pytest.raises(PipeLinkError, match=needle):
            docs(q, k, v, cu, out=(o, torch.empty(2, 600, device="cuda")))
    assert bool(o.isnan().all())                      # refused before launch
    pages = pipelink.load(build_dir / "sm_90a" / "attn_paged")
    q, k, v = inputs(1, 256, 2, 2, 128, seed=12)
    k_cache, table = paged(k, 64, spare=1, seed=3)
    v_cache, _ = paged(v, 64, spare=1, seed=3)
    table[0, 2] = k_cache.shape[0]                    # one block past the cache
    with pytest.raises(PipeLinkError, match=r"entry 2 is 5, outside \[0, 4\]"):
        pages(q, k_cache, v_cache, table)
    torch.cuda.synchronize()


def test_backward_through_the_forward_only_op_is_an_error(build_dir):
    """attn_paged has no backward kernel (prefill over a paged cache): backpropagating
    through it must fail loudly, never leave q.grad silently empty."""
    import pipelink
    from pipelink.errors import PipeLinkError
    op = pipelink.load(build_dir / "sm_90a" / "attn_paged")
    q, k, v = inputs(1, 128, 2, 2, 128, seed=13)
    k_cache, table = paged(k, 64, spare=1, seed=13)
    v_cache, _ = paged(v, 64, spare=1, seed=13)
    q.requires_grad_(True)
    o, _ = op(q, k_cache, v_cache, table)
    with pytest.raises(PipeLinkError, match="has no backward kernel"):
        o.float().sum().backward()
    assert q.grad is None


def test_a_block_mask_of_another_block_size_is_refused(build_dir):
    import torch
    from torch.nn.attention.flex_attention import create_block_mask

    import pipelink
    from pipelink.errors import PipeLinkError
    op = pipelink.load(build_dir / "sm_90a" / "attn_block_sparse")
    q, k, v = inputs(1, 512, 2, 2, 128, seed=7)
    bm = create_block_mask(lambda b, h, q_, kv: q_ >= kv, None, None, 512, 512, device="cuda",
                           BLOCK_SIZE=64)
    with pytest.raises(PipeLinkError, match="QB == ceil_div"):
        op(q, k, v, *pipelink.block_mask_tensors(bm))
    torch.cuda.synchronize()
