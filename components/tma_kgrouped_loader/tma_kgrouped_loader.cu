// tma_kgrouped_loader: the producer warp of a GEMM whose problems are packed along K.
// Per kgrouped_tile record it streams the problem's k-tiles of A [K, M] and B [K, N]
// (both MN-major in shared memory) into two rings; the copy engine completes each
// stage's full barrier.
#include "pl_tma_kgrouped_loader.h"

using Params = pl_params_tma_kgrouped_loader;
using Element = Params::dtype;

constexpr uint32_t kTileM = Params::tile_m;
constexpr uint32_t kTileN = Params::tile_n;
constexpr uint32_t kTileK = Params::tile_k;
constexpr uint32_t kSwizzleBytes = 128;                // the tensor maps' SWIZZLE_128B
constexpr uint32_t kTileBytesA = kTileM * kTileK * sizeof(Element);
constexpr uint32_t kTileBytesB = kTileN * kTileK * sizeof(Element);
constexpr bool kMnMajor = true;                        // K is the packed (row) dimension
constexpr bool kGrouped = false;                       // no group dimension: rows are K

static_assert(kTileK * sizeof(Element) == kSwizzleBytes,
              "the MMA steps K in 128-byte swizzle atoms: set tile_k = 128 / sizeof(dtype)");

// Producer's perspective, once: pull both descriptors into the cache early.
extern "C" __device__ void pl_tma_kgrouped_loader_producer_init(
    const pl_place_tma_kgrouped_loader&, const pl_args_tma_kgrouped_loader& args,
    const pl::KernelInfo&, pl_state_tma_kgrouped_loader_producer&) {
  if (!pl::elect_one_in_warp()) return;
  pl::tma::prefetch_descriptor(args.tma_a);
  pl::tma::prefetch_descriptor(args.tma_b);
}

// Producer's perspective, per tile: the problem's k-tiles, one stage of each ring per
// k-tile. M and N indices carry no problem offset: every problem spans all of A's and
// B's columns; its rows (K) are the record's k range.
extern "C" __device__ void pl_tma_kgrouped_loader_producer(
    const pl_place_tma_kgrouped_loader& at, const pl_args_tma_kgrouped_loader& args,
    const pl::KernelInfo&, const pl::WorkTile& tile, pl_state_tma_kgrouped_loader_producer& st) {
  const int32_t first_m = tile.m_block * int32_t(kTileM);
  const int32_t first_n = tile.n_block * int32_t(kTileN);
  for (int32_t k = tile.k_begin; k < tile.k_end; ++k) {
    const int32_t row = k * int32_t(kTileK);
    pl::producer_fill(at.port.a, st.a, kTileBytesA, [&](uint32_t stage, uint32_t full) {
      pl::tma::load_operand<Element, kMnMajor, kTileM, kTileK, kGrouped>(stage, args.tma_a,
                                                                         full, first_m, row, 0);
    });
    pl::producer_fill(at.port.b, st.b, kTileBytesB, [&](uint32_t stage, uint32_t full) {
      pl::tma::load_operand<Element, kMnMajor, kTileN, kTileK, kGrouped>(stage, args.tma_b,
                                                                         full, first_n, row, 0);
    });
    st.a.advance(at.port.a);
    st.b.advance(at.port.b);
  }
}
