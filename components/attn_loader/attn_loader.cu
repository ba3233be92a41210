// attn_loader: one producer warp streaming an attention core's Q, K and V tiles.
// A tile of head_dim columns is head_dim / 64 swizzled boxes of (64 columns, 1 head,
// rows), each `rows * 128` bytes, side by side in the stage.
#include "pl_attn_loader.h"

using Params = pl_params_attn_loader;
using Element = Params::dtype;

constexpr uint32_t kTileM = Params::tile_m;
constexpr uint32_t kTileN = Params::tile_n;
constexpr uint32_t kHeadDim = Params::head_dim;
constexpr uint32_t kSwizzleBytes = 128;                        // the maps' SWIZZLE_128B
constexpr uint32_t kBoxColumns = kSwizzleBytes / sizeof(Element);
constexpr uint32_t kBoxes = kHeadDim / kBoxColumns;            // boxes per tile
constexpr uint32_t kTileBytesQ = kTileM * kHeadDim * sizeof(Element);
constexpr uint32_t kTileBytesKV = kTileN * kHeadDim * sizeof(Element);

static_assert(kHeadDim % kBoxColumns == 0,
              "a tile is whole 128-byte boxes: make head_dim a multiple of 64 (bf16)");
static_assert(kTileM <= pl::tma::kMaxBoxRows && kTileN <= pl::tma::kMaxBoxRows,
              "a TMA box spans at most 256 rows: lower tile_m or tile_n");
static_assert(kTileM % 64 == 0 && kTileN % 64 == 0,
              "cores split tiles in 64-row warpgroup slices: make tile_m, tile_n multiples "
              "of 64");

// Producer's perspective, once: pull the three descriptors into the cache early.
extern "C" __device__ void pl_attn_loader_producer_init(const pl_place_attn_loader&,
                                                        const pl_args_attn_loader& args,
                                                        const pl::KernelInfo&,
                                                        pl_state_attn_loader_producer&) {
  if (!pl::elect_one_in_warp()) return;
  pl::tma::prefetch_descriptor(args.tma_q);
  pl::tma::prefetch_descriptor(args.tma_k);
  pl::tma::prefetch_descriptor(args.tma_v);
}

// Producer's perspective, per record: the query tile, then K and V per step (its key
// tile from the blocks function).
extern "C" __device__ void pl_attn_loader_producer(const pl_place_attn_loader& at,
                                                   const pl_args_attn_loader& args,
                                                   const pl::KernelInfo& k,
                                                   const pl::WorkTile& tile,
                                                   pl_state_attn_loader_producer& st) {
  const int32_t head = tile.n_block;
  const int32_t kv_head = head / int32_t(args.kv_group);
  // Each step's key tile is read while the stages before it fill (a block-sparse layout
  // answers from global memory: its latency stays off the producer's path).
  const bool any = tile.k_begin < tile.k_end;
  int32_t kv = any ? pl_attn_loader_blocks_kv_tile(k, tile, tile.k_begin).index : 0;
  pl::producer_fill(at.port.q, st.q, kTileBytesQ, [&](uint32_t stage, uint32_t full) {
    pl::attn::load_head_tile<kTileM, kBoxes>(stage, args.tma_q, full, head,
                                              tile.first_row(kTileM));
  });
  st.q.advance(at.port.q);
  for (int32_t step = tile.k_begin; step < tile.k_end; ++step) {
    const int32_t row = tile.m_offset + kv * int32_t(kTileN);
    if (step + 1 < tile.k_end) kv = pl_attn_loader_blocks_kv_tile(k, tile, step + 1).index;
    pl::producer_fill(at.port.k, st.k, kTileBytesKV, [&](uint32_t stage, uint32_t full) {
      pl::attn::load_head_tile<kTileN, kBoxes>(stage, args.tma_k, full, kv_head, row);
    });
    pl::producer_fill(at.port.v, st.v, kTileBytesKV, [&](uint32_t stage, uint32_t full) {
      pl::attn::load_head_tile<kTileN, kBoxes>(stage, args.tma_v, full, kv_head, row);
    });
    st.k.advance(at.port.k);
    st.v.advance(at.port.v);
  }
}
