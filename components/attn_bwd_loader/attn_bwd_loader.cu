// attn_bwd_loader: one producer warp streaming an attention backward's K and V tiles
// (once per key tile) and its Q and dO tiles (once per query step).
#include "pl_attn_bwd_loader.h"

using Params = pl_params_attn_bwd_loader;
using Element = Params::dtype;

constexpr uint32_t kTileN = Params::tile_n;
constexpr uint32_t kTileQ = Params::tile_q;
constexpr uint32_t kHeadDim = Params::head_dim;
constexpr uint32_t kBoxColumns = 128 / sizeof(Element);         // the maps' SWIZZLE_128B
constexpr uint32_t kBoxes = kHeadDim / kBoxColumns;             // boxes per tile
constexpr uint32_t kTileBytesKV = kTileN * kHeadDim * sizeof(Element);
constexpr uint32_t kTileBytesQ = kTileQ * kHeadDim * sizeof(Element);

static_assert(kHeadDim % kBoxColumns == 0,
              "a tile is whole 128-byte boxes: make head_dim a multiple of 64 (bf16)");
static_assert(kTileN <= pl::tma::kMaxBoxRows && kTileQ <= pl::tma::kMaxBoxRows,
              "a TMA box spans at most 256 rows: lower tile_n or tile_q");

// Producer's perspective, once: pull the four descriptors into the cache early.
extern "C" __device__ void pl_attn_bwd_loader_producer_init(const pl_place_attn_bwd_loader&,
                                                            const pl_args_attn_bwd_loader& args,
                                                            const pl::KernelInfo&,
                                                            pl_state_attn_bwd_loader_producer&) {
  if (!pl::elect_one_in_warp()) return;
  pl::tma::prefetch_descriptor(args.tma_q);
  pl::tma::prefetch_descriptor(args.tma_do);
  pl::tma::prefetch_descriptor(args.tma_k);
  pl::tma::prefetch_descriptor(args.tma_v);
}

// Producer's perspective, per record: the key tile's K and V, then Q and dO per step.
extern "C" __device__ void pl_attn_bwd_loader_producer(const pl_place_attn_bwd_loader& at,
                                                       const pl_args_attn_bwd_loader& args,
                                                       const pl::KernelInfo& k,
                                                       const pl::WorkTile& tile,
                                                       pl_state_attn_bwd_loader_producer& st) {
  const int32_t kv_row = tile.first_row(kTileN);
  // With one K/V stage this record's K and V can load only once the consumers are done
  // with the last record's, at its end, and every step then waits for them. The loader
  // reaches the record about the Q/dO ring's depth of steps earlier: bringing K and V
  // into L2 then has that load come from L2, not HBM. (With two stages the load itself
  // starts that early.)
  if (at.port.kv.stages == 1 && pl::elect_one_in_warp()) {
    pl::attn::prefetch_head_tile<kBoxes>(args.tma_k, tile.n_block, kv_row);
    pl::attn::prefetch_head_tile<kBoxes>(args.tma_v, tile.n_block, kv_row);
  }
  pl::producer_fill(at.port.kv, st.kv, 2 * kTileBytesKV, [&](uint32_t stage, uint32_t full) {
    pl::attn::load_head_tile<kTileN, kBoxes>(stage, args.tma_k, full, tile.n_block, kv_row);
    pl::attn::load_head_tile<kTileN, kBoxes>(stage + kTileBytesKV, args.tma_v, full,
                                              tile.n_block, kv_row);
  });
  st.kv.advance(at.port.kv);
  for (int32_t step = tile.k_begin; step < tile.k_end; ++step) {
    const pl::attn::QueryStep at_step = pl::attn::query_step(tile, step, args.kv_group);
    const int32_t q_tile = pl_attn_bwd_loader_q_tiles_q_tile(k, tile, at_step.head,
                                                             at_step.q_tile);
    const int32_t q_row = tile.m_offset + q_tile * int32_t(kTileQ);
    pl::producer_fill(at.port.q, st.q, kTileBytesQ, [&](uint32_t stage, uint32_t full) {
      pl::attn::load_head_tile<kTileQ, kBoxes>(stage, args.tma_q, full, at_step.head, q_row);
    });
    pl::producer_fill(at.port.d_o, st.d_o, kTileBytesQ, [&](uint32_t stage, uint32_t full) {
      pl::attn::load_head_tile<kTileQ, kBoxes>(stage, args.tma_do, full, at_step.head, q_row);
    });
    st.q.advance(at.port.q);
    st.d_o.advance(at.port.d_o);
  }
}
