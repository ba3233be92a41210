// attn_sparse_scheduler: persistent grid over the (sequence, head, query tile) work of
// a block-sparse attention forward; each record's steps are its BlockMask row's blocks.
#include "pl_attn_sparse_scheduler.h"

using Params = pl_params_attn_sparse_scheduler;

constexpr int32_t kTileM = Params::tile_m;

// Scheduler's perspective, one lane, per record.
extern "C" __device__ pl::WorkTile pl_attn_sparse_scheduler_schedule(
    const pl_place_attn_sparse_scheduler& at, const pl_args_attn_sparse_scheduler& args,
    const pl::KernelInfo& k, uint32_t iteration, pl_state_attn_sparse_scheduler_schedule&) {
  const uint32_t m_tiles = (args.seq + kTileM - 1) / kTileM;
  const uint32_t pairs = args.batch * args.heads;          // (sequence, head) pairs
  const uint32_t r = pl::attn::next_record(at.counter.next_record, k, iteration);
  if (r >= m_tiles * pairs) return pl::WorkTile{};
  const pl::attn::TileOrder at_r = pl::attn::lpt_order(r, m_tiles, pairs, args.section);
  const int32_t m_block = at_r.m_block;
  const uint32_t sequence = at_r.pair / args.heads;
  const uint32_t head = at_r.pair % args.heads;
  const uint32_t row = ((sequence % args.mask_batch) * args.mask_heads +
                        head % args.mask_heads) * args.q_blocks + uint32_t(m_block);
  // A row never lists more blocks than its index tensors hold: a corrupt count would
  // send the loader past them.
  const int32_t full = min(max(__ldg(args.full_kv_num_blocks + row), 0), int32_t(args.kv_blocks));
  const int32_t partial = min(max(__ldg(args.kv_num_blocks + row), 0), int32_t(args.kv_blocks));
  const int32_t first_row = int32_t(sequence * args.seq);
  return pl::WorkTile{m_block, int32_t(head), int32_t(sequence), 0, full + partial, 1,
                      first_row, first_row + int32_t(args.seq)};
}
