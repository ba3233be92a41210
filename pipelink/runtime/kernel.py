"""A linked cubin and its kernel.json: verified, loaded, and launched with explicit,
checked arguments named ``instance.arg``.

Nothing here needs PyTorch: :class:`LinkedKernel` takes any tensor with
``__cuda_array_interface__`` and a raw stream handle. :mod:`pipelink.runtime.op` builds
the PyTorch-facing callable on top of it.
"""

from __future__ import annotations

import ctypes
import hashlib
import itertools
import json
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import RuntimeLaunchError
from .driver import call, current_device, driver, make_current
from .tensors import (
    encode_tensormap,
    require_aligned,
    require_cuda,
    require_dense,
    tensor_info,
)

KERNEL_JSON = "kernel.json"
# What a `ptr` argument must be aligned to when its contract says nothing: the
# components read rows with 16-byte vector accesses.
DEFAULT_PTR_ALIGN = 16
_SCALAR = {"u32": "<I", "i32": "<i", "u64": "<Q", "f32": "<f"}
WORKSPACE_FIELD = "workspace"
LAUNCH_FIELD = "launch"
# Launch tokens (pl::KernelInfo::launch): a random 62-bit start, then one per launch, so
# a token is never 0 (what a consumed flag is reset to) and never what a fresh
# workspace happens to hold, in practice.
_TOKENS = itertools.count((int.from_bytes(os.urandom(8), "little") >> 2) | 1)


def read_kernel_folder(folder: Path) -> tuple[dict[str, Any], bytes]:
    """kernel.json and the cubin it names, the cubin's sha256 verified: a corrupted or
    swapped cubin is refused, never loaded."""
    try:
        meta = json.loads((folder / KERNEL_JSON).read_text())
        check_meta(meta, folder / KERNEL_JSON)
        cubin_name = meta.get("cubin") or f"{meta['recipe']}.cubin"
        cubin = (folder / cubin_name).read_bytes()
        expected = meta["cubin_sha256"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RuntimeLaunchError(f"not a built kernel folder: {exc}", where=str(folder),
                                 hint="build it with scons or 'pipelink link'") from None
    actual = hashlib.sha256(cubin).hexdigest()
    if actual != expected:
        raise RuntimeLaunchError(
            f"{cubin_name} does not match kernel.json (sha256 {actual[:16]}..., kernel.json "
            f"records {str(expected)[:16]}...): the file is corrupted or from another build",
            where=str(folder / cubin_name), hint="rebuild it (scons) or copy the folder again")
    return meta, cubin


# What the runtime reads of kernel.json, key -> type, "?" marking a key it may lack: a
# file edited by hand that breaks one is refused naming the key, not met as a KeyError
# while loading or launching.
_META = {"recipe": str, "entry": str, "cubin_sha256": str, "dynamic_smem": int,
         "block": list, "params": dict, "params.bytes": int, "params.fields": list,
         "workspace": dict, "workspace.bytes": int, "workspace.counters": list,
         "cluster?": list, "kernel?": str, "cubin?": str, "cooperative?": bool,
         "launch?": dict, "launch.inputs?": list, "launch.outputs?": list,
         "launch.bind?": dict, "launch.grid?": list, "launch.require?": list,
         "launch.scalars?": dict, "launch.contents?": dict}
MISSING = object()   # a key kernel.json (or kernels.json) lacks
_FIELD = {"name": str, "type": str, "offset": int, "size": int, "instance": (str, type(None))}
_TENSOR = {"name": str, "dtype": str, "shape": list}


def refused(where: Path, key: str, expected: Any, value: Any) -> RuntimeLaunchError:
    """The error for key ``key`` of the JSON file ``where`` (kernel.json, kernels.json)
    holding ``value`` (or :data:`MISSING`) where the runtime reads ``expected``."""
    names = " or ".join("null" if t is type(None) else t.__name__
                        for t in (expected if isinstance(expected, tuple) else (expected,)))
    got = "missing" if value is MISSING else f"{type(value).__name__} {value!r:.60}"
    return RuntimeLaunchError(f"key '{key}' is {got}, expected {names}", where=str(where),
                              hint="rebuild the folder (scons or pipelink link) instead "
                                   f"of editing {Path(where).name}")


def check_meta(meta: Any, where: Path) -> None:
    """kernel.json has every key the runtime reads, of the type it reads (the link step
    writes it so; this refuses a hand-edited or truncated one)."""
    def refuse(key: str, expected: Any, value: Any) -> RuntimeLaunchError:
        return refused(where, key, expected, value)

    def check(data: Any, key: str, types: Any, optional: bool = False) -> None:
        value = data
        for part in key.split("."):
            value = value.get(part, MISSING) if isinstance(value, dict) else MISSING
        if value is MISSING and optional:
            return
        if isinstance(value, bool) and types is int or not isinstance(value, types):
            raise refuse(key, types, value)

    if not isinstance(meta, dict):
        raise refuse("<top>", dict, meta)
    for key, types in _META.items():
        check(meta, key.rstrip("?"), types, key.endswith("?"))
    for i, f in enumerate(meta["params"]["fields"]):
        for key, types in _FIELD.items():
            if not isinstance(f, dict):
                raise refuse(f"params.fields[{i}]", dict, f)
            if not isinstance(f.get(key, MISSING), types):
                raise refuse(f"params.fields[{i}].{key}", types, f.get(key, MISSING))
    launch = meta.get("launch") or {}
    for group in ("inputs", "outputs"):
        for i, t in enumerate(launch.get(group, [])):
            for key, types in _TENSOR.items():
                value = t.get(key, MISSING) if isinstance(t, dict) else MISSING
                if not isinstance(value, types):
                    raise refuse(f"launch.{group}[{i}].{key}", types, value)



class LinkedKernel:
    """A linked cubin plus its kernel.json, loaded into the current device's context."""

    def __init__(self, folder: Path | str) -> None:
        self.folder = Path(folder)
        self.meta, cubin = read_kernel_folder(self.folder)
        drv = driver()
        self.device = current_device()
        self.context = call(drv.cuCtxGetCurrent(), "cuCtxGetCurrent")
        self._cubin = cubin  # the driver keeps a pointer until the module loads
        self.module = call(drv.cuModuleLoadData(cubin), f"loading {self.name}")
        self.function = call(drv.cuModuleGetFunction(self.module, self.meta["entry"].encode()),
                             "cuModuleGetFunction")
        call(drv.cuFuncSetAttribute(
            self.function,
            drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            self.meta["dynamic_smem"]), "raising the dynamic shared-memory limit")
        self._init_fields()

    def _init_fields(self) -> None:
        self.fields = {f["name"]: f for f in self.meta["params"]["fields"]}
        self.workspace_bytes = int(self.meta["workspace"]["bytes"])
        self.counters = [tuple(c) for c in self.meta["workspace"]["counters"]]

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> LinkedKernel:
        """The argument checks and packing alone, with no driver (for tests and tools)."""
        k = object.__new__(cls)
        k.folder, k.meta, k.device, k.context = Path("."), meta, None, None
        k._init_fields()
        return k

    @property
    def name(self) -> str:
        kernel = self.meta.get("kernel")
        return f"{self.meta['recipe']}.{kernel}" if kernel else self.meta["recipe"]

    @property
    def args(self) -> list[str]:
        return [f"{f['instance']}.{f['arg']}" for f in self.meta["params"]["fields"]
                if f["instance"] is not None]

    def pack(self, args: dict[str, Any]) -> bytes:
        """The parameter block, each argument checked against kernel.json."""
        wanted = set(self.args)
        unknown = sorted(set(args) - wanted)
        if unknown:
            raise RuntimeLaunchError(f"unknown argument(s) {unknown} for kernel '{self.name}'",
                                     hint="arguments: " + ", ".join(sorted(wanted)))
        missing = sorted(wanted - set(args))
        if missing:
            raise RuntimeLaunchError(f"missing argument(s) {missing} for kernel '{self.name}'")
        block = bytearray(self.meta["params"]["bytes"])
        for f in self.meta["params"]["fields"]:
            if f["instance"] is None:
                continue
            name = f"{f['instance']}.{f['arg']}"
            block[f["offset"]:f["offset"] + f["size"]] = self._field(f, name, args[name])
        return bytes(block)

    def _field(self, f: dict[str, Any], name: str, value: Any) -> bytes:
        if f["type"] in _SCALAR:
            if f["type"] != "f32" and (isinstance(value, bool) or not isinstance(value, int)):
                raise RuntimeLaunchError(f"argument '{name}' ({f['type']}) takes an integer, "
                                         f"got {value!r}")
            try:
                return struct.pack(_SCALAR[f["type"]], value)
            except struct.error as exc:
                raise RuntimeLaunchError(f"argument '{name}' ({f['type']}): {exc}") from None
        what = f"argument '{name}'"
        info = tensor_info(value, what)
        require_cuda(info, f"{what} of kernel '{self.name}'")
        if self.device is not None and info.device is not None and info.device != self.device:
            raise RuntimeLaunchError(f"argument '{name}' is on cuda:{info.device}, the kernel "
                                     f"was loaded on cuda:{self.device}",
                                     hint="load the kernel under torch.cuda.device(...) of "
                                          "the tensors, or move them")
        if f.get("dtype") and info.dtype != f["dtype"]:
            raise RuntimeLaunchError(f"argument '{name}' is {info.dtype}, the kernel takes "
                                     f"{f['dtype']}", hint=f"convert it to {f['dtype']}")
        if f["type"] == "tensormap":
            return encode_tensormap(info, f["box"], f.get("swizzle", 0), what)
        require_dense(info, what, f"'{f['instance']}.{f['arg']}'")
        require_aligned(info, f.get("align", DEFAULT_PTR_ALIGN), what)
        return struct.pack("<Q", info.ptr)

    def prepare(self, grid: tuple[int, ...] | list[int], args: dict[str, Any]) -> Launch:
        """Checks and packs the arguments once; the result launches with no more work
        than cuLaunchKernel (and zeroing hand-off counters, if the kernel has any)."""
        if self.context is not None:     # encoding tensor maps needs it
            make_current(self.context)
        grid = (list(grid) + [1, 1])[:3]
        if min(grid) < 1:
            raise RuntimeLaunchError(f"empty grid {grid} for kernel '{self.name}'")
        cluster = (list(self.meta.get("cluster") or [1, 1, 1]) + [1, 1])[:3]
        if any(g % c for g, c in zip(grid, cluster, strict=True)):
            raise RuntimeLaunchError(f"grid {grid} is not a whole number of {cluster} clusters "
                                     f"for kernel '{self.name}' (compiled with that cluster "
                                     "shape)", hint="round each grid dimension up to a "
                                                    "multiple of the cluster's")
        return Launch(self, tuple(grid), self.pack(args))

    def launch(self, grid: tuple[int, ...] | list[int], args: dict[str, Any],
               stream: int = 0) -> None:
        """One launch on ``stream`` (a raw CUstream handle; 0 is the legacy stream)."""
        self.prepare(grid, args)(stream)


class Launch:
    """One kernel with its parameter block packed: calling it launches on a stream.

    The global hand-off workspace is the caller's (one per call, so concurrent
    launches never share counters); without one, the launch allocates it stream-ordered
    (cuMemAllocAsync), so it is capturable in a CUDA graph.
    """

    def __init__(self, kernel: LinkedKernel, grid: tuple[int, ...], block: bytes) -> None:
        self.kernel, self.grid = kernel, grid
        self._buffer = ctypes.create_string_buffer(block, len(block))
        self._params = (ctypes.c_void_p * 1)(ctypes.addressof(self._buffer))
        self._address = ctypes.addressof(self._params)
        # Views of the two fields a launch rewrites (the workspace, the launch token).
        self._workspace = self._slot(WORKSPACE_FIELD)
        self._token = self._slot(LAUNCH_FIELD)
        self._shape = (*grid, *kernel.meta["block"], kernel.meta["dynamic_smem"])
        # A kernel whose CTAs wait for each other between phases launches cooperatively:
        # the driver refuses a grid that cannot be resident at once, rather than hang.
        cooperative = bool(kernel.meta.get("cooperative"))
        self._cu_launch = (driver().cuLaunchCooperativeKernel if cooperative
                           else driver().cuLaunchKernel)
        self._extra = () if cooperative else (0,)
        self._success = driver().CUresult.CUDA_SUCCESS
        self._context = kernel.context
        self._handle = None if kernel.context is None else int(kernel.context)

    def _slot(self, field: str) -> ctypes.c_uint64 | None:
        f = self.kernel.fields.get(field)
        if f is None:
            return None
        return ctypes.c_uint64.from_address(ctypes.addressof(self._buffer) + f["offset"])

    def __call__(self, stream: int = 0, workspace: int | None = None) -> None:
        k = self.kernel
        if not k.workspace_bytes:
            self.fire(stream)
            return
        make_current(self._context, self._handle)
        drv = driver()
        owned = None
        if workspace is None:
            owned = call(drv.cuMemAllocAsync(k.workspace_bytes, stream), "allocating the workspace")
            workspace = int(owned)
        self._workspace.value = workspace
        if self._token is not None:
            self._token.value = next(_TOKENS)
        for offset, nbytes in k.counters:
            call(drv.cuMemsetD8Async(workspace + offset, 0, nbytes, stream),
                 "zeroing hand-off counters")
        self._launch(stream)
        if owned is not None:
            call(drv.cuMemFreeAsync(owned, stream), "freeing the workspace")

    def mover(self, name: str) -> Callable[[int], None]:
        """A setter that points field ``name`` of this launch at another tensor of the
        same shape, strides and dtype (which the caller has checked), in place. A TMA
        descriptor keeps its encoding and takes the new address
        (cuTensorMapReplaceAddress), far cheaper than encoding it again. The driver
        copies the parameter block at each launch, so moving a field never touches
        launches already queued or captured."""
        f = self.kernel.fields[name]
        address = ctypes.addressof(self._buffer) + f["offset"]
        if f["type"] != "tensormap":
            slot = ctypes.c_uint64.from_address(address)

            def move_pointer(value: int) -> None:
                slot.value = value
            return move_pointer
        drv = driver()
        descriptor = drv.CUtensorMap(_ptr=address)
        replace = drv.cuTensorMapReplaceAddress
        success = drv.CUresult.CUDA_SUCCESS

        def move_descriptor(value: int) -> None:
            err, = replace(descriptor, value)
            if err != success:
                call((err,), f"moving {name}'s tensor map")
        return move_descriptor

    def fire(self, stream: int) -> None:
        """Launches with no workspace handling (for kernels without hand-off counters)."""
        # cuda.bindings' own call measured faster than a ctypes one on the H200 host
        # (6.0 vs 7.4 us, bench/overhead.py), so the launch stays there.
        make_current(self._context, self._handle)
        self._launch(stream)

    def _launch(self, stream: int) -> None:
        """cuLaunchKernel itself, the kernel's context already current."""
        err, = self._cu_launch(self.kernel.function, *self._shape, stream, self._address,
                               *self._extra)
        if err != self._success:
            call((err,), f"launching {self.kernel.name}")

