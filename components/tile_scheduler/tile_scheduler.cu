// tile_scheduler: persistent grid over output tiles with grouped rasterisation.
//
// Linear tile t lives in group t / (group_m * n_tiles); a group covers tile rows
// [g * group_m, g * group_m + rows) (the last group may be shorter) and is walked
// column by column: consecutive t go down a column of `rows` tiles, then right.
#include "pl_tile_scheduler.h"

// Scheduler's perspective: the iteration-th tile of this block, or an invalid tile.
extern "C" __device__ pl::WorkTile pl_tile_scheduler_tile(const pl_place_tile_scheduler&,
                                                          const pl_args_tile_scheduler& args,
                                                          uint32_t iteration) {
  const uint32_t tiles = args.m_tiles * args.n_tiles;
  const uint32_t t = blockIdx.x + iteration * gridDim.x;
  if (t >= tiles) return pl::WorkTile{0, 0, 0, 0};
  const uint32_t group_m = args.group_m > 0 ? args.group_m : 1;
  const uint32_t group_tiles = group_m * args.n_tiles;
  const uint32_t first_row = (t / group_tiles) * group_m;
  const uint32_t rows = min(args.m_tiles - first_row, group_m);
  const uint32_t in_group = t % group_tiles;
  return pl::WorkTile{int32_t(first_row + in_group % rows), int32_t(in_group / rows), 0, 1};
}
