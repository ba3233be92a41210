// kgrouped_scheduler: persistent grid over the output tiles of G problems packed along
// K. Every problem has the same tile grid, so a tile number splits into its problem
// and its place by division; the problem's k range comes from two ends.
#include "pl_kgrouped_scheduler.h"
#include "pipelink/raster.cuh"

using Params = pl_params_kgrouped_scheduler;

constexpr uint32_t kTileM = Params::tile_m;
constexpr uint32_t kTileK = Params::tile_k;

// Problem g's end row, clamped so that rows never run backwards or past A. Read through
// L2, not the read-only path: an earlier phase of the same launch may have written it.
__device__ __forceinline__ int32_t clamped_end(const pl_args_kgrouped_scheduler& args,
                                               uint32_t g, int32_t begin) {
  return min(max(__ldcg(args.ends + g), begin), int32_t(args.rows));
}

// Scheduler's perspective, one lane, per record: the iteration-th tile of this block,
// or the end marker past the last problem's tiles.
extern "C" __device__ pl::WorkTile pl_kgrouped_scheduler_schedule(
    const pl_place_kgrouped_scheduler&, const pl_args_kgrouped_scheduler& args,
    const pl::KernelInfo&, uint32_t iteration, pl_state_kgrouped_scheduler_schedule&) {
  const uint32_t m_tiles = (args.m_size + kTileM - 1) / kTileM;
  const uint32_t problem_tiles = m_tiles * args.n_tiles;
  const uint32_t t = blockIdx.x + iteration * gridDim.x;
  if (problem_tiles == 0 || t >= args.groups * problem_tiles) return pl::WorkTile{};
  const uint32_t g = t / problem_tiles;
  const int32_t begin = g == 0 ? 0 : clamped_end(args, g - 1, 0);
  const int32_t end = clamped_end(args, g, begin);
  const pl::TileCoord at = pl::raster_tile(t - g * problem_tiles, m_tiles, args.n_tiles,
                                           args.group_m);
  const int32_t first_row = int32_t(g * args.m_size);
  return pl::WorkTile{at.m_block, at.n_block, int32_t(g),
                      begin / int32_t(kTileK), (end + int32_t(kTileK) - 1) / int32_t(kTileK),
                      1, first_row, first_row + int32_t(args.m_size)};
}
