"""Loading and launching linked kernels with the CUDA driver API (cuda.bindings).

Needs nothing but cuda-python at run time: no nvrtc, no extension build, no ortools
or SCons. :class:`LinkedKernel` launches with explicit arguments named
``instance.arg``; :func:`load` wraps a kernel folder as a PyTorch-friendly callable
driven by the recipe's ``launch:`` section::

    op = pipelink.load("build/dev/sm_90a/gemm_swiglu")
    y = op(x, w)

Tensors are anything with ``data_ptr()`` (PyTorch) or ``__cuda_array_interface__``.
Every argument is checked against kernel.json (name, dtype, shape, alignment,
device) before a launch; a wrong one is a :class:`RuntimeLaunchError`.
"""

from __future__ import annotations

import ctypes
import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import expr
from .errors import PipeLinkError, RuntimeLaunchError

TMA_ALIGN = 16                 # bytes: TMA global addresses and strides
_TORCH_DTYPES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "int32": "i32",
                 "uint8": "u8", "int8": "i8", "float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}
_TYPESTR = {"<f4": "f32", "<f2": "f16", "<i4": "i32", "|u1": "u8", "|i1": "i8", "<u4": "u32"}
LAUNCH_CACHE = 16              # packed launches kept per op
_SCALAR = {"u32": "<I", "i32": "<i", "u64": "<Q", "f32": "<f"}


def _driver():
    from cuda.bindings import driver
    return driver


def _ok(result: Any, what: str) -> Any:
    """Unwraps a cuda.bindings (err, value...) tuple, raising on error."""
    drv = _driver()
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != drv.CUresult.CUDA_SUCCESS:
        _, name = drv.cuGetErrorName(err)
        raise RuntimeLaunchError(f"{what} failed: {name.decode() if name else err}")
    return rest[0] if len(rest) == 1 else (tuple(rest) if rest else None)


@dataclass(frozen=True)
class TensorInfo:
    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]        # elements
    dtype: str
    on_gpu: bool

    @property
    def itemsize(self) -> int:
        return expr.DTYPE_BYTES[self.dtype]


def tensor_info(obj: Any, name: str) -> TensorInfo:
    """What a launch needs of a tensor, from PyTorch or __cuda_array_interface__."""
    if hasattr(obj, "data_ptr") and hasattr(obj, "dtype"):
        dtype = _TORCH_DTYPES.get(str(obj.dtype).removeprefix("torch."))
        if dtype is None:
            raise RuntimeLaunchError(f"argument '{name}': unsupported dtype {obj.dtype}")
        return TensorInfo(obj.data_ptr(), tuple(obj.shape), tuple(obj.stride()), dtype,
                          getattr(obj, "is_cuda", False))
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is None:
        raise RuntimeLaunchError(f"argument '{name}' is not a GPU tensor "
                                 f"({type(obj).__name__})",
                                 hint="pass a CUDA tensor (PyTorch, CuPy, or any object with "
                                      "__cuda_array_interface__)")
    dtype = _TYPESTR.get(cai["typestr"])
    if dtype is None:
        raise RuntimeLaunchError(f"argument '{name}': unsupported typestr {cai['typestr']}")
    shape = tuple(cai["shape"])
    size = expr.DTYPE_BYTES[dtype]
    strides = (tuple(s // size for s in cai["strides"]) if cai.get("strides")
               else _contiguous(shape))
    return TensorInfo(cai["data"][0], shape, strides, dtype, True)


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, step = [], 1
    for dim in reversed(shape):
        out.append(step)
        step *= dim
    return tuple(reversed(out))


def encode_tensormap(info: TensorInfo, box: list[int], swizzle: int, name: str) -> bytes:
    """A 2-D (or N-D) tiled TMA descriptor over a row-major tensor; box inner-first."""
    drv = _driver()
    rank = len(info.shape)
    if rank != len(box):
        raise RuntimeLaunchError(f"argument '{name}': a {len(box)}-D tile map needs a "
                                 f"{len(box)}-D tensor, got shape {list(info.shape)}")
    if info.strides[-1] != 1:
        raise RuntimeLaunchError(f"argument '{name}': innermost dimension must be contiguous",
                                 hint="call .contiguous() first")
    if info.ptr % TMA_ALIGN:
        raise RuntimeLaunchError(f"argument '{name}': address not {TMA_ALIGN}-byte aligned")
    strides = [s * info.itemsize for s in reversed(info.strides[:-1])]
    if any(s % TMA_ALIGN for s in strides):
        raise RuntimeLaunchError(f"argument '{name}': row pitch {strides} bytes is not a "
                                 f"multiple of {TMA_ALIGN}",
                                 hint="pad the inner dimension")
    dtypes = {"f32": "CU_TENSOR_MAP_DATA_TYPE_FLOAT32", "bf16": "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16",
              "f16": "CU_TENSOR_MAP_DATA_TYPE_FLOAT16", "u8": "CU_TENSOR_MAP_DATA_TYPE_UINT8",
              "i32": "CU_TENSOR_MAP_DATA_TYPE_INT32", "e4m3": "CU_TENSOR_MAP_DATA_TYPE_UINT8",
              "e5m2": "CU_TENSOR_MAP_DATA_TYPE_UINT8"}
    swizzles = {0: "CU_TENSOR_MAP_SWIZZLE_NONE", 32: "CU_TENSOR_MAP_SWIZZLE_32B",
                64: "CU_TENSOR_MAP_SWIZZLE_64B", 128: "CU_TENSOR_MAP_SWIZZLE_128B"}
    tmap = _ok(drv.cuTensorMapEncodeTiled(
        getattr(drv.CUtensorMapDataType, dtypes[info.dtype]), rank, info.ptr,
        [drv.cuuint64_t(d) for d in reversed(info.shape)],
        [drv.cuuint64_t(s) for s in strides], [drv.cuuint32_t(b) for b in box],
        [drv.cuuint32_t(1)] * rank,
        drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        getattr(drv.CUtensorMapSwizzle, swizzles[swizzle]),
        drv.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
        f"cuTensorMapEncodeTiled for '{name}'")
    return ctypes.string_at(tmap.getPtr(), 128)


class LinkedKernel:
    """A linked cubin plus its kernel.json, loaded into the current CUDA context."""

    def __init__(self, folder: Path | str) -> None:
        folder = Path(folder)
        try:
            self.meta = json.loads((folder / "kernel.json").read_text())
            cubin = (folder / f"{self.meta['recipe']}.cubin").read_bytes()
        except (OSError, ValueError, KeyError) as exc:
            raise RuntimeLaunchError(f"not a built kernel folder: {exc}", where=str(folder),
                                     hint="build it with scons or 'pipelink link'") from None
        drv = _driver()
        _ok(drv.cuInit(0), "cuInit")
        if int(_ok(drv.cuCtxGetCurrent(), "cuCtxGetCurrent") or 0) == 0:
            device = _ok(drv.cuDeviceGet(0), "cuDeviceGet")
            ctx = _ok(drv.cuDevicePrimaryCtxRetain(device), "cuDevicePrimaryCtxRetain")
            _ok(drv.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        self._cubin = cubin  # the driver keeps a pointer until the module loads
        self.module = _ok(drv.cuModuleLoadData(cubin), "cuModuleLoadData")
        self.function = _ok(drv.cuModuleGetFunction(self.module, self.meta["entry"].encode()),
                            "cuModuleGetFunction")
        _ok(drv.cuFuncSetAttribute(
            self.function,
            drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            self.meta["dynamic_smem"]), "raising the dynamic shared-memory limit")
        self.fields = {f["name"]: f for f in self.meta["params"]["fields"]}
        self._workspace = None

    @property
    def args(self) -> list[str]:
        return [f"{f['instance']}.{f['arg']}" for f in self.meta["params"]["fields"]
                if f["instance"] is not None]

    def pack(self, args: dict[str, Any]) -> bytes:
        """The parameter block, each field checked against kernel.json."""
        wanted = set(self.args)
        unknown = sorted(set(args) - wanted)
        if unknown:
            raise RuntimeLaunchError(f"unknown argument(s) {unknown} for kernel "
                                     f"'{self.meta['recipe']}'",
                                     hint="arguments: " + ", ".join(sorted(wanted)))
        missing = sorted(wanted - set(args))
        if missing:
            raise RuntimeLaunchError(f"missing argument(s) {missing} for kernel "
                                     f"'{self.meta['recipe']}'")
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
        info = tensor_info(value, name)
        if not info.on_gpu:
            raise RuntimeLaunchError(f"argument '{name}' is on the CPU",
                                     hint="move it to the GPU (.cuda())")
        if f.get("dtype") and info.dtype != f["dtype"]:
            raise RuntimeLaunchError(f"argument '{name}' is {info.dtype}, the kernel takes "
                                     f"{f['dtype']}", hint=f"convert it to {f['dtype']}")
        if f["type"] == "tensormap":
            return encode_tensormap(info, f["box"], f.get("swizzle", 0), name)
        return struct.pack("<Q", info.ptr)

    def workspace_pointer(self) -> int:
        """The global hand-off workspace (allocated on first use, kept with the kernel)."""
        size = self.meta["workspace"]["bytes"]
        if size == 0:
            return 0
        if self._workspace is None:
            self._workspace = _ok(_driver().cuMemAlloc(size), "allocating the workspace")
        return int(self._workspace)

    def zero_counters(self, stream: int) -> None:
        drv = _driver()
        for offset, nbytes in self.meta["workspace"]["counters"]:
            _ok(drv.cuMemsetD8Async(self.workspace_pointer() + offset, 0, nbytes, stream),
                "zeroing hand-off counters")

    def prepare(self, grid: tuple[int, ...] | list[int], args: dict[str, Any],
                stream: int = 0) -> Launch:
        """Checks and packs the arguments once; the result launches with no more work
        than cuLaunchKernel (and zeroing hand-off counters, if the kernel has any)."""
        block = bytearray(self.pack(args))
        grid = (list(grid) + [1, 1])[:3]
        if min(grid) < 1:
            raise RuntimeLaunchError(f"empty grid {grid}")
        ws = self.workspace_pointer()
        offset = self.fields["workspace"]["offset"]
        block[offset:offset + 8] = struct.pack("<Q", ws)
        return Launch(self, tuple(grid), bytes(block), stream)

    def launch(self, grid: tuple[int, ...] | list[int], args: dict[str, Any],
               stream: int = 0) -> None:
        self.prepare(grid, args, stream)()

    def __del__(self) -> None:
        try:
            if self._workspace is not None:
                _driver().cuMemFree(self._workspace)
        except Exception:  # interpreter shutdown: the context may be gone already
            pass


class Launch:
    """One kernel with its parameter block packed: calling it launches."""

    def __init__(self, kernel: LinkedKernel, grid: tuple[int, ...], block: bytes,
                 stream: int) -> None:
        self.kernel, self.grid, self.stream = kernel, grid, stream
        self._buffer = ctypes.create_string_buffer(block, len(block))
        self._params = (ctypes.c_void_p * 1)(ctypes.addressof(self._buffer))
        self._address = ctypes.addressof(self._params)

    def __call__(self) -> None:
        k = self.kernel
        if k.meta["workspace"]["counters"]:
            k.zero_counters(self.stream)
        bx, by, bz = k.meta["block"]
        _ok(_driver().cuLaunchKernel(k.function, *self.grid, bx, by, bz, k.meta["dynamic_smem"],
                                     self.stream, self._address, 0), "cuLaunchKernel")


class Op:
    """A built kernel as a callable: ``op(*inputs) -> outputs`` per the recipe's launch."""

    def __init__(self, folder: Path | str) -> None:
        self.kernel = LinkedKernel(folder)
        self.spec = self.kernel.meta.get("launch") or {}
        if not self.spec.get("inputs"):
            raise RuntimeLaunchError("the recipe states no host-side launch (launch.inputs)",
                                     where=str(folder),
                                     hint="use LinkedKernel.launch with explicit arguments")
        self._tensor_names = {s["name"] for s in self.spec["inputs"]} | {
            s["name"] for s in self.spec.get("outputs", [])}
        self._plans: dict[tuple, dict[str, Any]] = {}
        # Packed launches by tensor addresses and layouts: a repeated call re-encodes no
        # tensor map and re-checks no argument.
        self._launches: dict[tuple, Launch] = {}

    def sizes(self, inputs: dict[str, Any]) -> dict[str, int]:
        sizes: dict[str, int] = {"num_sms": _num_sms()}
        for spec in self.spec["inputs"]:
            name = spec["name"]
            info = tensor_info(inputs[name], name)
            if len(info.shape) != len(spec["shape"]):
                raise RuntimeLaunchError(f"input '{name}' has shape {list(info.shape)}, "
                                         f"expected {spec['shape']}")
            if info.dtype != spec["dtype"]:
                raise RuntimeLaunchError(f"input '{name}' is {info.dtype}, expected "
                                         f"{spec['dtype']}")
            for dim, want in zip(info.shape, spec["shape"], strict=True):
                if isinstance(want, str) and want.isidentifier() and want not in sizes:
                    sizes[want] = dim
        for spec in self.spec["inputs"]:
            name = spec["name"]
            actual = list(tensor_info(inputs[name], name).shape)
            wanted = [self._eval(d, sizes, f"inputs.{name}") for d in spec["shape"]]
            if actual != wanted:
                raise RuntimeLaunchError(f"input '{name}' has shape {actual}, expected {wanted} "
                                         f"from {spec['shape']}")
        return sizes

    def _eval(self, value: Any, sizes: dict[str, int], key: str) -> int:
        try:
            return expr.evaluate(value, sizes, where=f"kernel.json launch.{key}")
        except PipeLinkError as exc:
            raise RuntimeLaunchError(exc.message, where=exc.where, hint=exc.hint) from None

    def plan(self, tensors: dict[str, Any]) -> dict[str, Any]:
        """Sizes, output shapes, grid and scalar arguments for these input shapes
        (cached: the expressions are evaluated once per shape)."""
        key = tuple((n, tuple(getattr(t, "shape", ())), str(getattr(t, "dtype", "")))
                    for n, t in tensors.items())
        if key not in self._plans:
            sizes = self.sizes(tensors)
            self._plans[key] = {
                "outputs": {o["name"]: ([self._eval(d, sizes, f"outputs.{o['name']}")
                                         for d in o["shape"]], o["dtype"])
                            for o in self.spec.get("outputs", [])},
                "grid": ([sizes["num_sms"]] if self.spec.get("persistent")
                         else [self._eval(g, sizes, "grid") for g in self.spec.get("grid", [1])]),
                "scalars": {k: self._eval(v, sizes, f"bind.{k}")
                            for k, v in self.spec.get("bind", {}).items()
                            if not (isinstance(v, str) and v in self._tensor_names)},
            }
        return self._plans[key]

    def __call__(self, *args: Any, stream: int = 0, out: dict[str, Any] | None = None) -> Any:
        import torch
        names = [spec["name"] for spec in self.spec["inputs"]]
        if len(args) != len(names):
            raise RuntimeLaunchError(f"expected {len(names)} inputs ({', '.join(names)}), got "
                                     f"{len(args)}")
        tensors = dict(zip(names, args, strict=True))
        plan = self.plan(tensors)
        outputs = dict(out or {})
        for name, (shape, dtype) in plan["outputs"].items():
            if name not in outputs:
                outputs[name] = torch.empty(shape, dtype=_torch_dtype(dtype),
                                            device=args[0].device)
        values = {**tensors, **outputs}
        key = (stream, tuple((n, t.data_ptr(), tuple(t.shape), tuple(t.stride()), str(t.dtype))
                             for n, t in values.items()))
        launch = self._launches.get(key)
        if launch is None:
            bound = dict(plan["scalars"])
            for k, v in self.spec.get("bind", {}).items():
                if isinstance(v, str) and v in values:
                    bound[k] = values[v]
            launch = self.kernel.prepare(plan["grid"], bound, stream)
            if len(self._launches) >= LAUNCH_CACHE:
                self._launches.pop(next(iter(self._launches)))
            self._launches[key] = launch
        launch()
        result = [outputs[spec["name"]] for spec in self.spec.get("outputs", [])]
        return result[0] if len(result) == 1 else tuple(result)


def _torch_dtype(name: str) -> Any:
    import torch
    return {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16,
            "i32": torch.int32}[name]


def _num_sms() -> int:
    drv = _driver()
    device = _ok(drv.cuCtxGetDevice(), "cuCtxGetDevice")
    return _ok(drv.cuDeviceGetAttribute(
        drv.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device),
        "reading the SM count")


def load(folder: Path | str) -> Op:
    return Op(folder)
