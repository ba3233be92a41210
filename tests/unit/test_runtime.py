"""The runtime without a GPU: every wrong argument is a clear error, shapes follow the
launch section (also symbolically), and the custom op traces under torch.compile."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys

import pytest

from pipelink.errors import RuntimeLaunchError
from pipelink.runtime import LinkedKernel, encode_tensormap, read_kernel_folder, tensor_info
from pipelink.runtime.spec import LaunchSpec, evaluate
from pipelink.runtime.tensors import TensorInfo, is_dense, merge_leading, overlaps, tma_view

FIELDS = [
    {"name": "load_src", "instance": "load", "arg": "src", "type": "tensormap",
     "offset": 0, "size": 128, "dtype": "bf16", "box": [64, 128], "swizzle": 128},
    {"name": "store_out", "instance": "store", "arg": "out", "type": "ptr", "offset": 128,
     "size": 8, "dtype": "f32"},
    {"name": "load_k_tiles", "instance": "load", "arg": "k_tiles", "type": "u32",
     "offset": 136, "size": 4},
    {"name": "workspace", "instance": None, "arg": "workspace", "type": "ptr",
     "offset": 144, "size": 8}]
META = {
    "recipe": "demo", "entry": "pl_demo", "block": [128, 1, 1], "dynamic_smem": 1024,
    "cubin_sha256": "0" * 64, "workspace": {"bytes": 0, "counters": []},
    "params": {"bytes": 192, "fields": FIELDS},
    "launch": {"inputs": [{"name": "x", "dtype": "bf16", "shape": ["M", "K"]}],
               "outputs": [{"name": "sums", "dtype": "f32", "shape": ["M", "K // 64"]}],
               "grid": ["ceil_div(M, 128)"],
               "bind": {"load.src": "x", "store.out": "sums", "load.k_tiles": "K // 64"}},
}


class FakeTensor:
    """Just enough of __cuda_array_interface__ to describe a device array."""

    def __init__(self, shape, typestr="<f4", ptr=0x10000, strides=None):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr,
                                         "data": (ptr, False), "strides": strides,
                                         "version": 3}


def kernel() -> LinkedKernel:
    return LinkedKernel.from_meta(META)


CASES = [
    ({"load.src": FakeTensor((4, 4)), "store.out": FakeTensor((4,)), "load.k_tiles": 1,
      "load.k_tile": 2}, ["unknown argument(s) ['load.k_tile']", "arguments: load.k_tiles"]),
    ({"store.out": FakeTensor((4,)), "load.k_tiles": 1}, ["missing argument(s) ['load.src']"]),
    ({"load.src": FakeTensor((256, 64), "<f2"), "store.out": FakeTensor((4,)),
      "load.k_tiles": 1}, ["'load.src' is f16, the kernel takes bf16"]),
    ({"load.src": object(), "store.out": FakeTensor((4,)), "load.k_tiles": 1},
     ["'load.src' is not a GPU tensor"]),
    ({"load.src": FakeTensor((4, 4), "<f4"), "store.out": FakeTensor((4,), "<i4"),
      "load.k_tiles": 1}, ["'load.src' is f32, the kernel takes bf16"]),
    ({"load.src": FakeTensor((4, 4)), "store.out": FakeTensor((4,)), "load.k_tiles": 1,
      "store.out ": 0}, ["unknown argument(s) ['store.out ']"]),
]


@pytest.mark.parametrize("args,needles", CASES)
def test_pack_refuses(args, needles):
    with pytest.raises(RuntimeLaunchError) as err:
        kernel().pack(args)
    for needle in needles:
        assert needle in str(err.value)


@pytest.mark.parametrize("value,needle", [
    (FakeTensor((8, 4), strides=(32, 8)), "has strides [8, 2] for shape [8, 4]"),
    (FakeTensor((8, 4), strides=(4, 32)), "dense row-major"),
    (FakeTensor((8, 4), ptr=0x10004), "4 bytes past a 16-byte boundary"),
])
def test_pointer_arguments_must_be_dense_and_aligned(value, needle):
    k = kernel()
    with pytest.raises(RuntimeLaunchError, match=re.escape(needle)):
        k._field(k.fields["store_out"], "store.out", value)


def test_pointer_alignment_follows_the_contract():
    meta = json.loads(json.dumps(META))
    meta["params"]["fields"][1]["align"] = 4
    k = LinkedKernel.from_meta(meta)
    assert k._field(k.fields["store_out"], "store.out", FakeTensor((8,), ptr=0x10004))


class OtherDeviceTensor:
    """Just enough of a PyTorch tensor on a device that is neither CUDA nor the CPU."""

    def __init__(self, device):
        import torch
        self.dtype, self.device, self.is_cuda = torch.bfloat16, torch.device(device), False
        self.shape = (256, 64)

    def data_ptr(self):
        return 0

    def stride(self):
        return (64, 1)


def _on(device):
    import torch
    return lambda: torch.empty(256, 64, dtype=torch.bfloat16, device=device)


@pytest.mark.parametrize("make,needles", [
    # A meta tensor has a shape and no data: it traces through the op, it cannot launch.
    (_on("meta"), ["argument 'load.src' of kernel 'demo' is a meta tensor (a shape with no "
                   "data)", "hint: pass CUDA tensors; meta tensors are for tracing through "
                   "the op"]),
    (_on("cpu"), ["argument 'load.src' of kernel 'demo' is on the CPU", "hint: move it to "
                  "the GPU (.cuda())"]),
    (lambda: OtherDeviceTensor("xpu:1"), ["argument 'load.src' of kernel 'demo' is on device "
                                          "'xpu:1'", "hint: move it to the GPU (.cuda())"]),
], ids=["meta", "cpu", "xpu"])
def test_a_tensor_off_the_gpu_is_refused_naming_its_device(make, needles):
    """A raw launch (no op in front to send meta tensors to the dispatcher) says where
    the tensor is; it used to call every one of them a CPU tensor."""
    with pytest.raises(RuntimeLaunchError) as err:
        kernel().pack({"load.src": make(), "store.out": FakeTensor((4,)), "load.k_tiles": 1})
    for needle in needles:
        assert needle in str(err.value), str(err.value)


@pytest.mark.parametrize("value,needle", [(-1, "'load.k_tiles' (u32)"),
                                          (2 ** 32, "'load.k_tiles' (u32)"),
                                          ("4", "'load.k_tiles' (u32) takes an integer, got '4'")])
def test_scalars_are_range_checked(value, needle):
    k = kernel()
    with pytest.raises(RuntimeLaunchError, match=re.escape(needle)):
        k._field(k.fields["load_k_tiles"], "load.k_tiles", value)


@pytest.mark.parametrize("info,needle", [
    (tensor_info(FakeTensor((128, 64), "<f2", ptr=0x10008), "x"), "past a 16-byte boundary"),
    (tensor_info(FakeTensor((128, 60), "<f2"), "x"), "not a multiple of 16"),
    # Leading dimensions merge only where contiguous: here batch 0 and 1 have a gap.
    (tensor_info(FakeTensor((4, 128, 64), "<f2", strides=(2 * 128 * 128, 128, 2)), "x"),
     "leading dimensions merged"),
    (tensor_info(FakeTensor((128, 64), "<f2", strides=(2, 256)), "x"),
     "innermost dimension has stride 128"),
])
def test_tensor_maps_refuse_bad_layouts(info, needle):
    with pytest.raises(RuntimeLaunchError, match=needle):
        encode_tensormap(info, [64, 128], 128, "x")


@pytest.mark.parametrize("shape,strides,view", [
    ((256, 64), (64, 1), ((1, 256, 64), (256 * 64, 64, 1))),     # a matrix as one group
    ((8, 256, 64), (256 * 64, 64, 1), ((8, 256, 64), (256 * 64, 64, 1))),
    ((0, 64), (64, 1), ((1, 0, 64), (64, 64, 1))),   # empty: still a 16-byte pitch
])
def test_tensor_map_view_adds_leading_unit_dimensions(shape, strides, view):
    assert tma_view(shape, strides, 3) == view


def test_tensor_map_merges_contiguous_leading_dimensions():
    """Attention's [B, S, H, D] read by a 3-D map over [B*S, H, D]."""
    shape, strides = (2, 1000, 16, 128), (1000 * 16 * 128, 16 * 128, 128, 1)
    assert merge_leading(shape, strides, 3, "q") == ((2000, 16, 128), (16 * 128, 128, 1))
    assert merge_leading(shape, strides, 4, "q") == (shape, strides)


@pytest.mark.parametrize("a,b,expected", [
    ((0x1000, (4, 4), (4, 1)), (0x1000 + 64, (4,), (1,)), False),   # adjacent
    ((0x1000, (4, 4), (4, 1)), (0x1000 + 60, (4,), (1,)), True),    # last element shared
    ((0x1000, (4, 4), (8, 1)), (0x1000 + 32, (2,), (1,)), True),    # inside a strided span
    ((0x1000, (0, 4), (4, 1)), (0x1000, (4,), (1,)), False),        # empty
])
def test_overlap_of_spans(a, b, expected):
    ta = TensorInfo(a[0], a[1], a[2], "f32", True)
    tb = TensorInfo(b[0], b[1], b[2], "f32", True)
    assert overlaps(ta, tb) is expected and overlaps(tb, ta) is expected


@pytest.mark.parametrize("shape,strides,dense", [((4, 4), (4, 1), True), ((4, 4), (8, 1), False),
                                                 ((1, 4), (99, 1), True), ((4, 1), (1, 7), True),
                                                 ((4, 4), (1, 4), False)])
def test_dense(shape, strides, dense):
    assert is_dense(TensorInfo(0, shape, strides, "f32", True)) is dense


def test_launch_spec_sizes_and_outputs():
    spec = LaunchSpec.from_meta(META)
    sizes = spec.sizes({"x": (300, 256)}, {"x": "bf16"}, {"num_sms": 132})
    assert spec.output_shapes(sizes) == {"sums": [300, 4]}
    assert spec.grid_for(sizes, 132) == [3]
    assert spec.scalars(sizes) == {"load.k_tiles": 4}
    assert [f["name"] for f in spec.fields_of["x"]] == ["load_src"]


@pytest.mark.parametrize("shapes,dtypes,needle", [
    ({"x": (300,)}, {"x": "bf16"}, "input 'x' has 1 dimensions [300], expected 2"),
    ({"x": (300, 256)}, {"x": "f16"}, "input 'x' is f16, expected bf16"),
])
def test_launch_spec_refuses(shapes, dtypes, needle):
    with pytest.raises(RuntimeLaunchError, match=re.escape(needle)):
        LaunchSpec.from_meta(META).sizes(shapes, dtypes)


def test_shared_sizes_must_agree():
    meta = json.loads(json.dumps(META))
    meta["launch"]["inputs"].append({"name": "w", "dtype": "bf16", "shape": ["N", "K"]})
    with pytest.raises(RuntimeLaunchError, match=re.escape("input 'w' has shape [64, 128], "
                                                           "expected [64, 256]")):
        LaunchSpec.from_meta(meta).sizes({"x": (8, 256), "w": (64, 128)},
                                         {"x": "bf16", "w": "bf16"})


@pytest.mark.parametrize("text,sizes,value", [("ceil_div(M, 128)", {"M": 129}, 2),
                                              ("N // 2", {"N": 10}, 5),
                                              ("max(M, 8, 3)", {"M": 4}, 8),
                                              ("align_up(M, 16)", {"M": 17}, 32)])
def test_evaluate(text, sizes, value):
    assert evaluate(text, sizes, "k") == value


@pytest.mark.parametrize("text", ["ceil_div(M, N)", "align_up(M, N)", "M % N"])
def test_evaluate_refuses_a_size_that_divides_by_zero(text):
    with pytest.raises(RuntimeLaunchError, match=re.escape(f"launch.bind.k: division by "
                                                           f"zero in {text!r}")):
        evaluate(text, {"M": 8, "N": 0}, "bind.k")


@pytest.mark.parametrize("text", ["pow2_ceil(M)", "ceil_div(M)", "M if M == 1 else 2"])
def test_evaluate_refuses_what_the_checker_refuses(text):
    with pytest.raises(RuntimeLaunchError, match="kernel.json launch.grid"):
        evaluate(text, {"M": 8}, "grid")


def test_evaluate_names_unknown_sizes():
    with pytest.raises(RuntimeLaunchError, match="names 'Mm', which no input dimension"):
        evaluate("Mm // 128", {"M": 1}, "grid")


def test_loading_without_a_cuda_driver_says_so(tmp_path, monkeypatch):
    """cuda.bindings raises a bare RuntimeError when libcuda cannot be loaded; a load on
    a machine without the driver is one RuntimeLaunchError instead."""
    pytest.importorskip("cuda.bindings")
    from cuda.bindings import driver as drv

    from pipelink.runtime import driver

    def no_library(flags: int) -> None:
        raise RuntimeError("Failed to dlopen libcuda.so.1")
    cubin = b"\x7fELF not really a cubin"
    (tmp_path / "kernel.json").write_text(json.dumps(
        dict(META, cubin_sha256=hashlib.sha256(cubin).hexdigest())))
    (tmp_path / "demo.cubin").write_bytes(cubin)
    monkeypatch.setattr(drv, "cuInit", no_library)
    driver.driver.cache_clear()
    try:
        with pytest.raises(RuntimeLaunchError, match="no CUDA driver here: Failed to dlopen"):
            LinkedKernel(tmp_path)
    finally:
        driver.driver.cache_clear()


@pytest.mark.parametrize(("edit", "needle"), [
    (lambda m: m.pop("entry"), "key 'entry' is missing, expected str"),
    (lambda m: m.update(dynamic_smem="1024"), "key 'dynamic_smem' is str '1024', expected int"),
    (lambda m: m.update(dynamic_smem=True), "key 'dynamic_smem' is bool True, expected int"),
    (lambda m: m["params"].update(fields={}), "key 'params.fields' is dict {}, expected list"),
    (lambda m: m["params"]["fields"][0].pop("offset"),
     "key 'params.fields[0].offset' is missing, expected int"),
    (lambda m: m["launch"].update(bind=[]), "key 'launch.bind' is list [], expected dict"),
    (lambda m: m["launch"]["inputs"][0].pop("shape"),
     "key 'launch.inputs[0].shape' is missing, expected list"),
    (lambda m: m.clear() or m.update(recipe=["demo"]), "key 'recipe' is list"),
])
def test_a_hand_edited_kernel_json_is_refused_naming_the_key(tmp_path, edit, needle):
    cubin = b"\x7fELF not really a cubin"
    meta = json.loads(json.dumps(dict(META, cubin_sha256=hashlib.sha256(cubin).hexdigest())))
    edit(meta)
    (tmp_path / "kernel.json").write_text(json.dumps(meta))
    (tmp_path / "demo.cubin").write_bytes(cubin)
    with pytest.raises(RuntimeLaunchError, match=re.escape(needle)) as info:
        read_kernel_folder(tmp_path)
    assert str(tmp_path / "kernel.json") in str(info.value) and "rebuild" in str(info.value)


def test_a_kernel_json_that_is_not_a_mapping_is_refused(tmp_path):
    (tmp_path / "kernel.json").write_text("[1, 2]")
    with pytest.raises(RuntimeLaunchError, match="key '<top>' is list"):
        read_kernel_folder(tmp_path)


# kernels.json as the link step writes it for a linear layer's three kernels.
INDEX = {"format": 1, "recipe": "lin", "arch": "sm_90a",
         "kernels": {"forward": "forward", "dgrad": "dgrad", "wgrad": "wgrad"},
         "autograd": {"forward": "forward", "grads": {
             "x": {"kernel": "dgrad", "inputs": ["grad.y", "w.T"], "output": "dx"},
             "w": {"kernel": "wgrad", "inputs": ["grad.y.T", "x.T"], "output": "dw"}}},
         "dispatch": [{"kernel": "forward", "when": ["M <= 512"]}, {"kernel": "forward"}]}


@pytest.mark.parametrize(("edit", "needle"), [
    (lambda d: d.pop("kernels"), "key 'kernels' is missing, expected dict"),
    (lambda d: d.update(kernels=["forward"]), "key 'kernels' is list ['forward'], expected dict"),
    (lambda d: d.update(kernels={}), "key 'kernels' lists no kernel"),
    (lambda d: d["kernels"].update(dgrad=3), "key 'kernels.dgrad' is int 3, expected str"),
    (lambda d: d.update(autograd="forward"), "key 'autograd' is str 'forward', expected dict "
                                             "or null"),
    (lambda d: d["autograd"].pop("forward"), "key 'autograd.forward' is missing, expected str"),
    (lambda d: d["autograd"]["grads"]["x"].pop("kernel"),
     "key 'autograd.grads.x.kernel' is missing, expected str"),
    (lambda d: d["autograd"]["grads"]["w"].update(inputs="grad.y"),
     "key 'autograd.grads.w.inputs' is str 'grad.y', expected list"),
    (lambda d: d["autograd"]["grads"]["w"].update(inputs=["grad.y", None]),
     "key 'autograd.grads.w.inputs[1]' is NoneType None, expected str"),
    (lambda d: d["autograd"].update(launches=[{"kernel": "dgrad"}]),
     "key 'autograd.launches[0].inputs' is missing, expected list"),
    (lambda d: d["autograd"].update(returns="y"), "key 'autograd.returns' is str 'y'"),
    (lambda d: d.update(elsewhere={"dgrad": "sm_90a"}),
     "key 'elsewhere.dgrad' is str 'sm_90a', expected list"),
    (lambda d: d["dispatch"][0].pop("kernel"), "key 'dispatch[0].kernel' is missing"),
    (lambda d: d["dispatch"][0].update(when="M <= 512"),
     "key 'dispatch[0].when' is str 'M <= 512', expected list or null"),
    (lambda d: d.update(dispatch=[["forward"]]), "key 'dispatch[0]' is list ['forward'], "
                                                 "expected dict"),
    (lambda d: d.clear() or d.update(recipe=["lin"]), "key 'kernels' is missing"),
])
def test_a_hand_edited_kernels_json_is_refused_naming_the_key(tmp_path, edit, needle):
    """Before any kernel loads (no GPU here): a KeyError or TypeError while the set was
    built, before."""
    from pipelink.runtime import KernelSet
    index = json.loads(json.dumps(INDEX))
    edit(index)
    (tmp_path / "kernels.json").write_text(json.dumps(index))
    with pytest.raises(RuntimeLaunchError, match=re.escape(needle)) as info:
        KernelSet(tmp_path)
    assert str(info.value).startswith(f"{tmp_path / 'kernels.json'}: ")
    assert "instead of editing kernels.json" in str(info.value)


@pytest.mark.parametrize(("text", "needle"), [
    ("[1, 2]", "key '<top>' is list [1, 2], expected dict"),
    ('{"recipe": "lin", "kernels": {"forward": "forw', "not a built multi-kernel folder"),
])
def test_a_kernels_json_that_is_not_a_mapping_or_cut_short_is_refused(tmp_path, text, needle):
    from pipelink.runtime import KernelSet
    (tmp_path / "kernels.json").write_text(text)
    with pytest.raises(RuntimeLaunchError, match=re.escape(needle)) as info:
        KernelSet(tmp_path)
    assert str(tmp_path / "kernels.json") in str(info.value)


@pytest.mark.parametrize(("entry", "needle"), [
    ({"kernel": "short", "when": ["M <= pow2_ceil(N)"]},
     "kernels.json: dispatch[0].when[0]: contract function pow2_ceil() is not allowed"),
    ({"kernel": "short", "when": ["M"]}, "kernels.json: dispatch[0].when[0]: cannot read "
                                         "condition 'M'"),
    ({"kernel": "shrot", "when": ["M <= 4"]},
     "kernels.json: dispatch[0].kernel names kernel 'shrot', which mm does not have\n"
     "  hint: did you mean 'short'?"),
])
def test_a_dispatch_kernels_json_cannot_run_names_the_entry(tmp_path, entry, needle):
    from pipelink.runtime import KernelSet
    ks = object.__new__(KernelSet)
    ks.recipe, ks.folder, ks.kernels = "mm", tmp_path, {"short": None, "tall": None}
    with pytest.raises(RuntimeLaunchError, match=re.escape(f"{tmp_path}/{needle}")):
        ks._set_dispatch([entry, {"kernel": "tall"}])


def test_kernel_folder_sha256_is_verified(tmp_path):
    cubin = b"\x7fELF not really a cubin"
    meta = dict(META, cubin_sha256=hashlib.sha256(cubin).hexdigest())
    (tmp_path / "kernel.json").write_text(json.dumps(meta))
    (tmp_path / "demo.cubin").write_bytes(cubin)
    assert read_kernel_folder(tmp_path)[1] == cubin
    (tmp_path / "demo.cubin").write_bytes(cubin[:-1] + b"X")
    with pytest.raises(RuntimeLaunchError, match="does not match kernel.json"):
        read_kernel_folder(tmp_path)
    (tmp_path / "demo.cubin").unlink()
    with pytest.raises(RuntimeLaunchError, match="not a built kernel folder"):
        read_kernel_folder(tmp_path)


def test_runtime_imports_without_build_tools():
    """The GPU machine has cuda-python and PyTorch, not OR-Tools, SCons, YAML or jsonschema."""
    code = ("import sys\n"
            "for m in ('ortools', 'SCons', 'yaml', 'jsonschema'): sys.modules[m] = None\n"
            "import pipelink, pipelink.runtime\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_launch_require_refuses_sizes_the_objects_were_not_built_for():
    """launch.require: a condition on sizes every call must meet, checked before launch
    and named in the error with the sizes that break it."""
    from pipelink.runtime.spec import LaunchSpec
    meta = {"params": {"fields": []},
            "launch": {"inputs": [{"name": "w", "dtype": "bf16", "shape": ["E", "D"]}],
                       "require": ["E <= 64", "D % 8 == 0"]}}
    spec = LaunchSpec.from_meta(meta)
    assert spec.sizes({"w": (64, 136)}, {"w": "bf16"}) == {"E": 64, "D": 136}
    with pytest.raises(RuntimeLaunchError) as err:
        spec.sizes({"w": (65, 136)}, {"w": "bf16"})
    assert "requires E <= 64" in str(err.value) and "E = 65" in str(err.value)
    assert "launch.require[0]" in str(err.value)
    with pytest.raises(RuntimeLaunchError) as err:
        spec.sizes({"w": (8, 100)}, {"w": "bf16"})
    assert "D % 8 == 0" in str(err.value) and "D = 100" in str(err.value)
