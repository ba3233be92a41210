// tile_scheduler: persistent grid over output tiles with grouped rasterisation.
//
// Linear tile t lives in group t / (group_m * n_tiles); a group covers tile rows
// [g * group_m, g * group_m + rows) (the last group may be shorter) and is walked
// column by column: consecutive t go down a column of `rows` tiles, then right.
//
// With a cluster of kClusterM CTAs along x (consecutive blocks), the cluster is the
// unit: it walks tiles of kClusterM m-blocks, and its CTA of rank r takes m-block
// kClusterM * m + r of each.
#include "pl_tile_scheduler.h"
#include "pipelink/cluster.cuh"
#include "pipelink/raster.cuh"

constexpr uint32_t kClusterM = pl_params_tile_scheduler::cluster_m;

static_assert(kClusterM == 1 || kClusterM == 2,
              "a cluster takes one tile per CTA along M: set cluster_m to 1 or 2");

// Scheduler's perspective, one lane, per record: the iteration-th tile of this block
// (of its cluster, then its rank's m-block), or the end marker once it has run out.
extern "C" __device__ pl::WorkTile pl_tile_scheduler_schedule(const pl_place_tile_scheduler&,
                                                              const pl_args_tile_scheduler& args,
                                                              const pl::KernelInfo&,
                                                              uint32_t iteration,
                                                              pl_state_tile_scheduler_schedule&) {
  const uint32_t t = blockIdx.x / kClusterM + iteration * (gridDim.x / kClusterM);
  pl::WorkTile tile =
      pl::gemm_tile(t, args.m_tiles / kClusterM, args.n_tiles, args.group_m, args.k_tiles);
  if (kClusterM > 1 && tile.is_valid()) {
    tile.m_block = tile.m_block * int32_t(kClusterM) + int32_t(pl::cluster::rank());
  }
  return tile;
}
