"""Loading and launching linked kernels: the CUDA driver through cuda.bindings, and
PyTorch for the op-level API.

    op = pipelink.load("build/dev/sm_90a/gemm_swiglu")
    y = op(x, w)                       # on torch.cuda.current_stream()

Needs nothing but cuda-python (and PyTorch for :class:`Op`) at run time: no nvcc,
nvJitLink, OR-Tools or SCons. :class:`LinkedKernel` launches with explicit arguments
named ``instance.arg`` on a raw stream; :class:`Op` is the PyTorch operator (streams,
CUDA graphs, torch.compile, autograd); :class:`KernelSet` holds the kernels of a
multi-kernel recipe. docs/pytorch.md shows each.
"""

from __future__ import annotations

from pathlib import Path

from .kernel import Launch, LinkedKernel, read_kernel_folder
from .kernelset import KERNELS_JSON, KernelSet
from .op import Op, PreparedCall
from .tensors import TensorInfo, encode_tensormap, tensor_info

__all__ = ["KernelSet", "Launch", "LinkedKernel", "Op", "PreparedCall", "TensorInfo",
           "encode_tensormap", "load", "read_kernel_folder", "tensor_info"]


def load(folder: Path | str) -> Op | KernelSet:
    """A built kernel folder as a PyTorch op; a multi-kernel recipe's folder (one with
    kernels.json) as a :class:`KernelSet`. Works on ``build/dev/<arch>/<recipe>`` and on
    a release's ``dist/<arch>/<recipe>`` alike; the cubin is verified against
    kernel.json's sha256 before it loads."""
    folder = Path(folder)
    if (folder / KERNELS_JSON).is_file():
        return KernelSet(folder)
    return Op(folder)       # one kernel: no gradient kernels, so it refuses backward
