// contiguous_blocks: step k is key tile k.
#include "pl_contiguous_blocks.h"

extern "C" __device__ pl::attn::KvTile pl_contiguous_blocks_blocks_kv_tile(
    const pl_place_contiguous_blocks&, const pl_args_contiguous_blocks&, const pl::KernelInfo&,
    const pl::WorkTile&, int32_t step) {
  return pl::attn::KvTile{step, 0};
}
