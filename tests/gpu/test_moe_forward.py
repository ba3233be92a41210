"""moe_forward: an MoE layer after routing in one launch of five phases (dispatch,
permute, up, down, combine) against PyTorch, on fresh random inputs with every output
poisoned first. The routing table must equal a stable expert-major sort exactly (and
be the same bytes on a second launch); the permuted rows must be X's rows exactly;
H, Yp and Y are compared element by element (H against fp32, Yp against the H it
read, Y against the Yp it read, per token). Cases: one expert taking 60% of the
choices, experts with no tokens, T not a multiple of the tile, k = 1 and k = 6."""

from __future__ import annotations

import math

import pytest

from pipelink import interleave_gate_up

pytestmark = pytest.mark.gpu

ATOL, RTOL = 2e-2, 2e-2
CASES = [  # (T, D, F, E, k, skew)
    (300, 256, 136, 8, 2, 0.6),
    (1000, 512, 256, 8, 1, 0.0),
    (777, 256, 176, 64, 6, 0.0),
    (2048, 1024, 704, 16, 2, 0.6),
]


def _route(t: int, e: int, k: int, skew: float, gen):  # noqa: ANN001, ANN202
    """Top-k distinct experts per token: `skew` of the first choices go to expert 0, and
    the last two experts get none."""
    import torch
    scores = torch.rand(t, e, device="cuda", generator=gen)
    scores[:, e - 2:] = -1.0                                   # empty experts
    hot = torch.rand(t, device="cuda", generator=gen) < skew
    scores[hot, 0] = 2.0
    weights, ids = scores.topk(k, dim=1)
    p = torch.softmax(weights, dim=1)
    return ids.to(torch.int32).contiguous(), p.float().contiguous()


def check_moe_ffn(outs: dict, x, ids, p, wg, wu, w2) -> None:  # noqa: ANN001
    """Everything after routing, against PyTorch: the routing table exactly (a stable
    sort of the choices by expert), the permuted rows exactly, then per expert H
    against fp32 and Yp against the H it read, and Y against the Yp it read."""
    import torch
    t, k = ids.shape
    e = wg.shape[0]
    order = torch.sort(ids.flatten().long(), stable=True).indices
    slot_ref = torch.empty_like(order)
    slot_ref[order] = torch.arange(t * k, device="cuda")
    assert torch.equal(outs["slot_of"].flatten().long(), slot_ref)
    assert torch.equal(outs["token_of"].long(), order // k)
    counts = torch.bincount(ids.flatten().long(), minlength=e)
    assert torch.equal(outs["ends"].long(), counts.cumsum(0))
    assert torch.equal(outs["xp"], x[order // k])
    silu = torch.nn.functional.silu
    begin = 0
    for g, end in enumerate(outs["ends"].tolist()):
        rows = slice(begin, end)
        xe = outs["xp"][rows].float()
        h_ref = silu(xe @ wg[g].float().t()) * (xe @ wu[g].float().t())
        torch.testing.assert_close(outs["h"][rows].float(), h_ref, atol=ATOL, rtol=RTOL)
        torch.testing.assert_close(outs["yp"][rows].float(),
                                   outs["h"][rows].float() @ w2[g].float().t(),
                                   atol=ATOL, rtol=RTOL)
        begin = end
    y_ref = (outs["yp"][outs["slot_of"].long()].float() * p[..., None]).sum(1)
    torch.testing.assert_close(outs["y"].float(), y_ref, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("mode", ["sm_90a", "mono"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_moe_forward_matches_pytorch(build_dir, mode, case):
    import torch

    import pipelink
    t, d, f, e, k, skew = CASES[case]
    gen = torch.Generator(device="cuda").manual_seed(case)
    x = torch.randn(t, d, device="cuda", generator=gen).to(torch.bfloat16)
    wg, wu = (torch.randn(2, e, f, d, device="cuda", generator=gen) / math.sqrt(d)) \
        .to(torch.bfloat16)
    w2 = (torch.randn(e, d, f, device="cuda", generator=gen) / math.sqrt(f)).to(torch.bfloat16)
    ids, p = _route(t, e, k, skew, gen)
    op = pipelink.load(build_dir / mode / "moe_forward")
    outs = {"ends": torch.full((e,), -7, device="cuda", dtype=torch.int32),
            "slot_of": torch.full((t, k), -7, device="cuda", dtype=torch.int32),
            "token_of": torch.full((t * k,), -7, device="cuda", dtype=torch.int32),
            **{name: torch.full(shape, float("nan"), device="cuda", dtype=torch.bfloat16)
               for name, shape in (("xp", (t * k, d)), ("h", (t * k, f)),
                                   ("yp", (t * k, d)), ("y", (t, d)))}}
    op(x, ids, p, interleave_gate_up(wg, wu), w2, out=outs)
    torch.cuda.synchronize()
    check_moe_ffn(outs, x, ids, p, wg, wu, w2)
    # Deterministic: a second launch writes the same bytes.
    again = {name: torch.empty_like(v) for name, v in outs.items()}
    op(x, ids, p, interleave_gate_up(wg, wu), w2, out=again)
    torch.cuda.synchronize()
    for name in outs:
        assert torch.equal(again[name], outs[name]), name


def test_bad_input_is_refused_before_launch(build_dir):
    """Wrong dtype, more experts than the dispatch table holds, non-contiguous weights,
    mismatched shapes: each a clear error, nothing launched."""
    import torch

    import pipelink
    from pipelink.errors import RuntimeLaunchError
    op = pipelink.load(build_dir / "sm_90a" / "moe_forward")
    t, d, f, e, k = 64, 128, 64, 8, 2
    x = torch.randn(t, d, device="cuda").to(torch.bfloat16)
    ids = torch.randint(0, e, (t, k), device="cuda", dtype=torch.int32)
    p = torch.rand(t, k, device="cuda")
    w1 = torch.randn(e, 2 * f, d, device="cuda").to(torch.bfloat16)
    w2 = torch.randn(e, d, f, device="cuda").to(torch.bfloat16)
    many = 80
    bad = [((x, ids.long(), p, w1, w2), "i32"),
           ((x, ids, p, torch.randn(many, 2 * f, d, device="cuda").to(torch.bfloat16),
             torch.randn(many, d, f, device="cuda").to(torch.bfloat16)), "E <= 64"),
           ((x, ids, p, w1.transpose(1, 2).contiguous().transpose(1, 2), w2), "w1"),
           ((x, ids, p, w1, torch.randn(e, d, f + 8, device="cuda").to(torch.bfloat16)),
            "w2")]
    for args, word in bad:
        with pytest.raises(RuntimeLaunchError) as err:
            op(*args)
        assert word in str(err.value), str(err.value)
