// attn_bwd_scheduler: persistent grid over the (sequence, K/V head, key tile) work of
// an attention backward, each record carrying the query steps its key tile meets.
#include "pl_attn_bwd_scheduler.h"

using Params = pl_params_attn_bwd_scheduler;

constexpr int32_t kTileN = Params::tile_n;
constexpr int32_t kTileQ = Params::tile_q;

// Scheduler's perspective, one lane, per record: the iteration-th record of this block,
// or the end marker.
extern "C" __device__ pl::WorkTile pl_attn_bwd_scheduler_schedule(
    const pl_place_attn_bwd_scheduler& at, const pl_args_attn_bwd_scheduler& args,
    const pl::KernelInfo& k, uint32_t iteration, pl_state_attn_bwd_scheduler_schedule&) {
  const uint32_t r = pl::attn::next_record(at.counter.next_record, k, iteration);
  const pl::attn::DenseTile t = pl::attn::dense_tile(r, args.seq, kTileN, args.batch,
                                                     args.kv_heads, args.section);
  if (!t.valid) return pl::WorkTile{};
  const int32_t seq = int32_t(args.seq);
  // lpt_order hands out the last tile first; a key tile's cost falls with its index.
  const int32_t kv_block = (seq + kTileN - 1) / kTileN - 1 - t.m_block;
  const int32_t kv_begin = kv_block * kTileN;
  const pl::attn::Span queries = pl_attn_bwd_scheduler_mask_q_range(
      k, kv_begin, min(kv_begin + kTileN, seq), seq);
  const pl::attn::Span steps = pl::attn::query_steps(
      pl::attn::tiles_of(pl::attn::Span{max(queries.begin, 0), min(queries.end, seq)}, kTileQ),
      args.kv_group);
  const int32_t first_row = t.sequence * seq;
  return pl::WorkTile{kv_block, t.head, t.sequence, steps.begin, steps.end, 1, first_row,
                      first_row + seq};
}
