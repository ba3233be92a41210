// streamk_scheduler: data-parallel waves of whole tiles, then stream-K over the rest.
//
// Work is dealt to crews: a crew is one CTA taking single tiles, or, with at most
// lockstep_m tile rows, `rows` CTAs taking whole columns of tiles in lockstep (see
// Crews). The streamed items' k-tile iterations are numbered item by item (iteration g
// is k-tile g % k_tiles of streamed item g / k_tiles), and crew c of the S streaming
// crews takes iterations [c * I / S, (c + 1) * I / S). Its records, in order: the end of
// the item its share starts in, whole items, the start of the item its share ends in.
// A tile cut between crews h, h + 1, ... is a split_tile whose piece p belongs to crew
// h + p: piece 0 (k-tile 0) is crew h's last record and stores the tile, every later
// piece is its crew's first record, whose partial lands in that crew's workspace slot.
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
  uint32_t whole;       // tiles run whole: crew b takes b, b + C, ... below this
  uint32_t waves;       // whole / C
  uint32_t streamers;   // crews that share the streamed iterations (0: none)
  uint32_t iterations;  // k-tile iterations of the tiles from `whole` on
};

// Over `tiles` tiles of k_tiles iterations each, on `crews` crews.
__device__ __forceinline__ Plan plan_of(uint32_t tiles, uint32_t crews, uint32_t k_tiles) {
  const uint32_t waves = tiles / crews;
  // The last whole wave streams too: every crew then runs between 1 and 2 tiles of it.
  const uint32_t dp_waves = waves > 0 ? waves - 1 : 0;
  const uint32_t whole = dp_waves * crews;
  const uint64_t iterations = uint64_t(tiles - whole) * k_tiles;
  if (tiles % crews == 0 || crews > Params::max_ctas || iterations > kMostIterations) {
    return Plan{tiles, waves, 0, 0};
  }
  const uint32_t most = max(uint32_t(iterations) / Params::min_k_tiles, 1u);
  return Plan{whole, dp_waves, min(crews, most), uint32_t(iterations)};
}

// First streamed iteration of crew c (c <= streamers).
__device__ __forceinline__ uint32_t share_begin(const Plan& p, uint32_t c) {
  return p.iterations * c / p.streamers;
}

// The crew whose share holds streamed iteration g: the last c with share_begin(c) <= g.
__device__ __forceinline__ uint32_t owner_of(const Plan& p, uint32_t g) {
  return ((g + 1) * p.streamers - 1) / p.iterations;
}

// Who runs what. With at most lockstep_m tile rows, a crew is `rows` CTAs, one per tile
// row, and its work items are whole columns of tiles: the CTAs of a crew run the same
// k-tiles of the same column together, so each B tile comes from DRAM once and from L2
// for the other rows (a stream of single tiles would have the rows of one column at
// different k-tiles, and B read once per row). Otherwise a crew is one CTA and its work
// items are single tiles in grouped raster order.
struct Crews {
  uint32_t rows;    // CTAs per crew: tile rows run in lockstep (1: none)
  uint32_t count;   // crews in the grid (CTAs past rows * count have no work)
  uint32_t crew;    // this CTA's crew
  uint32_t row;     // this CTA's tile row within its crew's items (rows > 1)
  uint32_t items;   // work items: columns (rows > 1) or tiles
};

__device__ __forceinline__ Crews crews_of(const pl_args_streamk_scheduler& args) {
  const uint32_t ctas = gridDim.x;
  if (args.m_tiles > 1 && args.m_tiles <= Params::lockstep_m && args.m_tiles <= ctas) {
    const uint32_t rows = args.m_tiles;
    return Crews{rows, ctas / rows, blockIdx.x / rows, blockIdx.x % rows, args.n_tiles};
  }
  return Crews{1, ctas, blockIdx.x, 0, args.m_tiles * args.n_tiles};
}

// Work item `item` of this CTA's row as a gemm_tile record.
__device__ __forceinline__ pl::WorkTile tile_of(const Crews& l,
                                                const pl_args_streamk_scheduler& args,
                                                uint32_t item) {
  // A crew's rows are one column's tiles: raster groups of exactly `rows` rows put
  // tile (row, column) at column * rows + row.
  if (l.rows > 1) {
    return pl::gemm_tile(item * l.rows + l.row, args.m_tiles, args.n_tiles, l.rows,
                         args.k_tiles);
  }
  return pl::gemm_tile(item, args.m_tiles, args.n_tiles, args.group_m, args.k_tiles);
}

// Scheduler's perspective, one thread, per record: this CTA's iteration-th whole tile,
// then the records of its streamed share, then the end marker.
extern "C" __device__ pl::WorkTile pl_streamk_scheduler_schedule(
    const pl_place_streamk_scheduler& at, const pl_args_streamk_scheduler& args,
    const pl::KernelInfo&, uint32_t iteration, pl_state_streamk_scheduler_schedule&) {
  const Crews l = crews_of(args);
  if (l.crew >= l.count) return pl::WorkTile{};
  const uint32_t k_tiles = args.k_tiles;
  const Plan p = plan_of(l.items, l.count, k_tiles);
  if (iteration < p.waves) return tile_of(l, args, l.crew + iteration * l.count);
  if (l.crew >= p.streamers) return pl::WorkTile{};
  const uint32_t begin = share_begin(p, l.crew);
  const uint32_t end = share_begin(p, l.crew + 1);
  const uint32_t item = begin / k_tiles + (iteration - p.waves);
  const uint32_t item_begin = item * k_tiles;
  if (item_begin >= end) return pl::WorkTile{};

  pl::WorkTile w = tile_of(l, args, p.whole + item);
  w.k_begin = int32_t(max(begin, item_begin) - item_begin);
  w.k_end = int32_t(min(end - item_begin, k_tiles));
  const uint32_t head = owner_of(p, item_begin);
  const uint32_t pieces = owner_of(p, item_begin + k_tiles - 1) - head + 1;
  if (pieces > 1) {
    // Piece p of the tile is crew head + p's; a row's crews hold consecutive slots.
    const uint32_t slot = l.row * l.count + head + 1;   // piece 1's
    w.k_split = int32_t(l.crew - head);
    w.k_splits = int32_t(pieces);
    w.partials = at.scratch.partials + slot * kPartialBytes;
    w.flag = at.scratch.flags + slot * kFlagBytes;
  }
  return w;
}
