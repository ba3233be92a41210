// attn_sparse_bwd_scheduler: persistent grid over the (sequence, K/V head, key tile)
// work of a block-sparse attention backward; each record's slots are its BlockMask
// column's query blocks, cut into query tiles.
#include "pl_attn_sparse_bwd_scheduler.h"

using Params = pl_params_attn_sparse_bwd_scheduler;

constexpr int32_t kTileN = Params::tile_n;
constexpr int32_t kTilesPerBlock = Params::block / Params::tile_q;

static_assert(Params::tile_n == Params::block,
              "a record's key tile is one BlockMask block: tile_n = block (128)");
static_assert(Params::block % Params::tile_q == 0,
              "a BlockMask block is whole query tiles: make block a multiple of tile_q");

// Scheduler's perspective, one lane, per record: the iteration-th record of this block,
// or the end marker.
extern "C" __device__ pl::WorkTile pl_attn_sparse_bwd_scheduler_schedule(
    const pl_place_attn_sparse_bwd_scheduler& at, const pl_args_attn_sparse_bwd_scheduler& args,
    const pl::KernelInfo& k, uint32_t iteration, pl_state_attn_sparse_bwd_scheduler_schedule&) {
  const uint32_t r = pl::attn::next_record(at.counter.next_record, k, iteration);
  const pl::attn::DenseTile t = pl::attn::dense_tile(r, args.seq, kTileN, args.batch,
                                                     args.kv_heads, args.section);
  if (!t.valid) return pl::WorkTile{};
  // lpt_order hands out the last tile first; under a causal mask_mod a key tile's cost
  // falls with its index.
  const int32_t kv_block = (int32_t(args.seq) + kTileN - 1) / kTileN - 1 - t.m_block;
  // Every query head of the K/V head walks one column: the mask's head is the K/V
  // head's first query head (the same column for all when MH = 1, the only one when
  // kv_group = 1).
  const uint32_t head = uint32_t(t.head) * args.kv_group;
  const uint32_t column = pl::attn::block_mask_row(uint32_t(t.sequence), head,
                                                   uint32_t(kv_block), args.mask_batch,
                                                   args.mask_heads, args.kv_blocks);
  // A column never lists more blocks than its index tensors hold: a corrupt count would
  // send the loader past them.
  const int32_t full = min(max(__ldg(args.full_q_num_blocks + column), 0), int32_t(args.q_blocks));
  const int32_t partial = min(max(__ldg(args.q_num_blocks + column), 0), int32_t(args.q_blocks));
  const pl::attn::Span steps = pl::attn::query_steps(
      pl::attn::Span{0, (full + partial) * kTilesPerBlock}, args.kv_group);
  const int32_t first_row = t.sequence * int32_t(args.seq);
  return pl::WorkTile{kv_block, t.head, t.sequence, steps.begin, steps.end, 1, first_row,
                      first_row + int32_t(args.seq)};
}
