// contiguous_q_tiles: slot s is query tile s.
#include "pl_contiguous_q_tiles.h"

extern "C" __device__ int32_t pl_contiguous_q_tiles_q_tiles_q_tile(
    const pl_place_contiguous_q_tiles&, const pl_args_contiguous_q_tiles&,
    const pl::KernelInfo&, const pl::WorkTile&, int32_t, int32_t slot) {
  return slot;
}

extern "C" __device__ bool pl_contiguous_q_tiles_q_tiles_contiguous(
    const pl_place_contiguous_q_tiles&, const pl_args_contiguous_q_tiles&, const pl::KernelInfo&) {
  return true;
}
