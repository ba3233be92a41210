// attn_scheduler: persistent grid over the (sequence, head, query tile) work of an
// attention forward. Record r of the schedule is query tile m_tiles - 1 - r / (B H)
// of head (r % (B H)) % H of sequence (r % (B H)) / H: the costliest causal tiles go
// first and the last wave is made of the cheapest.
#include "pl_attn_scheduler.h"

using Params = pl_params_attn_scheduler;

constexpr int32_t kTileM = Params::tile_m;
constexpr int32_t kTileN = Params::tile_n;

// Scheduler's perspective, one lane, per record: the iteration-th record of this block,
// or the end marker.
extern "C" __device__ pl::WorkTile pl_attn_scheduler_schedule(
    const pl_place_attn_scheduler&, const pl_args_attn_scheduler& args,
    const pl::KernelInfo& k, uint32_t iteration, pl_state_attn_scheduler_schedule&) {
  const uint32_t m_tiles = (args.seq + kTileM - 1) / kTileM;
  const uint32_t heads = args.batch * args.heads;          // (sequence, head) pairs
  const uint32_t r = blockIdx.x + iteration * gridDim.x;
  if (r >= m_tiles * heads) return pl::WorkTile{};
  const int32_t m_block = int32_t(m_tiles - 1 - r / heads);
  const int32_t sequence = int32_t(r % heads / args.heads);
  const int32_t head = int32_t(r % heads % args.heads);
  const int32_t seq = int32_t(args.seq);
  const int32_t q_begin = m_block * kTileM;
  const pl::attn::Span keys = pl_attn_scheduler_mask_kv_range(k, q_begin,
                                                             min(q_begin + kTileM, seq), seq);
  const pl::attn::Span kv_tiles = pl::attn::tiles_of(
      pl::attn::Span{max(keys.begin, 0), min(keys.end, seq)}, kTileN);
  const int32_t first_row = sequence * seq;
  return pl::WorkTile{m_block, head, sequence, kv_tiles.begin, kv_tiles.end, 1, first_row,
                      first_row + seq};
}
