// attn_varlen_scheduler: persistent grid over the (sequence, query tile, head) work of
// a varlen attention forward. Record numbers run sequence by sequence; a block's
// numbers only grow (its own block index, then ever larger draws from a global
// counter), so its pl::attn::DocumentCursor only moves forward.
#include "pl_attn_varlen_scheduler.h"
#include "pipelink/smem.cuh"

using Params = pl_params_attn_varlen_scheduler;

constexpr int32_t kTileM = Params::tile_m;
constexpr int32_t kTileN = Params::tile_n;

static_assert(sizeof(pl::attn::DocumentCursor) == 16, "the contract places a 16-byte cursor");

// Scheduler's perspective, one lane, per record.
extern "C" __device__ pl::WorkTile pl_attn_varlen_scheduler_schedule(
    const pl_place_attn_varlen_scheduler& at, const pl_args_attn_varlen_scheduler& args,
    const pl::KernelInfo& k, uint32_t iteration, pl_state_attn_varlen_scheduler_schedule&) {
  pl::attn::DocumentCursor& c = *pl::smem_ptr<pl::attn::DocumentCursor>(at.smem.cursor);
  const uint32_t documents = pl_attn_varlen_scheduler_documents_count(k);
  const auto end_of = [&](uint32_t b, int32_t begin) {
    return pl_attn_varlen_scheduler_documents_end(k, b, begin, args.rows);
  };
  const auto first_of = [&] { return pl_attn_varlen_scheduler_documents_first(k, args.rows); };
  if (iteration == 0) c.start(documents, first_of, end_of);
  const uint32_t r = pl::attn::next_record(at.counter.next_record, k, iteration);
  const auto records_of = [&](int32_t len) {
    return uint32_t(len + kTileM - 1) / kTileM * args.heads;
  };
  if (!c.seek(r, documents, int32_t(args.rows), records_of, end_of)) return pl::WorkTile{};
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
  return pl::WorkTile{m_block, head, int32_t(c.document), kv_tiles.begin, kv_tiles.end, 1,
                      c.row_begin, c.row_end};
}
