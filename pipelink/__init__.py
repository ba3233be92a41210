"""PipeLink: a contract-guided linker for GPU kernel components."""

from __future__ import annotations

__version__ = "0.1.0"


def load(path: str):  # noqa: ANN201  (the runtime's op type)
    """Loads a built kernel folder as a callable (see :mod:`pipelink.runtime`)."""
    from .runtime import load as _load
    return _load(path)


def interleave_gate_up(w_gate, w_up):  # noqa: ANN001, ANN201  (torch tensors)
    """The gate/up weight layout of the SwiGLU recipes (see
    :func:`pipelink.runtime.weights.interleave_gate_up`)."""
    from .runtime.weights import interleave_gate_up as _interleave
    return _interleave(w_gate, w_up)


def block_mask_tensors(block_mask):  # noqa: ANN001, ANN201  (a FlexAttention BlockMask)
    """A BlockMask's tensors as attn_block_sparse takes them (see
    :func:`pipelink.runtime.flex.block_mask_tensors`)."""
    from .runtime.flex import block_mask_tensors as _tensors
    return _tensors(block_mask)


def ring_attention(kernels, q, k, v, group=None, ring=None):  # noqa: ANN001, ANN201
    """Context-parallel causal attention over a process group's ranks (see
    :func:`pipelink.runtime.ring.ring_attention`)."""
    from .runtime.ring import ring_attention as _ring_attention
    return _ring_attention(kernels, q, k, v, group, ring)


def zigzag_shard(x, rank: int, world: int, dim: int = 1):  # noqa: ANN001, ANN201
    """This rank's zigzag shard of a whole sequence (see
    :func:`pipelink.runtime.ring.zigzag_shard`)."""
    from .runtime.ring import zigzag_shard as _shard
    return _shard(x, rank, world, dim)
