// attn_varlen_bwd_scheduler: persistent grid over the (document, key tile, K/V head)
// work of a varlen attention backward, each record carrying the query steps its key
// tile meets. A block's record numbers only grow, so its pl::attn::DocumentCursor only
// moves forward.
#include "pl_attn_varlen_bwd_scheduler.h"
#include "pipelink/smem.cuh"

using Params = pl_params_attn_varlen_bwd_scheduler;

constexpr int32_t kTileN = Params::tile_n;
constexpr int32_t kTileQ = Params::tile_q;

static_assert(sizeof(pl::attn::DocumentCursor) == 16, "the contract places a 16-byte cursor");

// Scheduler's perspective, one lane, per record.
extern "C" __device__ pl::WorkTile pl_attn_varlen_bwd_scheduler_schedule(
    const pl_place_attn_varlen_bwd_scheduler& at, const pl_args_attn_varlen_bwd_scheduler& args,
    const pl::KernelInfo& k, uint32_t iteration, pl_state_attn_varlen_bwd_scheduler_schedule&) {
  pl::attn::DocumentCursor& c = *pl::smem_ptr<pl::attn::DocumentCursor>(at.smem.cursor);
  const uint32_t documents = pl_attn_varlen_bwd_scheduler_documents_count(k);
  const auto end_of = [&](uint32_t b, int32_t begin) {
    return pl_attn_varlen_bwd_scheduler_documents_end(k, b, begin, args.rows);
  };
  const auto first_of = [&] { return pl_attn_varlen_bwd_scheduler_documents_first(k, args.rows); };
  if (iteration == 0) c.start(documents, first_of, end_of);
  const uint32_t r = pl::attn::next_record(at.counter.next_record, k, iteration);
  const auto records_of = [&](int32_t len) {
    return uint32_t(len + kTileN - 1) / kTileN * args.kv_heads;
  };
  if (!c.seek(r, documents, int32_t(args.rows), records_of, end_of)) return pl::WorkTile{};
  const uint32_t local = r - c.first_record;
  const int32_t len = c.row_end - c.row_begin;
  const int32_t kv_block = int32_t(local / args.kv_heads);
  const int32_t kv_begin = kv_block * kTileN;
  const pl::attn::Span queries = pl_attn_varlen_bwd_scheduler_mask_q_range(
      k, kv_begin, min(kv_begin + kTileN, len), len);
  const pl::attn::Span steps = pl::attn::query_steps(
      pl::attn::tiles_of(pl::attn::Span{max(queries.begin, 0), min(queries.end, len)}, kTileQ),
      args.kv_group);
  return pl::WorkTile{kv_block, int32_t(local % args.kv_heads), int32_t(c.document),
                      steps.begin, steps.end, 1, c.row_begin, c.row_end};
}
