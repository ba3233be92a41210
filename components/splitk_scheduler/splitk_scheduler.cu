// splitk_scheduler: whole waves of output tiles, then the tail split along K.
//
// With C CTAs and T tiles, the first T - T % C tiles run as whole tiles, in waves. The
// T % C tail tiles are each cut into S pieces; piece p of the tail goes to CTA p, after
// that CTA's whole tiles, so every CTA holds at most one piece and only the last piece
// of a tile waits for the others (see pipelink/splitk.cuh).
#include "pl_splitk_scheduler.h"
#include "pipelink/raster.cuh"

using Params = pl_params_splitk_scheduler;

constexpr uint32_t kPartialBytes = Params::tile_m * Params::tile_n * sizeof(float);
constexpr uint32_t kFlagBytes = sizeof(uint64_t);

// How one launch's tiles divide: `whole` tiles run whole; the rest in `splits` pieces.
struct Split {
  uint32_t whole;
  uint32_t splits;
};

__device__ __forceinline__ Split split_of(uint32_t tiles, uint32_t ctas, uint32_t k_tiles) {
  const uint32_t tail = tiles % ctas;
  if (tail == 0) return Split{tiles, 1};
  const uint32_t splits = min(min(ctas / tail, k_tiles / Params::min_k_tiles),
                              Params::max_pieces / tail);
  return splits > 1 ? Split{tiles - tail, splits} : Split{tiles, 1};
}

// Scheduler's perspective, one lane, per record: this block's iteration-th whole tile,
// then its piece of the tail (if any), then the end marker.
extern "C" __device__ pl::WorkTile pl_splitk_scheduler_schedule(
    const pl_place_splitk_scheduler& at, const pl_args_splitk_scheduler& args,
    const pl::KernelInfo&, uint32_t iteration, pl_state_splitk_scheduler_schedule&) {
  const uint32_t ctas = gridDim.x;
  const uint32_t tiles = args.m_tiles * args.n_tiles;
  const Split s = split_of(tiles, ctas, args.k_tiles);
  const uint32_t t = blockIdx.x + iteration * ctas;
  if (t < s.whole) return pl::gemm_tile(t, args.m_tiles, args.n_tiles, args.group_m, args.k_tiles);
  const uint32_t piece = blockIdx.x;
  const uint32_t tail_tile = piece / s.splits;
  if (s.splits == 1 || iteration != s.whole / ctas || s.whole + tail_tile >= tiles) {
    return pl::WorkTile{};
  }
  const uint32_t k_split = piece % s.splits;
  pl::WorkTile w = pl::gemm_tile(s.whole + tail_tile, args.m_tiles, args.n_tiles,
                                 args.group_m, args.k_tiles);
  w.k_begin = int32_t(k_split * args.k_tiles / s.splits);
  w.k_end = int32_t((k_split + 1) * args.k_tiles / s.splits);
  w.k_split = int32_t(k_split);
  w.k_splits = int32_t(s.splits);
  w.partials = at.scratch.partials + tail_tile * s.splits * kPartialBytes;
  w.flag = at.scratch.flags + tail_tile * s.splits * kFlagBytes;
  return w;
}
