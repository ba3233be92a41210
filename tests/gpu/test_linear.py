"""The linear recipe's three kernels on the H200 against PyTorch in fp32, element by
element: forward Y = X W^T, dgrad dX = dY W (W read MN-major in place), wgrad
dW = dY^T X (dY and X read MN-major in place), each loaded from its folder under
build/gpu/<mode>/linear/ (kernels.json beside them). Outputs are poisoned with NaN
before each launch."""

from __future__ import annotations

import json
import math

import pytest

pytestmark = pytest.mark.gpu

SHAPES = [(128, 512, 64), (1000, 1000, 1000), (296, 1008, 200), (2048, 4096, 4096)]
# bf16 output of an fp32 accumulation of unit-scale terms: ~2^-8 relative, plus the
# absolute error of values near zero.
RTOL, ATOL = 2e-2, 2e-2


def _randn(gen, *shape: int, scale: float = 1.0):  # noqa: ANN001, ANN202
    import torch
    return (torch.randn(*shape, device="cuda", generator=gen) * scale).to(torch.bfloat16)


def _run(folder, kernel: str, inputs: list, out: str, shape: tuple[int, int]):  # noqa: ANN001, ANN202
    import torch

    import pipelink
    op = pipelink.load(folder / kernel)
    poison = torch.full(shape, float("nan"), device="cuda", dtype=torch.bfloat16)
    y = op(*inputs, out={out: poison})
    torch.cuda.synchronize()
    assert not torch.isnan(y).any(), "unwritten (NaN poison) elements remain"
    return y


@pytest.mark.parametrize("mode", ["sm_90a", "mono"])
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_forward_dgrad_and_wgrad_match_pytorch(build_dir, mode, m, n, k):
    import torch
    folder = build_dir / mode / "linear"
    if not (folder / "kernels.json").is_file():
        pytest.skip(f"{folder} not built")
    index = json.loads((folder / "kernels.json").read_text())
    assert index["kernels"] == {"forward": "forward", "dgrad": "dgrad", "wgrad": "wgrad"}
    gen = torch.Generator(device="cuda").manual_seed(m + n + k)
    x = _randn(gen, m, k)
    w = _randn(gen, n, k, scale=1 / math.sqrt(k))
    dy = _randn(gen, m, n, scale=1 / math.sqrt(n))
    y = _run(folder, "forward", [x, w], "y", (m, n))
    torch.testing.assert_close(y.float(), x.float() @ w.float().t(), rtol=RTOL, atol=ATOL)
    dx = _run(folder, "dgrad", [dy, w], "dx", (m, k))
    torch.testing.assert_close(dx.float(), dy.float() @ w.float(), rtol=RTOL, atol=ATOL)
    dw = _run(folder, "wgrad", [dy, x], "dw", (n, k))
    torch.testing.assert_close(dw.float(), dy.float().t() @ x.float(),
                               rtol=RTOL, atol=ATOL * math.sqrt(m / n))


def test_a_wrong_block_fails_the_bounds():
    """The element-wise bound catches one wrong 8x8 block a norm would average away."""
    import torch
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    ref = torch.randn(512, 512, device="cuda")
    bad = ref.clone()
    bad[64:72, 128:136] += 0.5
    assert float((bad - ref).norm() / ref.norm()) < 1e-2    # a norm would pass it
    with pytest.raises(AssertionError):
        torch.testing.assert_close(bad, ref, rtol=RTOL, atol=ATOL)
