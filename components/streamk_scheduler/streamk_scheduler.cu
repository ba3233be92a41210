// streamk_scheduler: data-parallel waves of whole tiles, then stream-K over the rest.
//
// The streamed tiles' k-tile iterations are numbered tile by tile (iteration g is k-tile
// g % k_tiles of streamed tile g / k_tiles), and CTA c of the S streaming CTAs takes
// iterations [c * I / S, (c + 1) * I / S). Its records, in order: the end of the tile
// its share starts in, whole tiles, the start of the tile its share ends in. A tile
// cut between CTAs h, h + 1, ... is a split_tile whose piece p belongs to CTA h + p:
// piece 0 (k-tile 0) is CTA h's last record and stores the tile, every later piece is
// its CTA's first record, whose partial lands in that CTA's workspace slot.
#include "pl_streamk_scheduler.h"
#include "pipelink/raster.cuh"

using Params = pl_params_streamk_scheduler;

constexpr uint32_t kPartialBytes = Params::tile_m * Params::tile_n * sizeof(float);
constexpr uint32_t kFlagBytes = sizeof(uint64_t);
// Share arithmetic stays in 32 bits (this warp runs on a 40-register budget; 64-bit
// division spills there): streaming needs iterations * max_ctas to fit.
constexpr uint32_t kMostIterations = UINT32_MAX / Params::max_ctas;

// How one launch's tiles divide between the data-parallel waves and the stream.
struct Plan {
  uint32_t whole;       // tiles run whole: block b takes b, b + C, ... below this
  uint32_t waves;       // whole / C
  uint32_t streamers;   // CTAs that share the streamed iterations (0: none)
  uint32_t iterations;  // k-tile iterations of the tiles from `whole` on
};

__device__ __forceinline__ Plan plan_of(uint32_t tiles, uint32_t ctas, uint32_t k_tiles) {
  const uint32_t waves = tiles / ctas;
  // The last whole wave streams too: every CTA then runs between 1 and 2 tiles of it.
  const uint32_t dp_waves = waves > 0 ? waves - 1 : 0;
  const uint32_t whole = dp_waves * ctas;
  const uint64_t iterations = uint64_t(tiles - whole) * k_tiles;
  if (tiles % ctas == 0 || ctas > Params::max_ctas || iterations > kMostIterations) {
    return Plan{tiles, waves, 0, 0};
  }
  const uint32_t most = max(uint32_t(iterations) / Params::min_k_tiles, 1u);
  return Plan{whole, dp_waves, min(ctas, most), uint32_t(iterations)};
}

// First streamed iteration of CTA c (c <= streamers).
__device__ __forceinline__ uint32_t share_begin(const Plan& p, uint32_t c) {
  return p.iterations * c / p.streamers;
}

// The CTA whose share holds streamed iteration g: the last c with share_begin(c) <= g.
__device__ __forceinline__ uint32_t owner_of(const Plan& p, uint32_t g) {
  return ((g + 1) * p.streamers - 1) / p.iterations;
}

// Scheduler's perspective, one lane, per record: this block's iteration-th whole tile,
// then the records of its streamed share, then the end marker.
extern "C" __device__ pl::WorkTile pl_streamk_scheduler_schedule(
    const pl_place_streamk_scheduler& at, const pl_args_streamk_scheduler& args,
    const pl::KernelInfo&, uint32_t iteration, pl_state_streamk_scheduler_schedule&) {
  const uint32_t tiles = args.m_tiles * args.n_tiles;
  const uint32_t k_tiles = args.k_tiles;
  const Plan p = plan_of(tiles, gridDim.x, k_tiles);
  if (iteration < p.waves) {
    return pl::gemm_tile(blockIdx.x + iteration * gridDim.x, args.m_tiles, args.n_tiles,
                         args.group_m, k_tiles);
  }
  if (blockIdx.x >= p.streamers) return pl::WorkTile{};
  const uint32_t begin = share_begin(p, blockIdx.x);
  const uint32_t end = share_begin(p, blockIdx.x + 1);
  const uint32_t tile = begin / k_tiles + (iteration - p.waves);
  const uint32_t tile_begin = tile * k_tiles;
  if (tile_begin >= end) return pl::WorkTile{};

  pl::WorkTile w = pl::gemm_tile(p.whole + tile, args.m_tiles, args.n_tiles, args.group_m,
                                 k_tiles);
  w.k_begin = int32_t(max(begin, tile_begin) - tile_begin);
  w.k_end = int32_t(min(end - tile_begin, k_tiles));
  const uint32_t head = owner_of(p, tile_begin);
  const uint32_t pieces = owner_of(p, tile_begin + k_tiles - 1) - head + 1;
  if (pieces > 1) {
    w.k_split = int32_t(blockIdx.x - head);
    w.k_splits = int32_t(pieces);
    w.partials = at.scratch.partials + (head + 1) * kPartialBytes;   // piece 1's CTA
    w.flag = at.scratch.flags + (head + 1) * kFlagBytes;
  }
  return w;
}
