"""The attention recipes (attn_causal, attn_dense, attn_sliding, attn_document,
attn_softcap, attn_alibi: one core object, the masks, score modifiers and schedulers
linked into it) against an fp32 PyTorch reference, per element, on fresh random
inputs. O and LSE are poisoned with NaN first, so a tile left
unwritten, a row written for the wrong sequence or head, or one wrong key tile fails."""

from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.gpu

O_ATOL, O_RTOL = 1.5e-2, 2e-2   # P rounded to bf16 before P V, O rounded to bf16
LSE_ATOL = 2e-3                  # fp32 softmax statistics (MUFU exp2 and log)
SOFTCAP = 30.0
ATTENTION = ("attn_causal", "attn_dense", "attn_softcap", "attn_alibi", "attn_sliding",
             "attn_document")


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
            "attn_sliding": (kv <= q) & (kv >= q - WINDOW)}.get(recipe, kv <= q)
    return s.masked_fill(~keep, float("-inf"))


def reference(q, k, v, recipe: str):  # noqa: ANN001, ANN201
    """O [B, S, H, D] and LSE [B, H, S] in fp32; K/V heads repeated for GQA."""
    import torch
    groups = q.shape[2] // k.shape[2]
    qf, kf, vf = (t.float().transpose(1, 2) for t in (q, k, v))
    kf, vf = kf.repeat_interleave(groups, dim=1), vf.repeat_interleave(groups, dim=1)
    s = scores_of(recipe, qf @ kf.transpose(-1, -2) / math.sqrt(q.shape[-1]))
    lse = torch.logsumexp(s, dim=-1)
    o = torch.softmax(s, dim=-1) @ vf
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
]


@pytest.mark.parametrize("mode", ["sm_90a", "mono"])
@pytest.mark.parametrize("recipe,b,s,h,hkv", CASES)
def test_attention_matches_pytorch(build_dir, mode, recipe, b, s, h, hkv):
    import torch

    import pipelink
    op = pipelink.load(build_dir / mode / recipe)
    q, k, v = inputs(b, s, h, hkv, 128, seed=b * 1000 + s + h)
    o = torch.full((b, s, h, 128), float("nan"), device="cuda", dtype=torch.bfloat16)
    lse = torch.full((b, h, s), float("nan"), device="cuda", dtype=torch.float32)
    op(q, k, v, out=(o, lse))
    want_o, want_lse = reference(q, k, v, recipe)
    torch.testing.assert_close(lse, want_lse, atol=LSE_ATOL, rtol=0)
    torch.testing.assert_close(o.float(), want_o, atol=O_ATOL, rtol=O_RTOL)


DOCUMENTS = [  # document lengths, H, HKV
    ([300, 0, 1, 129, 700, 0], 4, 2),   # empty documents, one of one token
    ([128, 256, 17], 2, 2),
    ([0, 0], 2, 1),                     # no tokens at all: nothing is written
]


@pytest.mark.parametrize("mode", ["sm_90a", "mono"])
@pytest.mark.parametrize("lengths,h,hkv", DOCUMENTS)
def test_documents_attend_within_themselves(build_dir, mode, lengths, h, hkv):
    """attn_document: packed documents, each causal within itself; rows past the last
    document (there are none here) and documents of no rows write nothing."""
    import torch

    import pipelink
    op = pipelink.load(build_dir / mode / "attn_document")
    total = sum(lengths)
    q, k, v = (t[0] for t in inputs(1, max(total, 1), h, hkv, 128, seed=total + h))
    q, k, v = q[:total], k[:total], v[:total]
    cu = torch.tensor([0, *lengths], device="cuda", dtype=torch.int32).cumsum(0).to(torch.int32)
    o = torch.full((total, h, 128), float("nan"), device="cuda", dtype=torch.bfloat16)
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


def test_the_core_object_is_shared(build_dir):
    """Every attention recipe links one attn_fwd_core object: the masks, the score
    modifiers and the schedulers are other objects, inlined into it by LTO."""
    import json
    hashes = set()
    for recipe in ATTENTION:
        manifest = json.loads((build_dir / "sm_90a" / recipe / "kernel.json").read_text())
        hashes.add(manifest["inputs"]["core"])   # instance -> sha256 of its object
    assert len(hashes) == 1, hashes


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
    with pytest.raises(PipeLinkError):
        op(q, k[:, :128].contiguous(), v)   # K shorter than Q
    with pytest.raises(PipeLinkError):
        op(q, k.float(), v)
    torch.cuda.synchronize()
