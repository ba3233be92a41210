"""FlexAttention's BlockMask as the block-sparse attention recipes take it."""

from __future__ import annotations

from typing import Any

from ..errors import RuntimeLaunchError

# attn_block_sparse's inputs after q, k, v: the forward reads the kv_ tensors, the
# backward the transposed q_ ones (saved by the autograd op).
BLOCK_MASK_TENSORS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
                      "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices")


def block_mask_tensors(block_mask: Any) -> tuple[Any, ...]:
    """The eight tensors of a BlockMask (torch.nn.attention.flex_attention's
    create_block_mask), in the order attn_block_sparse takes them after q, k and v:
    ``op(q, k, v, *block_mask_tensors(bm))``."""
    missing = [name for name in BLOCK_MASK_TENSORS
               if getattr(block_mask, name, None) is None]
    if missing:
        raise RuntimeLaunchError(
            f"the BlockMask has no {', '.join(missing)}",
            hint="build it with create_block_mask, which fills the full-block and the "
                 "transposed (q_) tensors the forward and the backward read")
    return tuple(getattr(block_mask, name) for name in BLOCK_MASK_TENSORS)
