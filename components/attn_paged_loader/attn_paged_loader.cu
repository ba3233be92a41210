// attn_paged_loader: attn_loader with K and V gathered page by page from a paged cache.
// Rows r of a key tile come from cache row block_table[b, r / page] * page + r % page.
#include "pl_attn_paged_loader.h"

using Params = pl_params_attn_paged_loader;
using Element = Params::dtype;

constexpr uint32_t kTileM = Params::tile_m;
constexpr uint32_t kTileN = Params::tile_n;
constexpr uint32_t kHeadDim = Params::head_dim;
constexpr uint32_t kPage = Params::page;
constexpr uint32_t kSwizzleBytes = 128;                        // the maps' SWIZZLE_128B
constexpr uint32_t kSwizzleRows = 8;                           // rows of one swizzle atom
constexpr uint32_t kBoxColumns = kSwizzleBytes / sizeof(Element);
constexpr uint32_t kBoxes = kHeadDim / kBoxColumns;            // 64-column boxes per tile
constexpr uint32_t kPagesPerTile = kTileN / kPage;
constexpr uint32_t kTileBytesQ = kTileM * kHeadDim * sizeof(Element);
constexpr uint32_t kTileBytesKV = kTileN * kHeadDim * sizeof(Element);

static_assert(kHeadDim % kBoxColumns == 0,
              "a tile is whole 128-byte boxes: make head_dim a multiple of 64 (bf16)");
static_assert(kTileM <= pl::tma::kMaxBoxRows, "a TMA box spans at most 256 rows: lower tile_m");
static_assert(kTileN % kPage == 0 && kPage % kSwizzleRows == 0 &&
                  kPage <= pl::tma::kMaxBoxRows,
              "a key tile is whole pages of whole 8-row swizzle atoms: page divides tile_n, "
              "is a multiple of 8 and at most 256");

// The cache rows where key tile `kv` of sequence `sequence` starts, page by page. A page
// past the sequence's table takes the table's last page instead (the core masks keys
// past the sequence), so every stage lands the same bytes.
struct PageRows {
  int32_t row[kPagesPerTile];
};

__device__ __forceinline__ PageRows page_rows(const pl_args_attn_paged_loader& args,
                                              int32_t sequence, int32_t kv) {
  const int32_t* table = args.block_table + size_t(sequence) * args.pages_per_seq;
  const int32_t last_page = int32_t(args.pages_per_seq) - 1;
  PageRows rows;
#pragma unroll
  for (uint32_t p = 0; p < kPagesPerTile; ++p) {
    const int32_t page = min(kv * int32_t(kPagesPerTile) + int32_t(p), last_page);
    rows.row[p] = __ldg(table + page) * int32_t(kPage);
  }
  return rows;
}

// A key tile from a paged cache: each page's rows where a contiguous load would put them.
__device__ __forceinline__ void load_paged(uint32_t stage, const pl::TensorMap* map,
                                           uint32_t full, int32_t head, const PageRows& rows) {
#pragma unroll
  for (uint32_t p = 0; p < kPagesPerTile; ++p) {
#pragma unroll
    for (uint32_t b = 0; b < kBoxes; ++b) {
      pl::tma::load_3d(stage + (b * kTileN + p * kPage) * kSwizzleBytes, map, full,
                       int32_t(b * kBoxColumns), head, rows.row[p]);
    }
  }
}

extern "C" __device__ void pl_attn_paged_loader_producer_init(
    const pl_place_attn_paged_loader&, const pl_args_attn_paged_loader& args,
    const pl::KernelInfo&, pl_state_attn_paged_loader_producer&) {
  if (!pl::elect_one_in_warp()) return;
  pl::tma::prefetch_descriptor(args.tma_q);
  pl::tma::prefetch_descriptor(args.tma_k);
  pl::tma::prefetch_descriptor(args.tma_v);
}

// Producer's perspective, per record: the query tile, then K and V per step.
extern "C" __device__ void pl_attn_paged_loader_producer(const pl_place_attn_paged_loader& at,
                                                         const pl_args_attn_paged_loader& args,
                                                         const pl::KernelInfo& k,
                                                         const pl::WorkTile& tile,
                                                         pl_state_attn_paged_loader_producer& st) {
  const int32_t head = tile.n_block;
  const int32_t kv_head = head / int32_t(args.kv_group);
  // Each step's page rows are read while the stages before it fill: the block table's
  // latency stays off the producer's path.
  const auto rows_of = [&](int32_t step) {
    return page_rows(args, tile.group, pl_attn_paged_loader_blocks_kv_tile(k, tile, step).index);
  };
  PageRows rows = tile.k_begin < tile.k_end ? rows_of(tile.k_begin) : PageRows{};
  pl::producer_fill(at.port.q, st.q, kTileBytesQ, [&](uint32_t stage, uint32_t full) {
    pl::attn::load_head_tile<kTileM, kBoxes>(stage, args.tma_q, full, head,
                                              tile.first_row(kTileM));
  });
  st.q.advance(at.port.q);
  for (int32_t step = tile.k_begin; step < tile.k_end; ++step) {
    const PageRows here = rows;
    if (step + 1 < tile.k_end) rows = rows_of(step + 1);
    pl::producer_fill(at.port.k, st.k, kTileBytesKV, [&](uint32_t stage, uint32_t full) {
      load_paged(stage, args.tma_k, full, kv_head, here);
    });
    pl::producer_fill(at.port.v, st.v, kTileBytesKV, [&](uint32_t stage, uint32_t full) {
      load_paged(stage, args.tma_v, full, kv_head, here);
    });
    st.k.advance(at.port.k);
    st.v.advance(at.port.v);
  }
}
