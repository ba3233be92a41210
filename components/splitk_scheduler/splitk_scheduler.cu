// splitk_scheduler: whole waves of output tiles, then the tail split along K.
//
// With C CTAs and T tiles, the first T - T % C tiles run as whole tiles, in waves. Each
// of the T % C tail tiles is cut into S pieces of consecutive k-tiles, and the pieces
// are dealt to the CTAs in rounds after their whole tiles: piece i goes to CTA i % C in
// round i / C. Pieces are numbered k-range by k-range (all tail tiles' first k-range,
// then their second, ...), so the CTAs of one round stream the same k-range of
// neighbouring tiles and share their operands in L2, and the piece with the last
// k-range of a tile comes last. That piece is the tile's piece 0 (pipelink/splitk.cuh):
// it adds the others, which ran in earlier rounds or beside it and never wait.
#include "pl_splitk_scheduler.h"
#include "pipelink/raster.cuh"

using Params = pl_params_splitk_scheduler;

constexpr uint32_t kPartialBytes = Params::tile_m * Params::tile_n * sizeof(float);
constexpr uint32_t kFlagBytes = sizeof(uint64_t);
// The tail's cost in 1/kCostUnit of a tile's time: rounds / S of a tile for the k-loop,
// plus what piece 0 spends reading each other piece's partial back, one after another
// (an estimate: 128 KiB from L2 at a few hundred GB/s into one SM, ~1 us, against the
// ~40 us of a 128 x 256 x 4096 tile on the H200).
constexpr uint32_t kCostUnit = 1024;
constexpr uint32_t kFixupCost = kCostUnit / 32;

// How one launch's tiles divide: `whole` tiles run whole; the rest in `splits` pieces.
struct Split {
  uint32_t whole;
  uint32_t splits;
};

// The split S of the tail that costs least (S = 1: none), within the scratch and
// min_k_tiles per piece.
__device__ __forceinline__ Split split_of(uint32_t tiles, uint32_t ctas, uint32_t k_tiles) {
  const uint32_t tail = tiles % ctas;
  if (tail == 0) return Split{tiles, 1};
  // Enough k-tiles a piece, and the published pieces (all but piece 0) fit the scratch.
  const uint32_t most = min(min(k_tiles / Params::min_k_tiles, Params::max_splits),
                            Params::max_pieces / tail + 1);
  uint32_t best = 1;
  uint32_t best_cost = kCostUnit;
#pragma unroll 1   // a few iterations once per record: not worth the code
  for (uint32_t s = 2; s <= most; ++s) {
    const uint32_t rounds = (tail * s + ctas - 1) / ctas;
    const uint32_t cost = rounds * kCostUnit / s + (s - 1) * kFixupCost;
    if (cost < best_cost) {
      best = s;
      best_cost = cost;
    }
  }
  return best > 1 ? Split{tiles - tail, best} : Split{tiles, 1};
}

// Scheduler's perspective, one lane, per record: this block's iteration-th whole tile,
// then its pieces of the tail, one per round, then the end marker.
extern "C" __device__ pl::WorkTile pl_splitk_scheduler_schedule(
    const pl_place_splitk_scheduler& at, const pl_args_splitk_scheduler& args,
    const pl::KernelInfo&, uint32_t iteration, pl_state_splitk_scheduler_schedule&) {
  const uint32_t ctas = gridDim.x;
  const uint32_t tiles = args.m_tiles * args.n_tiles;
  const Split s = split_of(tiles, ctas, args.k_tiles);
  const uint32_t t = blockIdx.x + iteration * ctas;
  if (t < s.whole) return pl::gemm_tile(t, args.m_tiles, args.n_tiles, args.group_m, args.k_tiles);
  if (s.splits == 1) return pl::WorkTile{};
  // Split: the whole tiles fill whole waves, and the pieces follow them round by round.
  const uint32_t tail = tiles - s.whole;
  const uint32_t piece = blockIdx.x + (iteration - s.whole / ctas) * ctas;
  if (piece >= tail * s.splits) return pl::WorkTile{};
  const uint32_t tail_tile = piece % tail;
  const uint32_t k_range = piece / tail;
  pl::WorkTile w = pl::gemm_tile(s.whole + tail_tile, args.m_tiles, args.n_tiles,
                                 args.group_m, args.k_tiles);
  w.k_begin = int32_t(k_range * args.k_tiles / s.splits);
  w.k_end = int32_t((k_range + 1) * args.k_tiles / s.splits);
  w.k_split = int32_t(s.splits - 1 - k_range);      // the last k-range adds the others
  w.k_splits = int32_t(s.splits);
  w.partials = at.scratch.partials + tail_tile * (s.splits - 1) * kPartialBytes;
  w.flag = at.scratch.flags + tail_tile * (s.splits - 1) * kFlagBytes;
  return w;
}
