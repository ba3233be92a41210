// attn_scheduler: persistent grid over the (sequence, head, query tile) work of an
// attention forward, in pl::attn::lpt_order: sections of `section` (sequence, head)
// pairs, each from its last query tile to its first, so the costliest causal tiles go
// first, the last wave is made of the cheapest, and the K and V in use fit in L2.
#include "pl_attn_scheduler.h"

using Params = pl_params_attn_scheduler;

constexpr int32_t kTileM = Params::tile_m;
constexpr int32_t kTileN = Params::tile_n;

// Scheduler's perspective, one lane, per record: the iteration-th record of this block,
// or the end marker.
extern "C" __device__ pl::WorkTile pl_attn_scheduler_schedule(
    const pl_place_attn_scheduler& at, const pl_args_attn_scheduler& args,
    const pl::KernelInfo& k, uint32_t iteration, pl_state_attn_scheduler_schedule&) {
  const uint32_t r = pl::attn::next_record(at.counter.next_record, k, iteration);
  const pl::attn::DenseTile t = pl::attn::dense_tile(r, args.seq, kTileM, args.batch,
                                                     args.heads, args.section);
  if (!t.valid) return pl::WorkTile{};
  const int32_t seq = int32_t(args.seq);
  const int32_t q_begin = t.m_block * kTileM;
  const pl::attn::Span keys = pl_attn_scheduler_mask_kv_range(k, q_begin,
                                                             min(q_begin + kTileM, seq), seq);
  const pl::attn::Span kv_tiles = pl::attn::tiles_of(
      pl::attn::Span{max(keys.begin, 0), min(keys.end, seq)}, kTileN);
  const int32_t first_row = t.sequence * seq;
  return pl::WorkTile{t.m_block, t.head, t.sequence, kv_tiles.begin, kv_tiles.end, 1,
                      first_row, first_row + seq};
}
