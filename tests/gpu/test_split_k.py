"""Tiles cut along K on the H200: the split-K tail (splitk_scheduler) and stream-K
(streamk_scheduler), both through pipelink/splitk.cuh. Shapes whose last wave is cut,
compared element by element with fp32 PyTorch, bitwise equal from launch to launch (the
pieces add up in a fixed order), and replayed from a CUDA graph with new inputs (the
flags are reset inside the graph)."""

from __future__ import annotations

import math

import pytest

from .gemm_check import interleave

pytestmark = pytest.mark.gpu

ATOL, RTOL = 3e-2, 2e-2   # bf16 output of fp32 accumulation over K up to 4096

# (M, N, K): tiles of 128 x 256 against 132 SMs; how split-K / stream-K cut them
SPLIT_SHAPES = [
    (300, 1000, 2048),     # 12 tiles, all tail: 8 pieces each / 12 tiles over 96 CTAs
    (256, 22016, 4096),    # 172 tiles: 40 tail tiles in 3 pieces / all 172 streamed
    (128, 37888, 3584),    # 148 tiles: 16 tail tiles in 8 pieces / 148 streamed
    (1000, 1000, 1000),    # 32 tiles in 4 pieces of 4 k-tiles, the last one ragged
    (128, 22016, 4096),    # 86 tiles: none split / streamed, up to 3 pieces a tile
    (100, 200, 64),        # one tile of one k-tile: never split
    (2048, 22016, 4096),   # 1376 tiles: 9 whole waves, then 188 tiles streamed
    (512, 28672, 4096),    # stream-K: lanes of 4 CTAs (one per tile row), 33 lanes
    (200, 22016, 4096),    # gemm_auto's `narrow`: 2 x 132 tiles of 128 x 168, both edges ragged
    (200, 37888, 4096),    # gemm_auto's `even`: 2 x 198 tiles of 128 x 192, both edges ragged
]
# gemm_auto runs `narrow` (128 x 168) or `even` (128 x 192), data-parallel, up to M = 512
# where their waves come out nearly whole, else its `short` kernel (128 x 128 stream-K)
# up to M = 128 and `mid` (128 x 256 stream-K, lockstep rows) up to M = 512
GEMMS = ["gemm", "gemm_streamk", "gemm_auto"]
SWIGLUS = ["gemm_swiglu", "gemm_swiglu_streamk"]


def operands(m: int, n: int, k: int, seed: int):  # noqa: ANN201
    import torch
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
    w = (torch.randn(n, k, device="cuda", generator=gen) / math.sqrt(k)).to(torch.bfloat16)
    return x, w


@pytest.mark.parametrize("recipe", GEMMS)
@pytest.mark.parametrize("mode", ["sm_90a", "mono"])
@pytest.mark.parametrize("m,n,k", SPLIT_SHAPES)
def test_split_tiles_match_pytorch_and_repeat_bitwise(build_dir, recipe, mode, m, n, k):
    import torch

    import pipelink
    op = pipelink.load(build_dir / mode / recipe)
    x, w = operands(m, n, k, seed=m + n)
    first = op(x, w, out=torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16))
    torch.testing.assert_close(first.float(), x.float() @ w.float().t(), atol=ATOL, rtol=RTOL)
    for _ in range(3):
        again = op(x, w, out=torch.full_like(first, float("nan")))
        assert torch.equal(again, first), "split-K pieces added up in a different order"


def whole_waves(m: int, n: int, sms: int) -> str | None:
    """gemm_auto's rule on sm_90a for its data-parallel kernels: whole waves of 128 x 168
    tiles (`narrow`, 21/32 of a 128 x 256 tile's time each) or 128 x 192 (`even`, 24/32)
    where they beat each other and stream-K's share of 128 x 256 tiles plus a quarter."""
    rows = -(-m // 128)
    waves168, waves192 = (-(-rows * -(-n // w) // sms) for w in (168, 192))
    stream = 32 * rows * -(-n // 256) + 8 * sms
    if m > 512:
        return None
    if 21 * waves168 < 24 * waves192 and 21 * sms * waves168 < stream:
        return "narrow"
    return "even" if 24 * sms * waves192 < stream else None


def test_gemm_auto_dispatches_on_m_and_n(build_dir):
    """Each call runs the kernel its M and N select, and the choice is made per call."""
    import torch

    import pipelink
    ks = pipelink.load(build_dir / "sm_90a" / "gemm_auto")
    sms = ks["narrow"].host_sizes["num_sms"]
    compiled = torch.compile(lambda x, w: ks(x, w), fullgraph=True, dynamic=True)
    cases = [(1, 384, "short"), (128, 384, "short"), (129, 384, "mid"), (512, 384, "mid"),
             (513, 384, "tall"), (4096, 384, "tall"), (128, 22016, "short"),
             (256, 22016, "mid"), (256, 28672, "mid"), (512, 37888, "mid"),
             (640, 37888, "tall")]
    for m, n, kernel in cases:
        kernel = whole_waves(m, n, sms) or kernel
        x, w = operands(m, n, 256, seed=m)
        assert ks.choose(x, w) is ks[kernel], f"M={m} N={n} should run {kernel}"
        want = x.float() @ w.float().t()
        torch.testing.assert_close(ks(x, w).float(), want, atol=ATOL, rtol=RTOL)
        torch.testing.assert_close(compiled(x, w).float(), want, atol=ATOL, rtol=RTOL)
    if sms == 132:      # an H100 SXM or H200: the bench's shapes
        assert [whole_waves(m, n, sms) for m, n in ((128, 22016), (256, 22016), (256, 37888),
                                                    (512, 37888), (512, 22016), (256, 28672))
                ] == ["narrow", "narrow", "even", "even", "narrow", None]


@pytest.mark.parametrize("recipe", SWIGLUS)
@pytest.mark.parametrize("m,n,k", [(256, 22016, 4096), (300, 1008, 2048), (128, 37888, 3584)])
def test_split_tiles_of_swiglu_sum_before_the_activation(build_dir, recipe, m, n, k):
    import torch

    import pipelink
    op = pipelink.load(build_dir / "sm_90a" / recipe)
    x, gate = operands(m, n // 2, k, seed=k)
    _, up = operands(m, n // 2, k, seed=k + 1)
    y = op(x, interleave(gate, up),
           out=torch.full((m, n // 2), float("nan"), device="cuda", dtype=torch.bfloat16))
    want = torch.nn.functional.silu(x.float() @ gate.float().t()) * (x.float() @ up.float().t())
    torch.testing.assert_close(y.float(), want, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("recipe", GEMMS)
def test_split_tiles_replay_from_a_cuda_graph_with_new_inputs(build_dir, recipe):
    import torch

    import pipelink
    op = pipelink.load(build_dir / "sm_90a" / recipe)
    m, n, k = 256, 22016, 4096
    x, w = operands(m, n, k, seed=7)
    op(x, w)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = op(x, w)
    for seed in (8, 9, 10):
        new_x, new_w = operands(m, n, k, seed=seed)
        x.copy_(new_x)
        w.copy_(new_w)
        y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(y.float(), x.float() @ w.float().t(), atol=ATOL, rtol=RTOL)


def test_split_tail_shares_a_workspace_per_stream_only(build_dir):
    """Eager calls reuse one workspace per stream; calls queued on four streams at once,
    and a graph replayed between them, never see each other's partials or flags."""
    import torch

    import pipelink
    from pipelink.runtime import torch_ops
    op = pipelink.load(build_dir / "sm_90a" / "gemm")
    m, n, k = 300, 1000, 2048          # every tile in 8 pieces: all of it goes through flags
    streams = [torch.cuda.Stream() for _ in range(4)]
    operand_sets = [operands(m, n, k, seed=40 + i) for i in range(len(streams))]
    graph_x, graph_w = operands(m, n, k, seed=50)
    op(graph_x, graph_w)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_y = op(graph_x, graph_w)
    results = []
    for _ in range(4):
        for s, (x, w) in zip(streams, operand_sets, strict=True):
            with torch.cuda.stream(s):
                results.append((x, w, op(x, w)))
        graph.replay()
    torch.cuda.synchronize()
    for x, w, y in [*results, (graph_x, graph_w, graph_y)]:
        torch.testing.assert_close(y.float(), x.float() @ w.float().t(), atol=ATOL, rtol=RTOL)
    held = {key for key in torch_ops._STREAM_WORKSPACES if key[1] in
            {s.cuda_stream for s in streams}}
    assert len(held) == len(streams), "one eager workspace per stream"
