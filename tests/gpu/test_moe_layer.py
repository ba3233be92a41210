"""moe_layer: the whole MoE layer forward (router, dispatch, permute, up, down,
combine) in one launch, against PyTorch on fresh random inputs, every output poisoned
first. The router's softmax is compared element by element with float64; its top-2
choices must be a top-2 of the float64 probabilities (a near-tie may pick either
expert) in descending order, with weights renormalised to 1; everything after routing
is checked as moe_forward's test does, from the choices the router made."""

from __future__ import annotations

import math

import pytest

from pipelink import interleave_gate_up

from .test_moe_forward import check_moe_ffn

pytestmark = pytest.mark.gpu

TOP_K = 2                       # recipes/moe_layer.yaml routes to two experts
CASES = [  # (T, D, F, E, pull): `pull` draws tokens to expert 0; the last two get none
    (300, 256, 136, 8, 1.5),
    (777, 256, 176, 64, 0.0),
    (2048, 1024, 704, 16, 1.5),
    (33, 512, 64, 4, 0.0),
]


def _inputs(t: int, d: int, f: int, e: int, pull: float, seed: int):  # noqa: ANN202
    import torch
    gen = torch.Generator(device="cuda").manual_seed(seed)
    u = torch.randn(d, device="cuda", generator=gen)
    u /= u.norm()
    # x . u is 6 +- 1 for every token, so u in a row of Wr moves that expert's logits
    x = (torch.randn(t, d, device="cuda", generator=gen) + 6.0 * u).to(torch.bfloat16)
    wr = torch.randn(e, d, device="cuda", generator=gen) / math.sqrt(d)
    wr[0] += pull / 3.0 * u
    wr[e - 2:] -= 3.0 * u                   # logits below -12: never in a top-2
    wg, wu = (torch.randn(2, e, f, d, device="cuda", generator=gen) / math.sqrt(d)) \
        .to(torch.bfloat16)
    w2 = (torch.randn(e, d, f, device="cuda", generator=gen) / math.sqrt(f)).to(torch.bfloat16)
    return x, wr.to(torch.bfloat16), wg, wu, w2


def _poisoned(t: int, d: int, f: int, e: int) -> dict:
    import torch
    k = TOP_K
    ints = {"topk_ids": (t, k), "ends": (e,), "slot_of": (t, k), "token_of": (t * k,)}
    floats = {"probs": (t, e), "topk_w": (t, k)}
    halves = {"xp": (t * k, d), "h": (t * k, f), "yp": (t * k, d), "y": (t, d)}
    return {**{n: torch.full(s, -7, device="cuda", dtype=torch.int32) for n, s in ints.items()},
            **{n: torch.full(s, float("nan"), device="cuda") for n, s in floats.items()},
            **{n: torch.full(s, float("nan"), device="cuda", dtype=torch.bfloat16)
               for n, s in halves.items()}}


def check_router(outs: dict, x, wr, top_k: int = TOP_K) -> None:  # noqa: ANN001
    import torch
    probs = torch.softmax(x.double() @ wr.double().t(), dim=1)
    torch.testing.assert_close(outs["probs"].double(), probs, atol=2e-5, rtol=1e-4)
    ids = outs["topk_ids"].long()
    e = wr.shape[0]
    assert ids.shape[1] == top_k
    assert bool(((ids >= 0) & (ids < e)).all()), "an expert id outside [0, E)"
    ordered = ids.sort(1).values
    assert bool((ordered[:, 1:] != ordered[:, :-1]).all()), "one expert chosen twice"
    chosen = probs.gather(1, ids)
    best = probs.topk(top_k, dim=1).values
    torch.testing.assert_close(chosen, best, atol=2e-5, rtol=0)      # a top-k, best first
    torch.testing.assert_close(outs["topk_w"].double(), chosen / chosen.sum(1, keepdim=True),
                               atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("mode", ["sm_90a", "mono"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_moe_layer_matches_pytorch(build_dir, mode, case):
    import torch

    import pipelink
    t, d, f, e, pull = CASES[case]
    x, wr, wg, wu, w2 = _inputs(t, d, f, e, pull, seed=100 + case)
    op = pipelink.load(build_dir / mode / "moe_layer")
    outs = _poisoned(t, d, f, e)
    w1 = interleave_gate_up(wg, wu)
    op(x, wr, w1, w2, out=outs)
    torch.cuda.synchronize()
    check_router(outs, x, wr)
    assert int((outs["topk_ids"] >= e - 2).sum()) == 0, "the last two experts get no tokens"
    check_moe_ffn(outs, x, outs["topk_ids"], outs["topk_w"], wg, wu, w2)
    again = _poisoned(t, d, f, e)
    op(x, wr, w1, w2, out=again)
    torch.cuda.synchronize()
    for name in outs:
        assert torch.equal(again[name], outs[name]), f"{name} differs on a second launch"
