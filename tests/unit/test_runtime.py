"""The runtime's argument checks, without a GPU: every wrong argument is a clear error."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from pipelink.errors import RuntimeLaunchError
from pipelink.runtime import LinkedKernel, encode_tensormap, tensor_info

META = {
    "recipe": "demo", "entry": "pl_demo", "block": [128, 1, 1], "dynamic_smem": 1024,
    "workspace": {"bytes": 0, "counters": []},
    "params": {"bytes": 192, "fields": [
        {"name": "load_src", "instance": "load", "arg": "src", "type": "tensormap",
         "offset": 0, "size": 128, "dtype": "bf16", "box": [64, 128], "swizzle": 128},
        {"name": "store_out", "instance": "store", "arg": "out", "type": "ptr", "offset": 128,
         "size": 8, "dtype": "f32"},
        {"name": "load_k_tiles", "instance": "load", "arg": "k_tiles", "type": "u32",
         "offset": 136, "size": 4},
        {"name": "workspace", "instance": None, "arg": "workspace", "type": "ptr",
         "offset": 144, "size": 8}]},
}


class FakeTensor:
    """Just enough of __cuda_array_interface__ to describe a device array."""

    def __init__(self, shape, typestr="<f4", ptr=0x10000, strides=None):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr,
                                         "data": (ptr, False), "strides": strides,
                                         "version": 3}


def kernel() -> LinkedKernel:
    k = object.__new__(LinkedKernel)   # no driver: only the checks run
    k.meta = META
    k.fields = {f["name"]: f for f in META["params"]["fields"]}
    k._workspace = None
    return k


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


@pytest.mark.parametrize("value,needle", [(-1, "'load.k_tiles' (u32)"),
                                          (2 ** 32, "'load.k_tiles' (u32)"),
                                          ("4", "'load.k_tiles' (u32) takes an integer, got '4'")])
def test_scalars_are_range_checked(value, needle):
    k = kernel()
    field = k.fields["load_k_tiles"]
    with pytest.raises(RuntimeLaunchError, match=re.escape(needle)):
        k._field(field, "load.k_tiles", value)


@pytest.mark.parametrize("info,needle", [
    (tensor_info(FakeTensor((128, 64), "<f2", ptr=0x10008), "x"), "not 16-byte aligned"),
    (tensor_info(FakeTensor((128, 60), "<f2"), "x"), "not a multiple of 16"),
    (tensor_info(FakeTensor((128,), "<f2"), "x"), "needs a 2-D tensor"),
    (tensor_info(FakeTensor((128, 64), "<f2", strides=(2, 256)), "x"),
     "innermost dimension must be contiguous"),
])
def test_tensor_maps_refuse_bad_layouts(info, needle):
    with pytest.raises(RuntimeLaunchError, match=needle):
        encode_tensormap(info, [64, 128], 128, "x")


def test_runtime_imports_without_build_tools():
    """The GPU machine has cuda-python and PyTorch, not OR-Tools, SCons, YAML or jsonschema."""
    code = ("import sys\n"
            "for m in ('ortools', 'SCons', 'yaml', 'jsonschema'): sys.modules[m] = None\n"
            "import pipelink, pipelink.runtime\n")
    subprocess.run([sys.executable, "-c", code], check=True)
