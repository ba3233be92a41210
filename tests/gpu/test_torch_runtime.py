"""The runtime as PyTorch code meets it: current and explicit streams, CUDA graphs,
torch.compile, autograd, per-stream workspaces, moved launches, argument checks and
verified loading.

Every result is compared element by element with PyTorch in fp32 on fresh random
inputs; outputs are poisoned with NaN first where the test owns them.
"""

from __future__ import annotations

import math
import shutil

import pytest
import torch

import pipelink
from pipelink.errors import RuntimeLaunchError

from .demo_check import ROWS
from .demo_check import reference as demo_reference

pytestmark = pytest.mark.gpu


SLEEP_CYCLES = 200_000_000     # ~0.1 s of GPU time: long enough to expose a race


def _close(got, want, what=""):
    """bf16 outputs of fp32 accumulation, per element."""
    assert not torch.isnan(got).any(), f"{what}: unwritten (NaN poison) elements remain"
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=3e-2, msg=what)


def _gemm_inputs(m, n, k, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
    w = (torch.randn(n, k, device="cuda", generator=gen) / math.sqrt(k)).to(torch.bfloat16)
    return x, w


def _load(build_dir, name):
    folder = build_dir / "sm_90a" / name
    if not folder.is_dir():
        pytest.fail(f"{folder} not built: run python -m tests.gpu.build")
    return pipelink.load(folder)


@pytest.fixture(scope="module")
def gemm(build_dir):
    return _load(build_dir, "gemm")


LIVE_CALLS = 48


def test_many_live_tensors_move_the_packed_launch(gemm):
    """Many live (input, output) address sets of one layout, queued back to back: each
    call moves the layout's one packed launch to its tensors (TMA descriptors re-pointed
    in place). Every result must be its own product: a stale address, or a move that
    reached an already queued launch, would write into another call's output or read
    another call's input. Then the same with out= and a shared input."""
    calls = [_gemm_inputs(384, 768, 320, 100 + i) for i in range(LIVE_CALLS)]
    outs = [gemm(x, w) for x, w in calls]
    for i, ((x, w), y) in enumerate(zip(calls, outs, strict=True)):
        _close(y, x.float() @ w.float().t(), f"call {i}")
    w = calls[0][1]
    given = [torch.full((384, 768), float("nan"), device="cuda", dtype=torch.bfloat16)
             for _ in calls]
    for (x, _), out in zip(calls, given, strict=True):
        gemm(x, w, out=out)
    for i, ((x, _), out) in enumerate(zip(calls, given, strict=True)):
        _close(out, x.float() @ w.float().t(), f"out= call {i}")


def test_launches_on_the_current_stream(gemm):
    """Inputs rewritten on a side stream just before the call: the op must see them."""
    x, w = _gemm_inputs(512, 1024, 512, 1)
    fresh, _ = _gemm_inputs(512, 1024, 512, 2)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    for _ in range(3):
        with torch.cuda.stream(side):
            torch.cuda._sleep(SLEEP_CYCLES)
            x.copy_(fresh)
            y = gemm(x, w)
        side.synchronize()
        _close(y, fresh.float() @ w.float().t(), "current stream")


def test_explicit_stream(gemm):
    x, w = _gemm_inputs(256, 512, 256, 3)
    fresh, _ = _gemm_inputs(256, 512, 256, 4)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP_CYCLES)
        x.copy_(fresh)
    y = gemm(x, w, stream=side)
    side.synchronize()
    _close(y, fresh.float() @ w.float().t(), "stream=")


def test_cuda_graph_capture_and_replay(gemm):
    x, w = _gemm_inputs(384, 768, 320, 5)
    gemm(x, w)                                   # warm: load, plan, encode outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = gemm(x, w)
    for seed in (6, 7):
        nx, nw = _gemm_inputs(384, 768, 320, seed)
        x.copy_(nx)
        w.copy_(nw)
        y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _close(y, nx.float() @ nw.float().t(), f"graph replay {seed}")


def test_cuda_graph_captures_counter_zeroing(build_dir):
    """pipeline_demo's global hand-off counters are zeroed inside the graph, per replay."""
    op = _load(build_dir, "pipeline_demo")
    m, k = 8 * ROWS, 4 * 64
    x = torch.randn(m, k, device="cuda")
    y = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    op(x, y)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = op(x, y)
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        y.copy_(torch.randn_like(y.float()).to(torch.bfloat16))
        for t in outs:
            t.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for got, want in zip(outs, demo_reference(x, y), strict=True):
            torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-3)


def test_concurrent_streams_use_their_own_workspace(build_dir):
    op = _load(build_dir, "pipeline_demo")
    m, k = 32 * ROWS, 8 * 64
    streams = [torch.cuda.Stream() for _ in range(4)]
    inputs = [(torch.randn(m, k, device="cuda"),
               torch.randn(m, k, device="cuda").to(torch.bfloat16)) for _ in streams]
    torch.cuda.synchronize()
    results = []
    for _ in range(5):
        for s, (x, y) in zip(streams, inputs, strict=True):
            with torch.cuda.stream(s):
                results.append(((x, y), op(x, y)))
    torch.cuda.synchronize()
    for (x, y), outs in results:
        for got, want in zip(outs, demo_reference(x, y), strict=True):
            torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-3)


def test_torch_compile_fullgraph(gemm):
    x, w = _gemm_inputs(640, 1024, 512, 8)
    torch._dynamo.reset()
    compiled = torch.compile(lambda a, b: gemm(a, b) * 2, fullgraph=True)
    got = compiled(x, w)
    torch.testing.assert_close(got, gemm(x, w) * 2, rtol=0, atol=0)
    _close(got, 2 * (x.float() @ w.float().t()), "compiled")
    x2, w2 = _gemm_inputs(384, 512, 256, 9)       # a new shape recompiles, still exact
    torch.testing.assert_close(compiled(x2, w2), gemm(x2, w2) * 2, rtol=0, atol=0)


@pytest.mark.parametrize("m,n,k", [(256, 512, 384), (200, 1008, 136)])
def test_autograd_matches_pytorch(build_dir, m, n, k):
    linear = _load(build_dir, "linear")
    x, w = _gemm_inputs(m, n, k, m + n)
    x.requires_grad_(True)
    w.requires_grad_(True)
    y = linear(x, w)
    grad = torch.randn_like(y.float()).to(torch.bfloat16)
    y.backward(grad)
    xr, wr = x.detach().float().requires_grad_(True), w.detach().float().requires_grad_(True)
    yr = xr @ wr.t()
    yr.backward(grad.float())
    _close(y.detach(), yr.detach(), "forward")
    # gradients reduce over N or M: scale the tolerance with that length
    torch.testing.assert_close(x.grad.float(), xr.grad, rtol=2e-2, atol=3e-2 * math.sqrt(n / 64))
    torch.testing.assert_close(w.grad.float(), wr.grad, rtol=2e-2, atol=3e-2 * math.sqrt(m / 64))


def test_autograd_under_compile(build_dir):
    linear = _load(build_dir, "linear")
    x, w = _gemm_inputs(256, 512, 256, 11)
    torch._dynamo.reset()

    def loss_fn(a, b):
        return (linear(a, b).float() ** 2).sum()

    compiled = torch.compile(loss_fn, fullgraph=True)
    grads = []
    for fn in (loss_fn, compiled):
        a, b = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
        fn(a, b).backward()
        grads.append((a.grad, b.grad))
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=0)


@pytest.fixture(scope="module")
def bias_gelu(build_dir):
    return _load(build_dir, "gemm_bias_gelu")


def _bias_inputs(m=256, n=512, k=256):
    x, w = _gemm_inputs(m, n, k, 12)
    bias = torch.randn(n, device="cuda").to(torch.bfloat16)
    return x, w, bias


BAD_CALLS = {
    "non-contiguous bias": (lambda x, w, b: ((x, w, torch.randn(2 * b.numel(), device="cuda")
                                             .to(torch.bfloat16)[::2]), {}),
                            "has strides [2] for shape [512]"),
    "misaligned bias": (lambda x, w, b: ((x, w, torch.cat([b[:1], b])[1:]), {}),
                        "2 bytes past a 16-byte boundary"),
    "out of the wrong shape": (lambda x, w, b: ((x, w, b), {"out": torch.empty(
        128, 512, device="cuda", dtype=torch.bfloat16)}), "out 'c' is bf16 [128, 512]"),
    "out of the wrong dtype": (lambda x, w, b: ((x, w, b), {"out": torch.empty(
        256, 512, device="cuda")}), "out 'c' is f32 [256, 512]"),
    "out overlapping an input": (lambda x, w, b: ((x, w, b), {"out": w.view(256, 512)}),
                                 "does not compute in place"),
    "wrong dtype": (lambda x, w, b: ((x.float(), w, b), {}), "input 'a' is f32"),
    "mismatched K": (lambda x, w, b: ((x, w[:, :128].contiguous(), b), {}),
                     "input 'b' has shape [512, 128], expected [512, 256]"),
    "CPU tensor": (lambda x, w, b: ((x, w, b.cpu()), {}), "is on the CPU"),
    "non-contiguous rows": (lambda x, w, b: ((x.t().contiguous().t(), w, b), {}),
                            "innermost dimension has stride 256"),
    "too few inputs": (lambda x, w, b: ((x, w), {}), "takes 3 inputs (a, b, bias), got 2"),
}


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_bad_arguments_are_refused(bias_gelu, case):
    make, needle = BAD_CALLS[case]
    args, kw = make(*_bias_inputs())
    with pytest.raises(RuntimeLaunchError) as err:
        bias_gelu(*args, **kw)
    assert needle in str(err.value), str(err.value)
    torch.cuda.synchronize()                      # no sticky CUDA error behind it


def test_context_healthy_after_refusals(bias_gelu):
    x, w, b = _bias_inputs()
    out = torch.full((256, 512), float("nan"), device="cuda", dtype=torch.bfloat16)
    y = bias_gelu(x, w, b, out=out)
    torch.cuda.synchronize()
    ref = torch.nn.functional.gelu(x.float() @ w.float().t() + b.float(), approximate="tanh")
    _close(y, ref, "bias_gelu after refusals")


def test_cached_out_calls_are_still_checked(bias_gelu):
    """out= calls of a known layout take the cached path: each must still write its own
    tensor, and an overlapping or misaligned out= of that same layout must be refused."""
    x, w, b = _bias_inputs()
    outs = [torch.full((256, 512), float("nan"), device="cuda", dtype=torch.bfloat16)
            for _ in range(3)]
    for seed, out in zip((21, 22, 23), outs, strict=True):
        x.copy_(_gemm_inputs(256, 512, 256, seed)[0])
        y = bias_gelu(x, w, b, out=out)
        assert y.data_ptr() == out.data_ptr()
        torch.cuda.synchronize()
        ref = torch.nn.functional.gelu(x.float() @ w.float().t() + b.float(),
                                       approximate="tanh")
        _close(out, ref, f"out= call {seed}")
    with pytest.raises(RuntimeLaunchError, match="does not compute in place"):
        bias_gelu(x, w, b, out=w.view(256, 512))
    storage = torch.empty(256 * 512 + 8, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(RuntimeLaunchError, match="byte boundary"):
        bias_gelu(x, w, b, out=storage[1:1 + 256 * 512].view(256, 512))
    torch.cuda.synchronize()


def test_prepared_call(gemm):
    x, w = _gemm_inputs(256, 512, 256, 13)
    prepared = gemm.prepare(x, w)
    for seed in (14, 15):
        nx, nw = _gemm_inputs(256, 512, 256, seed)
        x.copy_(nx)
        w.copy_(nw)
        y = prepared()
        torch.cuda.synchronize()
        _close(y, nx.float() @ nw.float().t(), "prepared")


def test_corrupted_cubin_is_refused(build_dir, tmp_path):
    folder = tmp_path / "gemm"
    shutil.copytree(build_dir / "sm_90a" / "gemm", folder)
    cubin = folder / "gemm.cubin"
    data = bytearray(cubin.read_bytes())
    data[len(data) // 2] ^= 0x01
    cubin.write_bytes(bytes(data))
    with pytest.raises(RuntimeLaunchError, match="does not match kernel.json"):
        pipelink.load(folder)
