"""moe_train: the MoE layer's forward and backward kernels on the H200, against an fp32
PyTorch reference on fresh random inputs. The forward kernel runs with every output
poisoned; its routing is checked as moe_layer's test does, and its padded routing table
(each expert's segment padded to 64 rows, padding rows pointing at no token and gathered
as zeros) and the gate/up pre-activations it keeps for the backward. The backward kernel
runs with every output poisoned; dX, dWr, dW1 and dW2 are compared element by element
with autograd through an fp32 reference that routes as the kernel did. Then the recipe's
autograd op (`loss.backward()`) must give the same bytes as the direct launches. Cases:
skewed routing (one expert takes most tokens), empty experts, T not a multiple of the
tile, E = 8, 16 and 64, and k = 1, 2 and 6 (one build: k is the op's top_k=)."""

from __future__ import annotations

import pytest

from pipelink import interleave_gate_up

from .test_moe_layer import _inputs, check_router

pytestmark = pytest.mark.gpu

ALIGN = 64                     # recipes/moe_train.yaml pads every expert's rows to 64
CASES = [  # (T, D, F, E, pull, k): `pull` draws tokens to expert 0; the last two get none
    (300, 256, 136, 8, 3.0, 2),
    (777, 256, 176, 64, 0.0, 2),
    (2048, 1024, 704, 16, 1.5, 2),
    (33, 512, 64, 8, 0.0, 2),
    (500, 256, 136, 8, 0.0, 1),
    (640, 512, 96, 16, 1.5, 6),
    (129, 256, 64, 64, 0.0, 6),
    (40, 256, 64, 8, 0.0, 6),     # the sanitizers' k = 6 case: small enough for racecheck
]
RTOL = 5e-2                    # bf16 operands and intermediates, fp32 accumulation


def _poison(shapes: dict[str, tuple[tuple[int, ...], object]]) -> dict:
    import torch
    out = {}
    for name, (shape, dtype) in shapes.items():
        fill = -7 if dtype == torch.int32 else float("nan")
        out[name] = torch.full(shape, fill, device="cuda", dtype=dtype)
    return out


def _close(name: str, got, ref) -> None:  # noqa: ANN001
    """Element by element, relative to the reference's scale: a wrong tile fails."""
    import torch
    scale = float(ref.abs().max())
    # The floor: with k = 1 the renormalised weight is 1 whatever the logits, so dWr is 0
    # and both sides hold rounding noise (a few 1e-6 on the k = 1 case).
    torch.testing.assert_close(got.float(), ref.float(), rtol=RTOL, atol=2e-2 * scale + 1e-5,
                               msg=lambda s: f"{name}: {s}")


def _reference(x, wr, wg, wu, w2, ids, dy):  # noqa: ANN001, ANN202
    """y and the four gradients in fp32, routing to the experts the kernel chose."""
    import torch
    silu = torch.nn.functional.silu
    leaves = [t.float().requires_grad_(True) for t in (x, wr, wg, wu, w2)]
    xf, wrf, wgf, wuf, w2f = leaves
    probs = torch.softmax(xf @ wrf.t(), dim=1)
    s = probs.gather(1, ids.long())
    p = s / s.sum(1, keepdim=True)
    y = torch.zeros(x.shape, device="cuda")
    for j in range(ids.shape[1]):
        for e in range(wr.shape[0]):
            rows = (ids[:, j] == e).nonzero().flatten()
            if rows.numel() == 0:
                continue
            xs = xf[rows]
            h = silu(xs @ wgf[e].t()) * (xs @ wuf[e].t())
            y = y.index_add(0, rows, p[rows, j:j + 1] * (h @ w2f[e].t()))
    y.backward(dy.float())
    return y.detach(), {"dx": xf.grad, "dwr": wrf.grad,
                        "dw1": interleave_gate_up(wgf.grad, wuf.grad), "dw2": w2f.grad}


def _check_padded_table(outs: dict, x, e: int) -> None:  # noqa: ANN001
    import torch
    ids = outs["topk_ids"].long()
    counts = torch.bincount(ids.flatten(), minlength=e).tolist()
    ends, begin = outs["ends"].tolist(), 0
    for g, end in enumerate(ends):
        assert end % ALIGN == 0 and end - begin == -(-counts[g] // ALIGN) * ALIGN, (g, ends)
        tokens = outs["token_of"][begin:end]
        assert bool((tokens[:counts[g]] >= 0).all()) and bool((tokens[counts[g]:] == -1).all())
        real = tokens[:counts[g]].long()
        assert bool((ids[real] == g).any(1).all()), f"expert {g} holds a token it was not given"
        # token order within an expert, whichever CTA placed each row (moe_dispatch)
        assert bool((real[1:] > real[:-1]).all()), f"expert {g}'s tokens are out of order"
        assert torch.equal(outs["xp"][begin:begin + counts[g]], x[real])
        assert not outs["xp"][begin + counts[g]:end].any(), "padding rows are not zero"
        begin = end
    assert bool((outs["token_of"][begin:] == -1).all())
    slots = outs["slot_of"].long()
    assert torch.equal(outs["token_of"][slots].long(),
                       torch.arange(x.shape[0], device="cuda")[:, None].expand_as(slots))


def _check_pre_activations(outs: dict, w1) -> None:  # noqa: ANN001
    """The kept pre-activations A = Xp W1^T, expert by expert, padding rows included
    (zero rows of Xp give zero rows of A)."""
    begin = 0
    for g, end in enumerate(outs["ends"].tolist()):
        if end > begin:                       # an expert with no tokens has no rows
            ref = outs["xp"][begin:end].float() @ w1[g].float().t()
            _close(f"a[expert {g}]", outs["a"][begin:end], ref)
        begin = end


# (build folder, recipe): linked, monolithic, and with the second router swapped in
BUILDS = {"sm_90a": ("sm_90a", "moe_train"), "mono": ("mono", "moe_train"),
          "simt_router": ("sm_90a", "moe_train_simt")}


@pytest.mark.parametrize("mode", sorted(BUILDS))
@pytest.mark.parametrize("case", range(len(CASES)))
def test_moe_train_forward_and_backward_match_pytorch(build_dir, mode, case):
    import torch

    import pipelink
    folder = build_dir / BUILDS[mode][0] / BUILDS[mode][1]
    if not (folder / "kernels.json").is_file():
        pytest.skip(f"{folder} not built")
    t, d, f, e, pull, k = CASES[case]
    x, wr, wg, wu, w2 = _inputs(t, d, f, e, pull, seed=300 + case)
    w1 = interleave_gate_up(wg, wu)
    ks = pipelink.load(folder)
    rows = t * k + e * (ALIGN - 1)
    bf, f32, i32 = torch.bfloat16, torch.float32, torch.int32
    outs = ks.forward(x, wr, w1, w2, top_k=k, out=_poison({
        "y": ((t, d), bf), "probs": ((t, e), f32), "topk_ids": ((t, k), i32),
        "topk_w": ((t, k), f32), "ends": ((e,), i32), "slot_of": ((t, k), i32),
        "token_of": ((rows,), i32), "xp": ((rows, d), bf), "a": ((rows, 2 * f), bf),
        "h": ((rows, f), bf), "yp": ((rows, d), bf)}))
    names = [o.name for o in ks.forward.spec.outputs]
    outs = dict(zip(names, outs, strict=True))
    torch.cuda.synchronize()
    check_router(outs, x, wr, k)
    _check_padded_table(outs, x, e)
    if pull >= 3.0:
        share = float((outs["topk_ids"] == 0).any(1).float().mean())
        assert share >= 0.6, f"the skewed case routes only {share:.0%} of tokens to expert 0"
    dy = (torch.randn(t, d, device="cuda") / 4).to(bf)
    _check_pre_activations(outs, w1)
    # The backward writes dA over A, dH over H and dYp, then dXp, over Yp (the forward's
    # kept tensors are its scratch); w1_grad then reads dA.
    saved = [outs[n] for n in ("probs", "topk_ids", "topk_w", "ends", "slot_of", "token_of",
                               "a", "h", "yp")]
    grads = ks.backward(dy, x, wr, w1, w2, *saved, out=_poison({
        "dx": ((t, d), bf), "dwr": ((e, d), bf), "dw2": ((e, d, f), bf),
        "dp": ((t, k), f32), "dlogits": ((t, e), bf)}))
    grads = dict(zip([o.name for o in ks.backward.spec.outputs], grads, strict=True))
    grads["dw1"] = ks.w1_grad(outs["a"], outs["xp"], outs["ends"],
                              out=_poison({"dw1": ((e, 2 * f, d), bf)}))
    torch.cuda.synchronize()
    y_ref, ref = _reference(x, wr, wg, wu, w2, outs["topk_ids"], dy)
    _close("y", outs["y"], y_ref)
    for name in ("dx", "dwr", "dw1", "dw2"):
        assert not torch.isnan(grads[name]).any(), f"{name}: unwritten (NaN poison) elements"
        _close(name, grads[name], ref[name])
    # The autograd op: the same kernels, so the same bytes.
    leaves = [v.clone().requires_grad_(True) for v in (x, wr, w1, w2)]
    y = ks(*leaves, top_k=k)
    assert torch.equal(y, outs["y"])
    y.backward(dy, retain_graph=True)
    for leaf, name in zip(leaves, ("dx", "dwr", "dw1", "dw2"), strict=True):
        assert torch.equal(leaf.grad, grads[name]), f"autograd's {name} differs"
    # The backward used up the forward's kept tensors: a second one is refused.
    from pipelink.errors import RuntimeLaunchError
    with pytest.raises(RuntimeLaunchError, match="ran once already"):
        y.backward(dy)


BAD_CALLS = {  # what a caller gets wrong -> what the refusal must say
    "k above what the router was built for": (
        lambda x, wr, w1, w2: ((x, wr, w1, w2), {"top_k": 9}), "top_k <= 8"),
    "k of zero": (lambda x, wr, w1, w2: ((x, wr, w1, w2), {"top_k": 0}), "top_k >= 1"),
    "k above E": (lambda x, wr, w1, w2: ((x, wr[:4], w1[:4], w2[:4]), {"top_k": 6}),
                  "top_k <= E"),
    "E above what the objects were built for": (
        lambda x, wr, w1, w2: ((x, wr.repeat(5, 1), w1.repeat(5, 1, 1), w2.repeat(5, 1, 1)),
                               {}), "E <= 64"),
    "non-contiguous expert weights": (
        lambda x, wr, w1, w2: ((x, wr, w1.transpose(1, 2).contiguous().transpose(1, 2), w2),
                               {}), "tensor 'w1'"),
    "wrong dtype": (lambda x, wr, w1, w2: ((x.float(), wr, w1, w2), {}), "input 'x' is f32"),
    "mismatched hidden size": (lambda x, wr, w1, w2: ((x, wr[:, :128].contiguous(), w1, w2), {}),
                               "input 'wr' has shape [16, 128], expected [16, 256]"),
}


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_moe_train_refuses_bad_input(build_dir, case):
    """Each mistake is refused before launch, naming what to change; the context stays
    healthy (a launch with a bad k or E would read past the router's tables)."""
    import torch

    import pipelink
    from pipelink.errors import RuntimeLaunchError
    folder = build_dir / "sm_90a" / "moe_train"
    if not (folder / "kernels.json").is_file():
        pytest.skip(f"{folder} not built")
    x, wr, wg, wu, w2 = _inputs(64, 256, 64, 16, 0.0, seed=400)   # E = 16: k = 9 fits E
    make, needle = BAD_CALLS[case]
    args, kw = make(x, wr, interleave_gate_up(wg, wu), w2)
    with pytest.raises(RuntimeLaunchError) as err:
        pipelink.load(folder)(*args, **kw)
    assert needle in str(err.value), str(err.value)
    torch.cuda.synchronize()


def test_moe_train_under_torch_compile(build_dir):
    """A loss compiled whole (fullgraph) backpropagates to eager's gradients, bit for
    bit: the backward's writes over the forward's kept tensors (autograd.scratch)
    survive tracing, and the compiled step runs again (each forward keeps fresh ones)."""
    import torch

    import pipelink
    folder = build_dir / "sm_90a" / "moe_train"
    if not (folder / "kernels.json").is_file():
        pytest.skip(f"{folder} not built")
    ks = pipelink.load(folder)
    t, d, f, e, pull, k = CASES[5]
    x, wr, wg, wu, w2 = _inputs(t, d, f, e, pull, seed=500)
    w1 = interleave_gate_up(wg, wu)
    dy = (torch.randn(t, d, device="cuda") / 4).to(torch.bfloat16)

    def loss(*leaves):  # noqa: ANN002, ANN202
        y = ks(*leaves, top_k=k)
        return (y.float() * dy.float()).sum(), y

    torch._dynamo.reset()
    compiled = torch.compile(loss, fullgraph=True)
    results = []
    for fn in (loss, compiled, compiled):
        leaves = [v.clone().requires_grad_(True) for v in (x, wr, w1, w2)]
        value, y = fn(*leaves)
        value.backward()
        results.append((y.detach(), [leaf.grad for leaf in leaves]))
    y_ref, grads_ref = results[0]
    for y, grads in results[1:]:
        assert torch.equal(y, y_ref), "the compiled forward differs from eager"
        for name, got, want in zip(("dx", "dwr", "dw1", "dw2"), grads, grads_ref, strict=True):
            assert got is not None and torch.equal(got, want), f"compiled {name} differs"
