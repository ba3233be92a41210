"""GEMM (+ SwiGLU, + bias and GELU; hand-written and CuTe mainloops) on the H200 against
PyTorch in fp32, linked and monolithic."""

from __future__ import annotations

import pytest

from .gemm_check import REFERENCE, excess, run

pytestmark = pytest.mark.gpu
SHAPES = [(128, 512, 64), (512, 2048, 4096), (1000, 1000, 1000), (300, 1008, 200),
          (2048, 4096, 4096), (77, 4112, 328)]


@pytest.mark.parametrize("recipe", sorted(REFERENCE))
@pytest.mark.parametrize("mode", ["sm_90a", "mono"])
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_matches_pytorch(build_dir, recipe, mode, m, n, k):
    folder = build_dir / mode
    if not (folder / recipe).is_dir():
        pytest.skip(f"{folder / recipe} not built")
    if REFERENCE[recipe] == "swiglu" and n % 16:
        pytest.skip("SwiGLU interleaves gate/up in blocks of 8 rows: N is a multiple of 16")
    error = run(str(folder), recipe, m, n, k, seed=m + n + k)
    assert error <= 1, f"an element is {error:.2f}x its bound"


def test_one_wrong_8x8_block_fails_the_check():
    """The element-wise check catches one wrong 8 x 8 block of a 2048 x 4096 output
    (a norm over the whole output would not notice it)."""
    import torch
    gen = torch.Generator(device="cuda").manual_seed(3)
    ref = torch.randn(2048, 4096, device="cuda", generator=gen)
    y = ref.to(torch.bfloat16)
    assert excess(y, ref) <= 1
    y[1000:1008, 2000:2008] += 0.1
    assert excess(y, ref) > 1
    assert float((y.float() - ref).norm() / ref.norm()) < 1e-2


def test_dynamic_scheduler_counter_restarts_every_launch_and_replay(build_dir):
    """gemm_dynamic claims tiles past the first wave from a workspace counter. More tiles
    than SMs, several calls, then graph replays with the output poisoned before each: a
    counter left at the last launch's value would leave NaN tiles behind."""
    import math

    import torch

    import pipelink
    folder = build_dir / "sm_90a" / "gemm_dynamic"
    if not folder.is_dir():
        pytest.skip(f"{folder} not built")
    op = pipelink.load(folder)
    m, n, k = 4096, 4096, 512                      # 32 x 16 = 512 tiles of 128 x 256
    gen = torch.Generator(device="cuda").manual_seed(11)
    x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
    w = (torch.randn(n, k, device="cuda", generator=gen) / math.sqrt(k)).to(torch.bfloat16)
    want = x.float() @ w.float().t()
    for _ in range(3):
        got = op(x, w)
        torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=3e-2)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = op(x, w)
    for _ in range(3):
        y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert not torch.isnan(y).any()
        torch.testing.assert_close(y.float(), want, rtol=2e-2, atol=3e-2)
