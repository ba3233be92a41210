"""mlp: two phases in one cooperative launch (gemm_swiglu writing H, then gemm reading
H written by every CTA) against PyTorch in fp32, on fresh random inputs with both
outputs poisoned with NaN first and compared element by element. A CTA that started
'down' before every CTA had finished 'up' would read stale H rows: the case with more
tiles than SMs catches it. Linked and monolithic, several launches and a CUDA graph
replay (the phase counter is zeroed before each launch)."""

from __future__ import annotations

import math

import pytest

from .gemm_check import interleave

pytestmark = pytest.mark.gpu

ATOL, RTOL = 2e-2, 2e-2   # bf16 outputs (2^-8 relative) of fp32 sums, values O(1)
SHAPES = [(256, 512, 256, 512), (1000, 1000, 2064, 776), (4096, 2048, 5632, 2048),
          (77, 328, 4112, 136)]   # (M, K, 2 I, D)


def _inputs(m: int, k: int, n: int, d: int, seed: int):  # noqa: ANN202
    import torch
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
    wg, wu = (torch.randn(2, n // 2, k, device="cuda", generator=gen) / math.sqrt(k)) \
        .to(torch.bfloat16)
    w2 = (torch.randn(d, n // 2, device="cuda", generator=gen) / math.sqrt(n // 2)) \
        .to(torch.bfloat16)
    return x, wg, wu, w2


def _check(op, m: int, k: int, n: int, d: int, seed: int) -> None:  # noqa: ANN001
    import torch
    x, wg, wu, w2 = _inputs(m, k, n, d, seed)
    h = torch.full((m, n // 2), float("nan"), device="cuda", dtype=torch.bfloat16)
    y = torch.full((m, d), float("nan"), device="cuda", dtype=torch.bfloat16)
    op(x, interleave(wg, wu), w2, out={"h": h, "y": y})
    torch.cuda.synchronize()
    silu = torch.nn.functional.silu
    h_ref = silu(x.float() @ wg.float().t()) * (x.float() @ wu.float().t())
    torch.testing.assert_close(h.float(), h_ref, atol=ATOL, rtol=RTOL)
    # 'down' is checked against the H it read (the rounding of H is phase 'up''s).
    torch.testing.assert_close(y.float(), h.float() @ w2.float().t(), atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("mode", ["sm_90a", "mono"])
@pytest.mark.parametrize("m,k,n,d", SHAPES)
def test_two_phases_match_pytorch(build_dir, mode, m, k, n, d):
    import pipelink
    op = pipelink.load(build_dir / mode / "mlp")
    _check(op, m, k, n, d, seed=m + k + n + d)


def test_phase_counter_restarts_every_launch_and_replay(build_dir):
    """Several launches, then CUDA graph replays with the outputs poisoned before each: a
    counter left at the last launch's count would let 'down' start before 'up' ends."""
    import torch

    import pipelink
    op = pipelink.load(build_dir / "sm_90a" / "mlp")
    m, k, n, d = 2048, 1024, 4096, 1024
    x, wg, wu, w2 = _inputs(m, k, n, d, seed=7)
    w1 = interleave(wg, wu)
    h = torch.empty(m, n // 2, device="cuda", dtype=torch.bfloat16)
    y = torch.empty(m, d, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        op(x, w1, w2, out={"h": h, "y": y})
    torch.cuda.synchronize()
    expected = y.clone()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        op(x, w1, w2, out={"h": h, "y": y})     # warm the workspace on this stream
        stream.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            op(x, w1, w2, out={"h": h, "y": y})
    for _ in range(3):
        h.fill_(float("nan"))
        y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, expected)
