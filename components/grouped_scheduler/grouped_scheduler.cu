// grouped_scheduler: persistent grid over the output tiles of G row-packed problems.
//
// Tile numbers run problem by problem. A block's numbers only grow (t = b, b + grid,
// ...), so its cursor (the problem holding its last tile and where that problem's
// tiles and rows start) only moves forward, past each problem at most once.
#include "pl_grouped_scheduler.h"
#include "pipelink/raster.cuh"
#include "pipelink/smem.cuh"

using Params = pl_params_grouped_scheduler;

constexpr uint32_t kTileM = Params::tile_m;

// Where the scheduler stands: problem `group`, whose tiles start at `first_tile` and
// whose rows are [row_begin, row_end). One lane reads and writes it.
struct Cursor {
  uint32_t group;
  uint32_t first_tile;
  int32_t row_begin;
  int32_t row_end;
};

static_assert(sizeof(Cursor) == 16, "the contract places a 16-byte cursor");

// The end of problem g's rows, clamped so that rows never run backwards or past A.
// Read through L2, not the read-only path: an earlier phase of the same launch may have
// written the ends (an MoE router's dispatch).
__device__ __forceinline__ int32_t clamped_end(const pl_args_grouped_scheduler& args,
                                               uint32_t g, int32_t row_begin) {
  const int32_t end = __ldcg(args.ends + g);
  return min(max(end, row_begin), int32_t(args.rows));
}

__device__ __forceinline__ uint32_t m_tiles_of(const Cursor& c) {
  return uint32_t(c.row_end - c.row_begin + int32_t(kTileM) - 1) / kTileM;
}

// Scheduler's perspective, one lane, per record: the iteration-th tile of this block,
// or the end marker once every problem's tiles are taken.
extern "C" __device__ pl::WorkTile pl_grouped_scheduler_schedule(
    const pl_place_grouped_scheduler& at, const pl_args_grouped_scheduler& args,
    const pl::KernelInfo&, uint32_t iteration, pl_state_grouped_scheduler_schedule&) {
  Cursor& c = *pl::smem_ptr<Cursor>(at.smem.cursor);
  if (iteration == 0) {
    c = Cursor{0, 0, 0, args.groups > 0 ? clamped_end(args, 0, 0) : 0};
  }
  const uint32_t t = blockIdx.x + iteration * gridDim.x;
  while (c.group < args.groups && t >= c.first_tile + m_tiles_of(c) * args.n_tiles) {
    c.first_tile += m_tiles_of(c) * args.n_tiles;
    c.row_begin = c.row_end;
    if (++c.group < args.groups) c.row_end = clamped_end(args, c.group, c.row_begin);
  }
  if (c.group >= args.groups) return pl::WorkTile{};
  const pl::TileCoord at_tile = pl::raster_tile(t - c.first_tile, m_tiles_of(c), args.n_tiles,
                                                args.group_m);
  return pl::WorkTile{at_tile.m_block, at_tile.n_block, int32_t(c.group), 0,
                      int32_t(args.k_tiles), 1, c.row_begin, c.row_end};
}
