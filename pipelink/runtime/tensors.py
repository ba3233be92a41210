"""Tensors as a launch sees them: address, shape, strides, dtype, and the checks each
argument kind needs (dense rows, alignment, TMA pitch, overlap) before it reaches a kernel.

A tensor is anything with ``data_ptr()`` (PyTorch) or ``__cuda_array_interface__``.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

from .. import expr
from ..errors import RuntimeLaunchError
from .driver import call, driver

TMA_ALIGN = 16                 # bytes: TMA global addresses and row pitches
TMA_DESCRIPTOR_BYTES = 128     # sizeof(CUtensorMap)
TORCH_DTYPES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "int32": "i32",
                "uint8": "u8", "int8": "i8", "float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}
_TYPESTR = {"<f4": "f32", "<f2": "f16", "<i4": "i32", "|u1": "u8", "|i1": "i8", "<u4": "u32"}
_TMA_DTYPES = {"f32": "FLOAT32", "bf16": "BFLOAT16", "f16": "FLOAT16", "u8": "UINT8",
               "i32": "INT32", "e4m3": "UINT8", "e5m2": "UINT8"}
_SWIZZLES = {0: "NONE", 32: "32B", 64: "64B", 128: "128B"}



def torch_name(dtype: str) -> str:
    """PyTorch's spelling of a contract dtype ("i32" -> "torch.int32"), for hints."""
    names = {ours: f"torch.{theirs}" for theirs, ours in TORCH_DTYPES.items()}
    return names.get(dtype, dtype)

@dataclass(frozen=True)
class TensorInfo:
    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]        # elements
    dtype: str
    on_gpu: bool
    device: int | None = None       # the device's ordinal, where known
    device_type: str | None = None  # "cuda", "cpu", "meta", ... (torch.device.type), where known

    @property
    def itemsize(self) -> int:
        return expr.DTYPE_BYTES[self.dtype]

    @property
    def nbytes_spanned(self) -> int:
        """Bytes from the first element to one past the last (0 for an empty tensor)."""
        if any(d == 0 for d in self.shape):
            return 0
        return self.itemsize * (1 + sum((d - 1) * abs(s)
                                        for d, s in zip(self.shape, self.strides, strict=True)))


def tensor_info(obj: Any, what: str, expected: str | None = None) -> TensorInfo:
    """What a launch needs of a tensor, from PyTorch or __cuda_array_interface__;
    ``what`` names it in errors ("argument 'load.src'", "input 'x'"), ``expected`` is
    the dtype the kernel reads, where known, so a dtype no kernel reads names it too."""
    if hasattr(obj, "data_ptr") and hasattr(obj, "dtype"):
        layout = ("nested" if getattr(obj, "is_nested", False)
                  else str(getattr(obj, "layout", "torch.strided")).removeprefix("torch."))
        if layout != "strided":   # its data_ptr() or shape raises PyTorch's own error
            raise RuntimeLaunchError(f"{what} is a {layout} tensor; the kernel reads a dense "
                                     "array with strides",
                                     hint="pass a dense tensor (.to_dense(); a nested one: "
                                          "torch.nested.to_padded_tensor)")
        dtype = TORCH_DTYPES.get(str(obj.dtype).removeprefix("torch."))
        if dtype is None and expected is not None:
            raise RuntimeLaunchError(f"{what} is {obj.dtype}, expected {expected}",
                                     hint=f"convert it (.to({torch_name(expected)}))")
        if dtype is None:
            raise RuntimeLaunchError(f"{what}: unsupported dtype {obj.dtype}",
                                     hint="dtypes: " + ", ".join(sorted(TORCH_DTYPES)))
        device = getattr(obj, "device", None)
        return TensorInfo(obj.data_ptr(), tuple(obj.shape), tuple(obj.stride()), dtype,
                          getattr(obj, "is_cuda", False), getattr(device, "index", None),
                          getattr(device, "type", None))
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is None:
        raise RuntimeLaunchError(f"{what} is not a GPU tensor "
                                 f"({type(obj).__name__})",
                                 hint="pass a CUDA tensor (PyTorch, CuPy, or any object with "
                                      "__cuda_array_interface__)")
    dtype = _TYPESTR.get(cai["typestr"])
    if dtype is None:
        raise RuntimeLaunchError(f"{what}: unsupported typestr {cai['typestr']}")
    shape = tuple(cai["shape"])
    size = expr.DTYPE_BYTES[dtype]
    strides = (tuple(s // size for s in cai["strides"]) if cai.get("strides")
               else contiguous_strides(shape))
    return TensorInfo(cai["data"][0], shape, strides, dtype, True, device_type="cuda")


def address(obj: Any) -> int:
    """The device address of a PyTorch tensor or a __cuda_array_interface__ object."""
    if hasattr(obj, "data_ptr"):
        return obj.data_ptr()
    return obj.__cuda_array_interface__["data"][0]


def require_cuda(info: TensorInfo, what: str) -> None:
    """Refuses a tensor a kernel cannot read, saying where it is instead: a meta tensor
    (a shape with no data) is told apart from one on the CPU or another device."""
    if info.on_gpu:
        return
    if info.device_type == "meta":
        raise RuntimeLaunchError(
            f"{what} is a meta tensor (a shape with no data): a launch reads its data",
            hint="pass CUDA tensors; meta tensors are for tracing through the op "
                 "pipelink.load returns (a plain call, or torch.compile over it, gives meta "
                 "outputs and launches nothing)")
    if info.device_type == "cpu":
        where = "is on the CPU"
    elif info.device_type is None:
        where = "is not on a CUDA device"
    else:
        index = "" if info.device is None else f":{info.device}"
        where = f"is on device '{info.device_type}{index}'"
    raise RuntimeLaunchError(f"{what} {where}; the kernel reads CUDA memory",
                             hint="move it to the GPU (.cuda())")


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, step = [], 1
    for dim in reversed(shape):
        out.append(step)
        step *= dim
    return tuple(reversed(out))


def is_dense(info: TensorInfo) -> bool:
    """Row-major with no gaps (size-1 dimensions may have any stride; a tensor of no
    elements has nothing to misplace)."""
    if 0 in info.shape:
        return True
    want = contiguous_strides(info.shape)
    return all(d == 1 or s == w for d, s, w in zip(info.shape, info.strides, want, strict=True))


def require_dense(info: TensorInfo, what: str, why: str) -> None:
    if not is_dense(info):
        raise RuntimeLaunchError(
            f"{what} has strides {list(info.strides)} for shape {list(info.shape)}; "
            f"{why} reads it as a dense row-major array "
            f"(strides {list(contiguous_strides(info.shape))})",
            hint="pass .contiguous()")


def overlaps_itself(info: TensorInfo) -> bool:
    """Whether two elements share an address (an expand()ed or as_strided view): each
    dimension's stride, smallest first, must step past everything the smaller ones span."""
    if 0 in info.shape:
        return False
    reach = 0                       # elements past the first the smaller dimensions reach
    for stride, size in sorted((abs(s), d) for d, s in zip(info.shape, info.strides,
                                                             strict=True) if d > 1):
        if stride <= reach:
            return True
        reach += stride * (size - 1)
    return False


def require_aligned(info: TensorInfo, align: int, what: str) -> None:
    if info.ptr % align:
        raise RuntimeLaunchError(
            f"{what} starts at an address {info.ptr % align} bytes past a "
            f"{align}-byte boundary; the kernel needs {align}-byte alignment",
            hint="pass a freshly allocated or .clone()d tensor, not a view at an odd offset")


def require_tma_layout(info: TensorInfo, what: str) -> None:
    """What cuTensorMapEncodeTiled demands of a tensor (checked here to say it plainly)."""
    if info.strides and info.strides[-1] != 1:
        raise RuntimeLaunchError(f"{what}: its innermost dimension has stride "
                                 f"{info.strides[-1]}, TMA needs 1",
                                 hint="pass .contiguous()")
    pitches = [s * info.itemsize for s in info.strides[:-1]]
    if any(p % TMA_ALIGN for p in pitches):
        raise RuntimeLaunchError(f"{what}: row pitch {pitches} bytes is not a "
                                 f"multiple of {TMA_ALIGN}",
                                 hint="pad the inner dimension to a multiple of "
                                      f"{TMA_ALIGN // info.itemsize} elements")


def overlaps(a: TensorInfo, b: TensorInfo) -> bool:
    """Whether two tensors' spans share a byte (spans, not exact element sets: a
    conservative answer for strided views)."""
    return spans_overlap(a.ptr, a.nbytes_spanned, b.ptr, b.nbytes_spanned)


def spans_overlap(a: int, a_bytes: int, b: int, b_bytes: int) -> bool:
    return bool(a_bytes and b_bytes) and a < b + b_bytes and b < a + a_bytes


def encode_tensormap(info: TensorInfo, box: list[int], swizzle: int, what: str) -> bytes:
    """A tiled TMA descriptor over a row-major tensor; ``box`` innermost first. A tensor
    of lower rank than the box is read with leading dimensions of 1 (so a loader whose
    box has a group dimension takes a plain matrix as one group); one of higher rank has
    its leading dimensions merged where they are contiguous (attention's [B, S, H, D]
    read as [B*S, H, D] rows)."""
    drv = driver()
    rank = len(box)
    require_tma_layout(info, what)
    require_aligned(info, TMA_ALIGN, what)
    shape, strides = merge_leading(info.shape, info.strides, rank, what)
    shape, strides = tma_view(shape, strides, rank)
    pitches = [s * info.itemsize for s in reversed(strides[:-1])]
    tmap = call(drv.cuTensorMapEncodeTiled(
        getattr(drv.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{_TMA_DTYPES[info.dtype]}"),
        rank, info.ptr,
        [drv.cuuint64_t(d) for d in reversed(shape)],
        [drv.cuuint64_t(p) for p in pitches], [drv.cuuint32_t(b) for b in box],
        [drv.cuuint32_t(1)] * rank,
        drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        getattr(drv.CUtensorMapSwizzle, f"CU_TENSOR_MAP_SWIZZLE_{_SWIZZLES[swizzle]}"),
        drv.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
        f"cuTensorMapEncodeTiled for {what}")
    return ctypes.string_at(tmap.getPtr(), TMA_DESCRIPTOR_BYTES)


def merge_leading(shape: tuple[int, ...], strides: tuple[int, ...], rank: int,
                  what: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``shape`` with its leading dimensions merged down to ``rank``; each merged pair
    must be contiguous (the outer stride spans the inner dimension)."""
    shape, strides = tuple(shape), tuple(strides)
    while len(shape) > rank:
        if strides[0] != shape[1] * strides[1]:
            raise RuntimeLaunchError(
                f"{what}: a {rank}-D tile map reads a tensor of shape {list(shape)} with "
                f"its leading dimensions merged, but strides {list(strides)} do not allow "
                "it", hint="pass a contiguous tensor (.contiguous())")
        shape, strides = (shape[0] * shape[1], *shape[2:]), strides[1:]
    return shape, strides


def tma_view(shape: tuple[int, ...], strides: tuple[int, ...],
             rank: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``shape`` and ``strides`` with leading dimensions of 1 up to ``rank``; each
    added dimension's stride spans the whole tensor, which is what TMA wants of an
    outer stride."""
    shape, strides = tuple(shape), tuple(strides)
    while len(shape) < rank:
        span = max(shape[0], 1) * strides[0] if shape else 1
        shape, strides = (1, *shape), (span, *strides)
    return shape, strides
