// flex_block_mask: step k of a record reads the BlockMask's k-th full block, then its
// partial blocks.
#include "pl_flex_block_mask.h"

using Args = pl_args_flex_block_mask;

// The BlockMask row of query tile m of (sequence b, head h), broadcast where the mask
// was built for one sequence or one head.
__device__ __forceinline__ uint32_t mask_row(const Args& args, const pl::WorkTile& tile) {
  const uint32_t b = uint32_t(tile.group) % args.mask_batch;
  const uint32_t h = uint32_t(tile.n_block) % args.mask_heads;
  return (b * args.mask_heads + h) * args.q_blocks + uint32_t(tile.m_block);
}

extern "C" __device__ pl::attn::KvTile pl_flex_block_mask_blocks_kv_tile(
    const pl_place_flex_block_mask&, const Args& args, const pl::KernelInfo&,
    const pl::WorkTile& tile, int32_t step) {
  const uint32_t row = mask_row(args, tile);
  const int32_t full = __ldg(args.full_kv_num_blocks + row);
  const size_t first = size_t(row) * args.kv_blocks;
  if (step < full) return pl::attn::KvTile{__ldg(args.full_kv_indices + first + step), 1};
  return pl::attn::KvTile{__ldg(args.kv_indices + first + (step - full)), 0};
}
