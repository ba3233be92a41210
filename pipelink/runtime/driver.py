"""The CUDA driver through cuda.bindings: results unwrapped, failures as RuntimeLaunchError.

Everything the runtime asks of the driver goes through :func:`call`, so a failing call
always names what it was doing.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from ..errors import RuntimeLaunchError


@functools.cache
def driver() -> Any:
    """The cuda.bindings driver module (imported on first use: loading a package that
    only inspects kernel.json needs no CUDA); a machine without cuda-bindings is told so."""
    try:
        from cuda.bindings import driver as drv
    except ImportError as exc:
        raise RuntimeLaunchError(f"the CUDA driver bindings are missing ({exc})",
                                 hint="pip install cuda-bindings") from None
    return drv


def _init() -> Any:
    """The driver, initialised. cuInit loads libcuda, and cuda.bindings reports a machine
    without it as a bare RuntimeError; this says what is missing instead."""
    drv = driver()
    try:
        result = drv.cuInit(0)
    except RuntimeError as exc:
        raise RuntimeLaunchError(f"no CUDA driver here: {exc}",
                                 hint="kernels load and run on a machine with an NVIDIA GPU "
                                      "and its driver; Op.from_meta checks calls without "
                                      "one") from None
    call(result, "cuInit")
    return drv


def call(result: Any, what: str) -> Any:
    """Unwraps a cuda.bindings ``(err, value...)`` tuple, raising on an error."""
    drv = driver()
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != drv.CUresult.CUDA_SUCCESS:
        _, name = drv.cuGetErrorName(err)
        raise RuntimeLaunchError(f"{what} failed: {name.decode() if name else err}")
    return rest[0] if len(rest) == 1 else (tuple(rest) if rest else None)


_THREAD = threading.local()   # the context this runtime last made current on each thread


def make_current(context: Any, handle: int | None = None) -> None:
    """Makes a kernel's context current on the calling thread, once per thread and
    context. A thread the caller did not set up has none: autograd's backward workers
    on device 0 never call cudaSetDevice (device 0 is the default), so a backward that
    runs no torch CUDA op first would meet CUDA_ERROR_INVALID_CONTEXT. ``handle`` is
    ``int(context)`` where the caller keeps it (a launch does: it is on every call)."""
    if handle is None:
        handle = int(context)
    if getattr(_THREAD, "context", None) != handle:
        call(driver().cuCtxSetCurrent(context), "making the kernel's CUDA context current")
        _THREAD.context = handle


def current_device() -> int:
    """The device of the current context, making one current first if none is.

    With PyTorch loaded this is torch's current device (its primary context), so a
    module loads where the tensors live; without it, device 0's primary context.
    """
    drv = _init()
    torch_device = _torch_device()
    if torch_device is not None:
        device = call(drv.cuDeviceGet(torch_device), "cuDeviceGet")
        ctx = call(drv.cuDevicePrimaryCtxRetain(device), "cuDevicePrimaryCtxRetain")
        call(drv.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        return torch_device
    if int(call(drv.cuCtxGetCurrent(), "cuCtxGetCurrent") or 0) == 0:
        device = call(drv.cuDeviceGet(0), "cuDeviceGet")
        ctx = call(drv.cuDevicePrimaryCtxRetain(device), "cuDevicePrimaryCtxRetain")
        call(drv.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    return int(call(drv.cuCtxGetDevice(), "cuCtxGetDevice"))


def _torch_device() -> int | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    return torch.cuda.current_device()


def max_active_clusters(function: Any, block: int, smem: int, cluster: int) -> int:
    """How many clusters of `cluster` CTAs of `function` can be resident at once: a GPC
    holds whole clusters, so this can be fewer than the SMs / cluster."""
    drv = driver()
    config = drv.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = cluster, 1, 1
    config.blockDimX, config.blockDimY, config.blockDimZ = block, 1, 1
    config.sharedMemBytes = smem
    return int(call(drv.cuOccupancyMaxActiveClusters(function, config),
                    "asking how many clusters fit"))


def _attribute(device: int, attribute: str, what: str) -> int:
    """One attribute of a device (initialising the driver: a tool may ask first)."""
    drv = _init()
    return int(call(drv.cuDeviceGetAttribute(getattr(drv.CUdevice_attribute, attribute),
                                             call(drv.cuDeviceGet(device), "cuDeviceGet")),
                    f"reading the {what}"))


def sm_count(device: int) -> int:
    return _attribute(device, "CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT", "SM count")


def l2_size(device: int) -> int:
    """The device's L2 cache in bytes."""
    return _attribute(device, "CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE", "L2 size")
