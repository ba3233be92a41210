// tile_scheduler: persistent grid over output tiles with grouped rasterisation.
//
// Linear tile t lives in group t / (group_m * n_tiles); a group covers tile rows
// [g * group_m, g * group_m + rows) (the last group may be shorter) and is walked
// column by column: consecutive t go down a column of `rows` tiles, then right.
#include "pl_tile_scheduler.h"
#include "pipelink/raster.cuh"

// Scheduler's perspective, one lane, per record: the iteration-th tile of this block,
// or the end marker once the block has run out of tiles.
extern "C" __device__ pl::WorkTile pl_tile_scheduler_schedule(const pl_place_tile_scheduler&,
                                                              const pl_args_tile_scheduler& args,
                                                              const pl::KernelInfo&,
                                                              uint32_t iteration,
                                                              pl_state_tile_scheduler_schedule&) {
  const uint32_t t = blockIdx.x + iteration * gridDim.x;
  return pl::gemm_tile(t, args.m_tiles, args.n_tiles, args.group_m, args.k_tiles);
}
