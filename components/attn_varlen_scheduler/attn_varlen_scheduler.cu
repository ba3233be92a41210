// attn_varlen_scheduler: persistent grid over the (sequence, query tile, head) work of
// a varlen attention forward. Record numbers run sequence by sequence; a block's
// numbers only grow (its own block index, then ever larger draws from a global
// counter), so its cursor (the sequence holding its last record, where that
// sequence's records start, and its rows) only moves forward.
#include "pl_attn_varlen_scheduler.h"
#include "pipelink/smem.cuh"

using Params = pl_params_attn_varlen_scheduler;

constexpr int32_t kTileM = Params::tile_m;
constexpr int32_t kTileN = Params::tile_n;

struct Cursor {
  uint32_t sequence;
  uint32_t first_record;
  int32_t row_begin;
  int32_t row_end;
};

static_assert(sizeof(Cursor) == 16, "the contract places a 16-byte cursor");

// Offset b of cu_seqlens, clamped so that rows never run backwards or past the tensors.
// Read through L2: an earlier phase of the same launch may have written it.
__device__ __forceinline__ int32_t clamped_offset(const pl_args_attn_varlen_scheduler& args,
                                                  uint32_t b, int32_t floor) {
  return min(max(__ldcg(args.cu_seqlens + b), floor), int32_t(args.rows));
}

__device__ __forceinline__ uint32_t records_of(const Cursor& c, uint32_t heads) {
  return uint32_t(c.row_end - c.row_begin + kTileM - 1) / kTileM * heads;
}

// Scheduler's perspective, one lane, per record.
extern "C" __device__ pl::WorkTile pl_attn_varlen_scheduler_schedule(
    const pl_place_attn_varlen_scheduler& at, const pl_args_attn_varlen_scheduler& args,
    const pl::KernelInfo& k, uint32_t iteration, pl_state_attn_varlen_scheduler_schedule&) {
  Cursor& c = *pl::smem_ptr<Cursor>(at.smem.cursor);
  if (iteration == 0) {
    const int32_t begin = args.batch > 0 ? clamped_offset(args, 0, 0) : 0;
    c = Cursor{0, 0, begin, args.batch > 0 ? clamped_offset(args, 1, begin) : begin};
  }
  const uint32_t r = pl::attn::next_record(at.counter.next_record, k, iteration);
  while (c.sequence < args.batch && r >= c.first_record + records_of(c, args.heads)) {
    c.first_record += records_of(c, args.heads);
    c.row_begin = c.row_end;
    if (++c.sequence < args.batch) c.row_end = clamped_offset(args, c.sequence + 1, c.row_begin);
  }
  if (c.sequence >= args.batch) return pl::WorkTile{};
  const uint32_t local = r - c.first_record;
  const int32_t len = c.row_end - c.row_begin;
  const int32_t m_tiles = (len + kTileM - 1) / kTileM;
  const int32_t m_block = m_tiles - 1 - int32_t(local / args.heads);
  const int32_t head = int32_t(local % args.heads);
  const int32_t q_begin = m_block * kTileM;
  const pl::attn::Span keys = pl_attn_varlen_scheduler_mask_kv_range(
      k, q_begin, min(q_begin + kTileM, len), len);
  const pl::attn::Span kv_tiles = pl::attn::tiles_of(
      pl::attn::Span{max(keys.begin, 0), min(keys.end, len)}, kTileN);
  return pl::WorkTile{m_block, head, int32_t(c.sequence), kv_tiles.begin, kv_tiles.end, 1,
                      c.row_begin, c.row_end};
}
