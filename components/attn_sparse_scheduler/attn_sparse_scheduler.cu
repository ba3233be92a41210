// attn_sparse_scheduler: persistent grid over the (sequence, head, query tile) work of
// a block-sparse attention forward; each record's steps are its BlockMask row's blocks.
#include "pl_attn_sparse_scheduler.h"

using Params = pl_params_attn_sparse_scheduler;

constexpr int32_t kTileM = Params::tile_m;

// Scheduler's perspective, one lane, per record.
extern "C" __device__ pl::WorkTile pl_attn_sparse_scheduler_schedule(
    const pl_place_attn_sparse_scheduler& at, const pl_args_attn_sparse_scheduler& args,
    const pl::KernelInfo& k, uint32_t iteration, pl_state_attn_sparse_scheduler_schedule&) {
  const uint32_t r = pl::attn::next_record(at.counter.next_record, k, iteration);
  const pl::attn::DenseTile t = pl::attn::dense_tile(r, args.seq, kTileM, args.batch,
                                                     args.heads, args.section);
  if (!t.valid) return pl::WorkTile{};
  const uint32_t row = ((uint32_t(t.sequence) % args.mask_batch) * args.mask_heads +
                        uint32_t(t.head) % args.mask_heads) * args.q_blocks +
                       uint32_t(t.m_block);
  // A row never lists more blocks than its index tensors hold: a corrupt count would
  // send the loader past them.
  const int32_t full = min(max(__ldg(args.full_kv_num_blocks + row), 0), int32_t(args.kv_blocks));
  const int32_t partial = min(max(__ldg(args.kv_num_blocks + row), 0), int32_t(args.kv_blocks));
  const int32_t first_row = t.sequence * int32_t(args.seq);
  return pl::WorkTile{t.m_block, t.head, t.sequence, 0, full + partial, 1, first_row,
                      first_row + int32_t(args.seq)};
}
