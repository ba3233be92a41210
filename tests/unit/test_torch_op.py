"""Each loaded kernel is a torch.library custom op: its fake implementation derives output
shapes from the launch section, so torch.compile(fullgraph=True) traces a call with no
graph break (checked here on meta tensors, without a GPU)."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import torch

from pipelink.errors import RuntimeLaunchError
from pipelink.runtime import Op
from pipelink.runtime.op import MAX_PLANS
from pipelink.runtime.torch_ops import op_name, schema

ROOT = Path(__file__).resolve().parents[2]

META = {
    "recipe": "swiglu_demo", "kernel": None, "entry": "pl_demo", "block": [384, 1, 1],
    "dynamic_smem": 1024, "cubin_sha256": "ab" * 32,
    "workspace": {"bytes": 0, "counters": []},
    "params": {"bytes": 320, "fields": [
        {"name": "load_tma_a", "instance": "load", "arg": "tma_a", "type": "tensormap",
         "offset": 0, "size": 128, "dtype": "bf16", "box": [64, 128], "swizzle": 128},
        {"name": "load_tma_b", "instance": "load", "arg": "tma_b", "type": "tensormap",
         "offset": 128, "size": 128, "dtype": "bf16", "box": [64, 256], "swizzle": 128},
        {"name": "store_out", "instance": "store", "arg": "out", "type": "ptr",
         "offset": 256, "size": 8, "dtype": "bf16"},
        {"name": "workspace", "instance": None, "arg": "workspace", "type": "ptr",
         "offset": 264, "size": 8}]},
    "launch": {"persistent": True,
               "inputs": [{"name": "x", "dtype": "bf16", "shape": ["M", "K"]},
                          {"name": "w", "dtype": "bf16", "shape": ["N", "K"]}],
               "outputs": [{"name": "y", "dtype": "bf16", "shape": ["M", "N // 2"]}],
               "bind": {"load.tma_a": "x", "load.tma_b": "w", "store.out": "y"}},
}


@pytest.fixture(scope="module")
def op() -> Op:
    return Op.from_meta(META, num_sms=132)


def test_schema_and_name(op):
    assert op_name(META) == "swiglu_demo_main_abababababab"
    assert schema("n", op) == "n(Tensor x, Tensor w) -> Tensor"


def test_fake_shapes(op):
    x = torch.empty(300, 512, dtype=torch.bfloat16, device="meta")
    w = torch.empty(1024, 512, dtype=torch.bfloat16, device="meta")
    y = op(x, w)
    assert y.shape == (300, 512) and y.dtype == torch.bfloat16 and y.is_meta


def test_fake_refuses_mismatched_shapes(op):
    x = torch.empty(300, 512, dtype=torch.bfloat16, device="meta")
    w = torch.empty(1024, 256, dtype=torch.bfloat16, device="meta")
    with pytest.raises(RuntimeLaunchError, match=r"input 'w' has shape \[1024, 256\]"):
        op(x, w)


@pytest.mark.parametrize("dynamic", [False, True])
def test_compiles_without_graph_break(op, dynamic):
    torch._dynamo.reset()
    fn = torch.compile(lambda x, w: op(x, w) * 2, fullgraph=True, backend="eager",
                       dynamic=dynamic)
    for m in (256, 384):
        x = torch.empty(m, 512, dtype=torch.bfloat16, device="meta")
        w = torch.empty(1024, 512, dtype=torch.bfloat16, device="meta")
        assert fn(x, w).shape == (m, 512)


def test_same_cubin_registers_once():
    a = Op.from_meta(copy.deepcopy(META), num_sms=132)
    b = Op.from_meta(copy.deepcopy(META), num_sms=132)
    assert a.torch_op is b.torch_op


def test_host_sizes_reach_binds():
    """A bind may name the GPU's L2 size beside its SM count: both come from the host."""
    meta = copy.deepcopy(META)
    meta["launch"]["bind"]["load.k_tiles"] = "min(K // 64, l2_bytes // 2**20)"
    for l2, k_tiles in ((3 * 2**20, 3), (50 * 2**20, 8)):
        op = Op.from_meta(meta, num_sms=132, l2_bytes=l2)
        sizes = op.spec.sizes({"x": (300, 512), "w": (1024, 512)},
                              {"x": "bf16", "w": "bf16"}, op.host_sizes)
        assert op.spec.scalars(sizes) == {"load.k_tiles": k_tiles}


def _gemm_meta(kernel: str, a: str, b: str, out: str, shapes: tuple) -> dict:
    meta = copy.deepcopy(META)
    meta.update(recipe="lin", kernel=kernel, cubin_sha256=f"{kernel:x<64}")
    meta["launch"] = {"persistent": True,
                      "inputs": [{"name": a, "dtype": "bf16", "shape": list(shapes[0])},
                                 {"name": b, "dtype": "bf16", "shape": list(shapes[1])}],
                      "outputs": [{"name": out, "dtype": "bf16", "shape": list(shapes[2])}],
                      "bind": {"load.tma_a": a, "load.tma_b": b, "store.out": out}}
    return meta


def test_a_written_input_is_mutated_in_the_schema():
    meta = _gemm_meta("writer", "x", "w", "y", (["M", "K"], ["N", "K"], ["M", "N"]))
    meta["launch"]["inputs"][1]["writes"] = True
    assert schema("n", Op.from_meta(meta, 132)) == "n(Tensor x, Tensor(a1!) w) -> Tensor"


def test_an_op_that_writes_an_input_is_left_without_an_autograd_formula():
    """torch takes no autograd formula for an op whose schema mutates an input, so
    refusing backward passes over it: registering the refusal raised inside PyTorch."""
    from pipelink.runtime.torch_ops import refuse_backward
    meta = _gemm_meta("wrefused", "x", "w", "y", (["M", "K"], ["N", "K"], ["M", "N"]))
    meta["launch"]["inputs"][1]["writes"] = True
    refuse_backward(Op.from_meta(meta, 132))


def test_scratch_backward_runs_once_and_kept_outputs_are_not_differentiable():
    """A forward that keeps 'keep' for a gradient kernel that writes into it: the kept
    output takes no gradient (autograd builds no zeros for it), the backward releases
    it, and a second backward through the same graph is refused, naming the op."""
    from pipelink.runtime.kernelset import KernelSet, _register_backward
    forward = _gemm_meta("kforward", "x", "w", "y", (["M", "K"], ["N", "K"], ["M", "N"]))
    forward["launch"]["outputs"].append({"name": "keep", "dtype": "bf16", "shape": ["M", "K"]})
    dgrad = _gemm_meta("kdgrad", "dy", "k", "dx", (["M", "N"], ["M", "K"], ["M", "K"]))
    dgrad["launch"]["inputs"][1]["writes"] = True
    ks = object.__new__(KernelSet)
    ks.recipe, ks.folder = "klin", "."
    ks.kernels = {"forward": Op.from_meta(forward, 132), "dgrad": Op.from_meta(dgrad, 132)}
    ks.forward_op, ks._returns = ks.kernels["forward"], (0,)
    _register_backward(ks.forward_op, {
        "grads": {"x": {"kernel": "dgrad", "inputs": ["grad.y", "keep"]}},
        "scratch": ["keep"], "launches": [{"kernel": "dgrad", "inputs": ["grad.y", "keep"]}]},
        ks)
    x = torch.empty(64, 32, dtype=torch.bfloat16, device="meta", requires_grad=True)
    w = torch.empty(48, 32, dtype=torch.bfloat16, device="meta")
    y, keep = ks.forward_op(x, w)
    assert y.requires_grad and not keep.requires_grad
    y.sum().backward(retain_graph=True)
    assert x.grad.shape == x.shape
    assert keep.untyped_storage().nbytes() == 0          # released after its last reader
    with pytest.raises(RuntimeLaunchError, match="backward ran once already"):
        y.sum().backward()


def test_check_contents_set_on_a_kernel_set_reaches_every_kernel():
    """`ks.check_contents = False` (as docs/pytorch.md says) turns the value checks off
    in every kernel of the set; an attribute on the set alone would reach none."""
    from pipelink.runtime.kernelset import KernelSet
    ks = object.__new__(KernelSet)
    ks.kernels = {name: Op.from_meta(_gemm_meta(f"kc{name}", "x", "w", "y",
                                                (["M", "K"], ["N", "K"], ["M", "N"])), 132)
                  for name in ("forward", "backward")}
    assert ks.check_contents
    ks.check_contents = False
    assert not ks.check_contents
    assert not any(op.check_contents for op in ks.kernels.values())
    ks.kernels["backward"].check_contents = True
    assert not ks.check_contents          # true only where every kernel checks


def test_a_dispatching_set_runs_the_kernel_its_sizes_select():
    """dispatch: each call runs the first kernel whose conditions hold (M here), the
    choice follows the call's shapes, and a call the signature does not fit reaches the
    last kernel, whose checks name the mistake."""
    from pipelink.runtime.kernelset import KernelSet
    ks = object.__new__(KernelSet)
    ks.recipe, ks.folder = "mm", "."
    shapes = (["M", "K"], ["N", "K"], ["M", "N"])
    ks.kernels = {name: Op.from_meta(_gemm_meta(f"d{name}", "a", "b", "c", shapes), 132)
                  for name in ("short", "tall", "wide")}
    ks._set_dispatch([{"kernel": "short", "when": ["M <= 512"]},
                      {"kernel": "wide", "when": ["N >= 4 * K", "M <= 4096"]},
                      {"kernel": "tall"}])
    assert repr(ks) == ("<pipelink kernels mm: short when M <= 512, wide when N >= 4 * K and "
                        "M <= 4096, tall otherwise>")
    b = torch.empty(256, 64, dtype=torch.bfloat16, device="meta")
    for m, kernel in ((1, "short"), (512, "short"), (513, "wide"), (4097, "tall")):
        a = torch.empty(m, 64, dtype=torch.bfloat16, device="meta")
        assert ks.choose(a, b) is ks.kernels[kernel], (m, kernel)
        assert ks.choose(a=a, b=b) is ks.kernels[kernel]
        assert ks(a, b).shape == (m, 256)
    narrow = torch.empty(256, 512, dtype=torch.bfloat16, device="meta")
    a = torch.empty(1024, 512, dtype=torch.bfloat16, device="meta")
    assert ks.choose(a, narrow) is ks.kernels["tall"]          # N < 4 K: not wide
    vector = torch.empty(64, dtype=torch.bfloat16, device="meta")
    assert ks.choose(vector, b) is ks.kernels["tall"]
    with pytest.raises(RuntimeLaunchError, match="input 'a' has 1 dimensions"):
        ks(vector, b)
    for m in range(1, MAX_PLANS + 8):                # choices kept as plans are: bounded
        ks.choose(torch.empty(m, 64, dtype=torch.bfloat16, device="meta"), b)
    assert len(ks._chosen) == MAX_PLANS
    assert ks.choose(torch.empty(600, 64, dtype=torch.bfloat16, device="meta"),
                     b) is ks.kernels["wide"]


def _auto_kernel(m: int, n: int, sms: int, arch: str) -> str:
    """recipes/gemm_auto.yaml's rule, written out: whole waves of 128 x 168 tiles (21/32
    of a 128 x 256 tile's time, sm_90a only) or of 128 x 192 (24/32), where they beat each
    other and stream-K's share of 128 x 256 tiles plus a quarter; stream-K below M = 512
    otherwise, split-K above."""
    rows = -(-m // 128)
    waves168, waves192 = (-(-rows * -(-n // w) // sms) for w in (168, 192))
    stream = 32 * rows * -(-n // 256) + 8 * sms
    if m <= 512 and arch == "sm_90a" and 21 * waves168 < 24 * waves192 \
            and 21 * sms * waves168 < stream:
        return "narrow"
    if m <= 512 and 24 * sms * waves192 < stream:
        return "even"
    return "short" if m <= 128 else "mid" if m <= 512 else "tall"


@pytest.mark.parametrize("sms,arch,picks", [
    # An H100 SXM or H200: 168-wide tiles where N = 22016 (132 a tile row) or 37888 at
    # M = 128; 192-wide ones at N = 37888 above.
    (132, "sm_90a", {(128, 22016): "narrow", (256, 22016): "narrow", (512, 22016): "narrow",
                     (128, 37888): "narrow", (256, 37888): "even", (512, 37888): "even"}),
    # sm_100a builds no 168-wide kernel: its dispatch skips `narrow`.
    (132, "sm_100a", {(128, 22016): "even", (256, 22016): "even", (256, 37888): "even",
                      (512, 37888): "even"}),
    # 148 SMs (a B200): 230 or 396 tiles of 128 x 192 no longer make whole waves.
    (148, "sm_100a", {(128, 22016): "even", (256, 22016): "mid"}),
])
def test_gemm_auto_dispatches_by_the_gpus_sm_count_and_arch(sms, arch, picks):
    """recipes/gemm_auto.yaml's dispatch as kernels.json carries it for an arch (entries
    of kernels not built there dropped): the tile width whose waves come out whole on
    this GPU's SMs, stream-K below M = 512 otherwise, the split-K kernel above."""
    from pipelink.check import check_dispatch, dispatch_on
    from pipelink.recipe import load_recipe
    from pipelink.runtime.kernelset import KernelSet
    recipe = load_recipe(ROOT / "recipes" / "gemm_auto.yaml")
    ks = object.__new__(KernelSet)
    ks.recipe, ks.folder = "gemm_auto", "."
    shapes = (["M", "K"], ["N", "K"], ["M", "N"])
    ks.kernels = {name: Op.from_meta(_gemm_meta(f"auto{name}", "a", "b", "c", shapes), sms)
                  for name in recipe.select(None, arch)}
    ks._set_dispatch(dispatch_on(recipe, check_dispatch(recipe), arch))
    for n, k in ((22016, 4096), (28672, 4096), (57344, 8192), (37888, 3584)):
        b = torch.empty(n, k, dtype=torch.bfloat16, device="meta")
        for m in (128, 256, 512, 1024):
            a = torch.empty(m, k, dtype=torch.bfloat16, device="meta")
            want = _auto_kernel(m, n, sms, arch)
            assert want == picks.get((m, n), want), (sms, arch, m, n, want)
            assert ks.choose(a, b) is ks.kernels[want], (sms, arch, m, n, want)


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_dispatching_set_compiles_to_the_kernel_of_each_size(dynamic):
    """Under torch.compile(fullgraph=True) the conditions trace (guards on M), and each
    graph calls the kernel its sizes select."""
    from pipelink.runtime.kernelset import KernelSet
    ks = object.__new__(KernelSet)
    ks.recipe, ks.folder = "mm", "."
    shapes = (["M", "K"], ["N", "K"], ["M", "N"])
    ks.kernels = {name: Op.from_meta(_gemm_meta(f"c{name}", "a", "b", "c", shapes), 132)
                  for name in ("short", "tall")}
    ks._set_dispatch([{"kernel": "short", "when": ["ceil_div(M, 128) <= 4"]},
                      {"kernel": "tall"}])
    torch._dynamo.reset()
    graphs: list[list[str]] = []

    def backend(gm, example):  # noqa: ANN001, ANN202
        graphs.append([str(n.target) for n in gm.graph.nodes if "pipelink" in str(n.target)])
        return gm

    fn = torch.compile(lambda a, b: ks(a, b) * 2, fullgraph=True, backend=backend,
                       dynamic=dynamic)
    b = torch.empty(256, 64, dtype=torch.bfloat16, device="meta")
    for m, kernel in ((256, "short"), (300, "short"), (4096, "tall"), (8192, "tall")):
        runs = len(graphs)
        assert fn(torch.empty(m, 64, dtype=torch.bfloat16, device="meta"), b).shape == (m, 256)
        called = graphs[-1] if len(graphs) > runs else None
        if called is not None:
            assert len(called) == 1 and f"_c{kernel}_" in called[0], (m, called)
    assert any("_cshort_" in g[0] for g in graphs) and any("_ctall_" in g[0] for g in graphs)


def test_autograd_runs_the_gradient_kernels():
    """Forward and backward through the registered ops, on meta tensors: shapes of every
    gradient follow the gradient kernels' launch sections."""
    from pipelink.runtime.kernelset import KernelSet, _register_backward
    ks = object.__new__(KernelSet)
    ks.recipe, ks.folder = "lin", "."
    ks.kernels = {
        "forward": Op.from_meta(_gemm_meta("forward", "x", "w", "y",
                                           (["M", "K"], ["N", "K"], ["M", "N"])), 132),
        "dgrad": Op.from_meta(_gemm_meta("dgrad", "dy", "wt", "dx",
                                         (["M", "N"], ["K", "N"], ["M", "K"])), 132),
        "wgrad": Op.from_meta(_gemm_meta("wgrad", "dyt", "xt", "dw",
                                         (["N", "M"], ["K", "M"], ["N", "K"])), 132)}
    ks.forward_op, ks._returns = ks.kernels["forward"], None
    _register_backward(ks.forward_op, {"grads": {
        "x": {"kernel": "dgrad", "inputs": ["grad.y", "w.T"]},
        "w": {"kernel": "wgrad", "inputs": ["grad.y.T", "x.T"]}}}, ks)
    x = torch.empty(64, 32, dtype=torch.bfloat16, device="meta", requires_grad=True)
    w = torch.empty(48, 32, dtype=torch.bfloat16, device="meta", requires_grad=True)
    y = ks(x, w)
    assert y.shape == (64, 48) and y.requires_grad
    y.sum().backward()
    assert x.grad.shape == x.shape and w.grad.shape == w.shape


def test_every_dispatched_forward_runs_the_gradient_kernels():
    """dispatch: beside autograd: whichever forward kernel a call runs, its backward runs
    the recipe's gradient kernels; a dispatching set without gradients refuses backward,
    naming the op."""
    from pipelink.runtime.kernelset import KernelSet, _register_backward
    shapes = (["M", "K"], ["N", "K"], ["M", "N"])
    ks = object.__new__(KernelSet)
    ks.recipe, ks.folder = "dlin", "."
    ks.kernels = {
        "small": Op.from_meta(_gemm_meta("gsmall", "x", "w", "y", shapes), 132),
        "forward": Op.from_meta(_gemm_meta("gforward", "x", "w", "y", shapes), 132),
        "dgrad": Op.from_meta(_gemm_meta("gdgrad", "dy", "wt", "dx",
                                         (["M", "N"], ["K", "N"], ["M", "K"])), 132)}
    ks._set_dispatch([{"kernel": "small", "when": ["M <= 64"]}, {"kernel": "forward"}])
    ks.forward_op, ks._returns = ks.kernels["forward"], None
    for op in ks._dispatched():
        _register_backward(op, {"grads": {"x": {"kernel": "dgrad",
                                                "inputs": ["grad.y", "w.T"]}}}, ks)
    w = torch.empty(48, 32, dtype=torch.bfloat16, device="meta")
    for m in (64, 65):
        x = torch.empty(m, 32, dtype=torch.bfloat16, device="meta", requires_grad=True)
        y = ks(x, w)
        assert y.requires_grad
        y.sum().backward()
        assert x.grad.shape == x.shape

    forward_only = object.__new__(KernelSet)
    forward_only.recipe, forward_only.folder = "dmm", "."
    forward_only.kernels = {name: Op.from_meta(_gemm_meta(f"r{name}", "a", "b", "c", shapes),
                                               132) for name in ("short", "tall")}
    forward_only._set_dispatch([{"kernel": "short", "when": ["M <= 64"]}, {"kernel": "tall"}])
    from pipelink.runtime import torch_ops
    for op in forward_only._dispatched():
        torch_ops.refuse_backward(op)
    b = torch.empty(48, 32, dtype=torch.bfloat16, device="meta", requires_grad=True)
    for m in (64, 65):
        a = torch.empty(m, 32, dtype=torch.bfloat16, device="meta", requires_grad=True)
        with pytest.raises(RuntimeLaunchError, match="has no backward kernel"):
            forward_only(a, b).sum().backward()


# The op's keyword scalars (launch.scalars): sizes the caller picks, e.g. an MoE's top_k.
SCALAR_META = copy.deepcopy(META)
SCALAR_META.update(recipe="scalar_demo", cubin_sha256="cd" * 32)
SCALAR_META["launch"].update(scalars={"k": 2}, require=["k >= 1", "k <= 4"])
SCALAR_META["launch"]["outputs"][0]["shape"] = ["M * k", "N // 2"]


@pytest.fixture(scope="module")
def scalar_op() -> Op:
    return Op.from_meta(SCALAR_META, num_sms=132)


def _meta_xw(m: int = 300) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.empty(m, 512, dtype=torch.bfloat16, device="meta"),
            torch.empty(1024, 512, dtype=torch.bfloat16, device="meta"))


def test_scalars_are_keyword_ints_with_defaults(scalar_op):
    assert schema("n", scalar_op) == "n(Tensor x, Tensor w, int k=2) -> Tensor"
    assert scalar_op(*_meta_xw()).shape == (600, 512)
    assert scalar_op(*_meta_xw(), k=3).shape == (900, 512)


@pytest.mark.parametrize(("kw", "needle"), [
    ({"k": 0}, "requires k >= 1, but here k = 0"),
    ({"k": 5}, "requires k <= 4, but here k = 5"),
    ({"k": True}, "scalar 'k' takes an integer, got True"),
    ({"k": 2.0}, "scalar 'k' takes an integer, got 2.0"),
    ({"top_k": 2}, "unknown keyword argument(s) ['top_k']"),
])
def test_bad_scalars_are_refused(scalar_op, kw, needle):
    with pytest.raises(RuntimeLaunchError) as err:
        scalar_op(*_meta_xw(), **kw)
    assert needle in str(err.value), str(err.value)


def test_an_op_without_scalars_refuses_keywords(op):
    with pytest.raises(RuntimeLaunchError, match="takes tensors only"):
        op(*_meta_xw(), k=2)


def test_scalars_compile_without_graph_break(scalar_op):
    torch._dynamo.reset()
    fn = torch.compile(lambda x, w, k: scalar_op(x, w, k=k) + 1, fullgraph=True,
                       backend="eager")
    for k in (1, 3):
        assert fn(*_meta_xw(), k).shape == (300 * k, 512)


@pytest.mark.parametrize("s", [None, 1, 3])
def test_autograd_with_scalars(s):
    """A differentiable op with a keyword scalar: the backward answers for each argument
    the op was called with (the dispatcher drops a scalar left at its default)."""
    from pipelink.runtime.kernelset import KernelSet, _register_backward
    forward = _gemm_meta("sforward", "x", "w", "y", (["M", "K"], ["N", "K"], ["M", "N"]))
    forward["launch"].update(scalars={"s": 1}, require=["s >= 1"])
    ks = object.__new__(KernelSet)
    ks.recipe, ks.folder = "slin", "."
    ks.kernels = {
        "forward": Op.from_meta(forward, 132),
        "dgrad": Op.from_meta(_gemm_meta("sdgrad", "dy", "wt", "dx",
                                         (["M", "N"], ["K", "N"], ["M", "K"])), 132)}
    ks.forward_op, ks._returns = ks.kernels["forward"], None
    _register_backward(ks.forward_op,
                       {"grads": {"x": {"kernel": "dgrad", "inputs": ["grad.y", "w.T"]}}}, ks)
    x = torch.empty(64, 32, dtype=torch.bfloat16, device="meta", requires_grad=True)
    w = torch.empty(48, 32, dtype=torch.bfloat16, device="meta")
    y = ks(x, w) if s is None else ks(x, w, s=s)
    y.sum().backward()
    assert x.grad.shape == x.shape


def test_a_forward_only_op_refuses_backward():
    """pipelink.load gives a single-kernel op a backward that raises: without one,
    PyTorch would leave the inputs' gradients None and training would go on."""
    from pipelink.errors import PipeLinkError
    from pipelink.runtime.torch_ops import refuse_backward
    meta = copy.deepcopy(META)
    meta["cubin_sha256"] = "cd" * 32            # an op of its own
    op = Op.from_meta(meta, num_sms=132)
    refuse_backward(op)
    refuse_backward(op)                          # once is enough; twice is harmless
    x = torch.empty(256, 512, dtype=torch.bfloat16, device="meta", requires_grad=True)
    w = torch.empty(1024, 512, dtype=torch.bfloat16, device="meta")
    y = op(x, w)
    assert y.requires_grad
    with pytest.raises(PipeLinkError, match="has no backward kernel"):
        y.float().sum().backward()


def test_an_op_built_directly_refuses_backward_as_a_loaded_one():
    """Op(folder) (or Op.from_meta) without pipelink.load: the same refusal, naming the
    op, not PyTorch's warning and a gradient left None."""
    meta = copy.deepcopy(META)
    meta["cubin_sha256"] = "ef" * 32            # an op of its own
    op = Op.from_meta(meta, num_sms=132)
    x = torch.empty(256, 512, dtype=torch.bfloat16, device="meta", requires_grad=True)
    w = torch.empty(1024, 512, dtype=torch.bfloat16, device="meta")
    y = op(x, w)
    assert y.requires_grad
    with pytest.raises(RuntimeLaunchError, match="swiglu_demo has no backward kernel: it was "
                                                 "loaded as a forward-only op"):
        y.float().sum().backward()


@pytest.mark.parametrize("refused_first", [True, False])
def test_a_forward_loaded_alone_and_in_its_set_share_one_formula(refused_first):
    """One process may load a kernel folder alone (forward-only: refused) and its recipe
    whole (differentiable): torch takes one autograd formula per op, so the recipe's
    gradient kernels win, whichever was loaded first."""
    from pipelink.runtime.kernelset import KernelSet, _register_backward
    from pipelink.runtime.torch_ops import refuse_backward
    forward = _gemm_meta(f"tforward{int(refused_first)}", "x", "w", "y",
                         (["M", "K"], ["N", "K"], ["M", "N"]))
    ks = object.__new__(KernelSet)
    ks.recipe, ks.folder = "tlin", "."
    ks.kernels = {
        "forward": Op.from_meta(forward, 132),
        "dgrad": Op.from_meta(_gemm_meta(f"tdgrad{int(refused_first)}", "dy", "wt", "dx",
                                         (["M", "N"], ["K", "N"], ["M", "K"])), 132)}
    ks.forward_op, ks._returns = ks.kernels["forward"], None
    alone = Op.from_meta(forward, 132)
    if refused_first:
        refuse_backward(alone)
    _register_backward(ks.forward_op,
                       {"grads": {"x": {"kernel": "dgrad", "inputs": ["grad.y", "w.T"]}}}, ks)
    refuse_backward(alone)
    x = torch.empty(64, 32, dtype=torch.bfloat16, device="meta", requires_grad=True)
    w = torch.empty(48, 32, dtype=torch.bfloat16, device="meta")
    alone(x, w).sum().backward()
    assert x.grad.shape == x.shape


def test_gradients_built_for_another_arch_refuse_backward_naming_them():
    """kernels.json of an arch its gradient kernels are not built for (kernels.<k>.arch)
    lists them under elsewhere: the forward runs, and backpropagation through it is
    refused, naming the kernel, the archs it is built for and this one."""
    from pathlib import Path

    from pipelink.runtime.kernelset import KernelSet
    shapes = (["M", "K"], ["N", "K"], ["M", "N"])
    ks = object.__new__(KernelSet)
    ks._set_up(Path("attn"), {
        "recipe": "blin", "arch": "sm_100a",
        "kernels": {"forward": "forward"}, "elsewhere": {"dgrad": ["sm_90a"]},
        "autograd": {"forward": "forward", "returns": ["y"], "grads": {
            "x": {"kernel": "dgrad", "inputs": ["grad.y", "w.T"], "output": "dx"}}}},
        {"forward": Op.from_meta(_gemm_meta("belsewhere", "x", "w", "y", shapes), 132)})
    x = torch.empty(64, 32, dtype=torch.bfloat16, device="meta", requires_grad=True)
    w = torch.empty(48, 32, dtype=torch.bfloat16, device="meta")
    y = ks(x, w)
    assert y.shape == (64, 48) and y.requires_grad
    with pytest.raises(RuntimeLaunchError,
                       match="kernel 'dgrad' is built for sm_90a only, not for sm_100a"):
        y.sum().backward()
    # The forward kernel built again alone keeps the refusal that says why.
    alone = Op.from_meta(_gemm_meta("belsewhere", "x", "w", "y", shapes), 132)
    with pytest.raises(RuntimeLaunchError, match="kernel 'dgrad' is built for sm_90a only"):
        alone(x, w).sum().backward()


@pytest.mark.parametrize(("edit", "needle"), [
    (lambda a: a["grads"].update(z=a["grads"].pop("x")),
     "key 'autograd.grads.z': 'z' is not an input of kernel 'forward'"),
    (lambda a: a["grads"]["x"].update(output="dxx"),
     "key 'autograd.grads.x.output': 'dxx' is not an output of kernel 'dgrad'"),
    (lambda a: a["grads"]["x"].update(inputs=["grad.yy", "w.T"]),
     "key 'autograd.grads.x.inputs[0]': 'grad.yy' names no tensor of kernel 'forward'"),
    (lambda a: a.update(returns=["yy"]),
     "key 'autograd.returns[0]': 'yy' is not an output of kernel 'forward'"),
], ids=["grad_of_no_input", "no_such_output", "no_such_tensor", "returns_no_output"])
def test_kernels_json_naming_tensors_the_kernels_lack_is_refused(edit, needle, request):
    """An autograd section edited to name a tensor its kernels do not have: a ValueError
    while the set was built, or a KeyError at the first backward, before."""
    from pathlib import Path

    from pipelink.runtime.kernelset import KernelSet
    tag = request.node.callspec.id.replace("_", "")
    autograd = {"forward": "forward", "grads": {
        "x": {"kernel": "dgrad", "inputs": ["grad.y", "w.T"], "output": "dx"}}}
    edit(autograd)
    kernels = {"forward": _gemm_meta(f"hf{tag}", "x", "w", "y", (["M", "K"], ["N", "K"],
                                                                 ["M", "N"])),
               "dgrad": _gemm_meta(f"hd{tag}", "dy", "w", "dx", (["M", "N"], ["K", "N"],
                                                                 ["M", "K"]))}
    ks = object.__new__(KernelSet)
    with pytest.raises(RuntimeLaunchError, match=re.escape(needle)) as info:
        ks._set_up(Path("lin"), {"recipe": "lin", "kernels": {k: k for k in kernels},
                                 "autograd": autograd},
                   {k: Op.from_meta(m, 132) for k, m in kernels.items()})
    assert str(info.value).startswith(f"{Path('lin') / 'kernels.json'}: ")
    assert "did you mean" in str(info.value) or "known: " in str(info.value)


class _DeviceArray:
    """A device array by __cuda_array_interface__: what the checks before a launch read
    (nothing is launched without a GPU)."""

    def __init__(self, shape, strides=None, ptr=0x10000):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": "<f2", "data": (ptr, False),
                                         "strides": strides, "version": 3}


def _tma_out_op() -> Op:
    """f16 x @ w -> y, y written by a TMA store."""
    meta = _gemm_meta("tmastore", "x", "w", "y", (["M", "K"], ["N", "K"], ["M", "N"]))
    meta["cubin_sha256"] = "tmastore".ljust(64, "0")
    for spec in (*meta["launch"]["inputs"], *meta["launch"]["outputs"]):
        spec["dtype"] = "f16"
    meta["params"]["fields"][2] = {"name": "store_out", "instance": "store", "arg": "out",
                                   "type": "tensormap", "offset": 256, "size": 128,
                                   "dtype": "f16", "box": [64, 128], "swizzle": 128}
    return Op.from_meta(meta, num_sms=132)


@pytest.mark.parametrize("strides", [(0, 2), (16, 2)])     # expand()ed; rows overlapping
def test_an_out_whose_elements_share_memory_is_refused(strides):
    """Its row pitch suits a TMA store, but tiles would write the same addresses from
    different CTAs: the result would depend on their order."""
    op = _tma_out_op()
    x, w = _DeviceArray((256, 64)), _DeviceArray((128, 64), ptr=0x80000)
    dense = _DeviceArray((256, 128), ptr=0x100000)
    assert op._plan({"x": x, "w": w}, {"y": dense}, ())
    with pytest.raises(RuntimeLaunchError, match=r"out 'y' has strides .* share memory"):
        op._plan({"x": x, "w": w}, {"y": _DeviceArray((256, 128), strides, 0x100000)}, ())


def test_an_array_finds_the_plan_of_its_layout_not_of_its_identity():
    """Plans are keyed by layout: an array object that comes back with another shape (as
    a freed array's id comes back with the next one) gets its own plan and checks, not
    the plan its id had."""
    op = _tma_out_op()
    x, w = _DeviceArray((256, 64)), _DeviceArray((128, 64), ptr=0x80000)
    y = _DeviceArray((256, 128), ptr=0x100000)
    first = op._plan({"x": x, "w": w}, {"y": y}, ())
    assert op._plan({"x": _DeviceArray((256, 64)), "w": w}, {"y": y}, ()) is first
    x.__cuda_array_interface__ = _DeviceArray((512, 64)).__cuda_array_interface__
    with pytest.raises(RuntimeLaunchError, match=r"out 'y' is f16 \[256, 128\], the kernel "
                                                 r"writes f16 \[512, 128\]"):
        op._plan({"x": x, "w": w}, {"y": y}, ())


def test_an_op_keeps_a_bounded_number_of_plans_the_oldest_dropped_first():
    """One plan per layout: a model whose shapes change every batch would otherwise keep
    every plan it met. The oldest goes; its layout is planned again when it comes back."""
    op = _tma_out_op()
    w = _DeviceArray((128, 64), ptr=0x80000)

    def plan(rows: int):  # noqa: ANN202
        return op._plan({"x": _DeviceArray((rows, 64)), "w": w}, {}, ())

    first = plan(64)
    for rows in range(65, 64 + MAX_PLANS):
        plan(rows)
    assert len(op._plans) == MAX_PLANS and plan(64) is first
    plan(64 + MAX_PLANS)                        # one more layout: the oldest goes
    assert len(op._plans) == MAX_PLANS
    again = plan(64)
    assert again is not first and again.grid == first.grid


def test_a_misaligned_array_is_refused_by_its_address():
    """__cuda_array_interface__ arrays have no data_ptr(): the address checks read the
    interface's, and a tensor map's 16 bytes are asked of it as of a PyTorch tensor."""
    op = _tma_out_op()
    x, w = _DeviceArray((256, 64)), _DeviceArray((128, 64), ptr=0x80000)
    given = {"y": _DeviceArray((256, 128), ptr=0x100008)}
    plan = op._plan({"x": x, "w": w}, given, ())
    with pytest.raises(RuntimeLaunchError, match="8 bytes past a 16-byte boundary"):
        op._check_addresses(plan, {"x": x, "w": w}, given)


@pytest.mark.parametrize("inputs,needle", [
    # autograd would send these through the dispatcher, which has no CPU kernel
    (lambda: (torch.empty(300, 512, dtype=torch.bfloat16, requires_grad=True),
              torch.empty(1024, 512, dtype=torch.bfloat16)), "input 'x' is on the CPU"),
    (lambda: (torch.empty(300, 512, dtype=torch.bfloat16),
              torch.empty(1024, 512, dtype=torch.bfloat16, device="meta")),
     "input 'x' is on the CPU"),
    (lambda: (torch.empty(300, 512, dtype=torch.bfloat16, device="meta"), None),
     r"input 'w' is not a GPU tensor \(NoneType\)"),
    (lambda: (torch.empty(300, 512, dtype=torch.bfloat16, device="meta"),),
     r"takes 2 inputs \(x, w\), got 1"),
    # PyTorch's own errors from data_ptr() and .shape: "Cannot access data pointer of
    # Tensor that doesn't have storage", "NestedTensorImpl doesn't support sizes"
    (lambda: (torch.zeros(300, 512, dtype=torch.bfloat16).to_sparse(),
              torch.empty(1024, 512, dtype=torch.bfloat16, device="meta")),
     r"input 'x' is a sparse_coo tensor(.|\n)*hint: pass a dense tensor"),
    (lambda: (torch.nested.as_nested_tensor([torch.zeros(3, 512, dtype=torch.bfloat16)]),
              torch.empty(1024, 512, dtype=torch.bfloat16, device="meta")),
     r"input 'x' is a nested tensor(.|\n)*to_padded_tensor"),
])
@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning")
def test_calls_the_dispatcher_cannot_take_are_refused_naming_the_input(op, inputs, needle):
    """Not PyTorch's "Could not run ... with arguments from the 'CPU' backend" or a
    schema error: the same refusal as a call without autograd."""
    with pytest.raises(RuntimeLaunchError, match=needle):
        op(*inputs())


def test_refusals_name_the_op(op):
    """A model calls many ops: "input 'x' is f32" alone does not say which."""
    x = torch.empty(300, 512, dtype=torch.float32, device="meta")
    w = torch.empty(1024, 512, dtype=torch.bfloat16, device="meta")
    with pytest.raises(RuntimeLaunchError, match=r"^swiglu_demo: input 'x' is f32"):
        op(x, w)
    with pytest.raises(RuntimeLaunchError, match=r"^swiglu_demo: input 'x' is on the CPU"):
        op(torch.empty(300, 512, dtype=torch.bfloat16), w)


def test_a_meta_tensor_where_the_op_launches_is_refused_as_one(op):
    """prepare() (like out= or stream=) launches, so meta tensors cannot go to the
    dispatcher there: the refusal says they are meta tensors, not CPU ones."""
    x, w = _meta_xw()
    with pytest.raises(RuntimeLaunchError,
                       match=r"^swiglu_demo: input 'x' is a meta tensor \(a shape with no "
                             r"data\)(.|\n)*hint: pass CUDA tensors"):
        op.prepare(x, w)


@pytest.mark.parametrize("fullgraph", [False, True])
def test_a_compiled_call_with_the_wrong_inputs_is_refused_by_name(op, fullgraph):
    """Under torch.compile a call went straight to the registered op, whose schema
    refused a missing tensor in PyTorch's own words ("missing value for argument 'w'").
    Now the op refuses it while tracing: with graph breaks allowed the call then runs
    eagerly and gets the eager refusal; with fullgraph Dynamo's error carries it."""
    torch._dynamo.reset()
    fn = torch.compile(lambda x: op(x), fullgraph=fullgraph, backend="eager")
    x = torch.empty(256, 512, dtype=torch.bfloat16, device="meta")
    with pytest.raises(RuntimeLaunchError if not fullgraph else Exception,
                       match=r"swiglu_demo\S* takes 2 inputs \(x, w\), got 1") as info:
        fn(x)
    assert "missing value for argument" not in str(info.value)
