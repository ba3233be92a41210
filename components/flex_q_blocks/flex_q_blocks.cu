// flex_q_blocks: slot s of a key tile's record is query tile s % (block / tile_q) of the
// BlockMask column's (s / (block / tile_q))-th query block: full blocks first, then the
// partial ones.
#include "pl_flex_q_blocks.h"

using Params = pl_params_flex_q_blocks;
using Args = pl_args_flex_q_blocks;

constexpr int32_t kTilesPerBlock = Params::block / Params::tile_q;

static_assert(Params::block % Params::tile_q == 0,
              "a BlockMask block is whole query tiles: make block a multiple of tile_q");

// The BlockMask column of key block n of (sequence b, query head h), broadcast where the
// mask was built for one sequence or one head (MB is 1 or B, MH 1 or H: the recipe's
// require; a select, not a remainder, in the consumers' step loop).
__device__ __forceinline__ uint32_t mask_column(const Args& args, const pl::WorkTile& tile,
                                                int32_t head) {
  const uint32_t b = args.mask_batch == 1 ? 0u : uint32_t(tile.group);
  const uint32_t h = args.mask_heads == 1 ? 0u : uint32_t(head);
  return (b * args.mask_heads + h) * args.kv_blocks + uint32_t(tile.m_block);
}

extern "C" __device__ int32_t pl_flex_q_blocks_q_tiles_q_tile(
    const pl_place_flex_q_blocks&, const Args& args, const pl::KernelInfo&,
    const pl::WorkTile& tile, int32_t head, int32_t slot) {
  const uint32_t column = mask_column(args, tile, head);
  const int32_t nth = slot / kTilesPerBlock;
  const int32_t full = __ldg(args.full_q_num_blocks + column);
  const size_t first = size_t(column) * args.q_blocks;
  const int32_t block = nth < full ? __ldg(args.full_q_indices + first + nth)
                                   : __ldg(args.q_indices + first + (nth - full));
  return block * kTilesPerBlock + slot % kTilesPerBlock;
}

extern "C" __device__ bool pl_flex_q_blocks_q_tiles_contiguous(const pl_place_flex_q_blocks&,
                                                      const pl_args_flex_q_blocks&,
                                                      const pl::KernelInfo&) {
  return false;
}
