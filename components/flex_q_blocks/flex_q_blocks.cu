// flex_q_blocks: slot s of a key tile's record is query tile s % (block / tile_q) of the
// BlockMask column's (s / (block / tile_q))-th query block: full blocks first, then the
// partial ones.
#include "pl_flex_q_blocks.h"

using Params = pl_params_flex_q_blocks;
using Args = pl_args_flex_q_blocks;

constexpr int32_t kTilesPerBlock = Params::block / Params::tile_q;

static_assert(Params::block % Params::tile_q == 0,
              "a BlockMask block is whole query tiles: make block a multiple of tile_q");

extern "C" __device__ int32_t pl_flex_q_blocks_q_tiles_q_tile(
    const pl_place_flex_q_blocks&, const Args& args, const pl::KernelInfo&,
    const pl::WorkTile& tile, int32_t head, int32_t slot) {
  // The column of key block m_block (the transposed tensors are [MB, MH, KB, QB]).
  const uint32_t column = pl::attn::block_mask_row(uint32_t(tile.group), uint32_t(head),
                                                   uint32_t(tile.m_block), args.mask_batch,
                                                   args.mask_heads, args.kv_blocks);
  const int32_t nth = slot / kTilesPerBlock;
  const int32_t full = __ldg(args.full_q_num_blocks + column);
  const size_t first = size_t(column) * args.q_blocks;
  const int32_t block = nth < full ? __ldg(args.full_q_indices + first + nth)
                                   : __ldg(args.q_indices + first + (nth - full));
  return block * kTilesPerBlock + slot % kTilesPerBlock;
}

extern "C" __device__ bool pl_flex_q_blocks_q_tiles_contiguous(
    const pl_place_flex_q_blocks&, const pl_args_flex_q_blocks&, const pl::KernelInfo&) {
  return false;
}
