// tma_loader: one producer warp feeding a GEMM mainloop. Per work tile (m, n) it
// streams the record's k-tiles [k_begin, k_end) as pairs of tiles, A (TILE_M, TILE_K)
// and B (TILE_N, TILE_K), into two rings with TMA; the copy engine completes each
// stage's full barrier. A K-major operand is one box per stage, an MN-major one a box
// of 64 M (or N) columns by TILE_K rows per 64 of the tile (pl::tma::load_operand).
// B's map has a group dimension: grouped work reads B[group] (a plain matrix is group 0 of one).
#include "pl_tma_loader.h"

using Params = pl_params_tma_loader;
using Element = Params::dtype;

constexpr uint32_t kTileM = Params::tile_m;
constexpr uint32_t kTileN = Params::tile_n;
constexpr uint32_t kTileK = Params::tile_k;
constexpr bool kMnMajorA = pl::mn_major(Params::a_major);
constexpr bool kMnMajorB = pl::mn_major(Params::b_major);
constexpr uint32_t kRowBytes = kTileK * sizeof(Element);
constexpr uint32_t kTileBytesA = kTileM * kRowBytes;   // (TILE_M, TILE_K)
constexpr uint32_t kTileBytesB = kTileN * kRowBytes;   // (TILE_N, TILE_K)
constexpr uint32_t kSwizzleBytes = 128;                // the tensor maps' SWIZZLE_128B
constexpr uint32_t kBlockColumns = kSwizzleBytes / sizeof(Element);  // MN-major box width

static_assert(kRowBytes == kSwizzleBytes,
              "a stage's K spans one 128-byte swizzled row: set tile_k = 128 / sizeof(dtype)");
static_assert(kTileM <= pl::tma::kMaxBoxRows && kTileN <= pl::tma::kMaxBoxRows,
              "a TMA box spans at most 256 rows: lower tile_m or tile_n");
static_assert(kTileM % 8 == 0 && kTileN % 8 == 0,
              "swizzle atoms are 8 rows: make tile_m and tile_n multiples of 8");
static_assert(pl::known_major(Params::a_major) && pl::known_major(Params::b_major),
              "a_major and b_major are k (K contiguous) or mn (M or N contiguous)");
static_assert((!kMnMajorA || kTileM % kBlockColumns == 0) &&
                  (!kMnMajorB || kTileN % kBlockColumns == 0),
              "an MN-major tile is whole 64-wide boxes: make tile_m (tile_n) a multiple of 64");

// Producer's perspective, once: pull both descriptors into the cache early.
extern "C" __device__ void pl_tma_loader_producer_init(const pl_place_tma_loader&,
                                                       const pl_args_tma_loader& args,
                                                       const pl::KernelInfo&,
                                                       pl_state_tma_loader_producer&) {
  if (!pl::elect_one_in_warp()) return;
  pl::tma::prefetch_descriptor(args.tma_a);
  pl::tma::prefetch_descriptor(args.tma_b);
}

// Producer's perspective, per tile: each stage of both rings filled by TMA
// (pl::producer_fill: the warp waits, one elected lane arms the barrier and copies).
extern "C" __device__ void pl_tma_loader_producer(const pl_place_tma_loader& at,
                                                  const pl_args_tma_loader& args,
                                                  const pl::KernelInfo&, const pl::WorkTile& tile,
                                                  pl_state_tma_loader_producer& st) {
  const int32_t first_a = tile.first_row(kTileM);   // rows past m_end are loaded, not stored
  const int32_t first_b = tile.n_block * int32_t(kTileN);
  for (int32_t k = tile.k_begin; k < tile.k_end; ++k) {
    const int32_t k_index = k * int32_t(kTileK);
    pl::producer_fill(at.port.a, st.a, kTileBytesA, [&](uint32_t stage, uint32_t full) {
      pl::tma::load_operand<Element, kMnMajorA, kTileM, kTileK, false>(stage, args.tma_a, full,
                                                                       first_a, k_index, 0);
    });
    pl::producer_fill(at.port.b, st.b, kTileBytesB, [&](uint32_t stage, uint32_t full) {
      pl::tma::load_operand<Element, kMnMajorB, kTileN, kTileK, true>(stage, args.tma_b, full,
                                                                      first_b, k_index,
                                                                      tile.group);
    });
    st.a.advance(at.port.a);
    st.b.advance(at.port.b);
  }
}
