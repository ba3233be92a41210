// tma_multicast_loader: one producer warp per CTA of a pair. A is this CTA's own; each
// CTA loads half of the shared B tile and multicasts it into both CTAs' stage. A B
// stage's empty barrier completes only once the consumers of both CTAs have released
// it (the b port's multicast: 2), so waiting on it is enough before refilling.
#include <type_traits>

#include "pl_tma_multicast_loader.h"

using Params = pl_params_tma_multicast_loader;
using Element = Params::dtype;

constexpr uint32_t kTileM = Params::tile_m;
constexpr uint32_t kTileN = Params::tile_n;
constexpr uint32_t kHalfN = kTileN / 2;                  // the B rows this CTA loads
constexpr uint32_t kTileK = Params::tile_k;
constexpr uint32_t kRowBytes = kTileK * sizeof(Element);
constexpr uint32_t kTileBytesA = kTileM * kRowBytes;
constexpr uint32_t kTileBytesB = kTileN * kRowBytes;     // both halves land in every CTA
constexpr uint32_t kHalfBytesB = kHalfN * kRowBytes;     // where the second half starts
constexpr uint32_t kSwizzleBytes = 128;                  // the tensor maps' SWIZZLE_128B
constexpr uint32_t kSwizzleAtomBytes = 1024;             // 8 swizzled rows
constexpr uint16_t kPair = 0b11;                         // both CTAs of the cluster

static_assert(kRowBytes == kSwizzleBytes,
              "a 128-byte-swizzled K-major row holds 128 bytes: set tile_k = 128 / sizeof(dtype)");
static_assert(kTileM <= pl::tma::kMaxBoxRows && kHalfN <= pl::tma::kMaxBoxRows,
              "a TMA box spans at most 256 rows: lower tile_m or tile_n");
static_assert(kHalfBytesB % kSwizzleAtomBytes == 0,
              "each half of B must start on a swizzle atom: make tile_n a multiple of 16");

// Producer's perspective, once: pull both descriptors into the cache early.
extern "C" __device__ void pl_tma_multicast_loader_producer_init(
    const pl_place_tma_multicast_loader&, const pl_args_tma_multicast_loader& args,
    const pl::KernelInfo&, pl_state_tma_multicast_loader_producer&) {
  if (!pl::elect_one_in_warp()) return;
  pl::tma::prefetch_descriptor(args.tma_a);
  pl::tma::prefetch_descriptor(args.tma_b);
}

// Producer's perspective, per tile: this CTA's rows of A, and its half of B into both
// CTAs, k-tile by k-tile.
extern "C" __device__ void pl_tma_multicast_loader_producer(
    const pl_place_tma_multicast_loader& at, const pl_args_tma_multicast_loader& args,
    const pl::KernelInfo&, const pl::WorkTile& tile, pl_state_tma_multicast_loader_producer& st) {
  const uint32_t rank = pl::cluster::rank();
  const int32_t row_a = tile.m_block * int32_t(kTileM);
  const int32_t row_b = tile.n_block * int32_t(kTileN) + int32_t(rank * kHalfN);
  for (int32_t k = tile.k_begin; k < tile.k_end; ++k) {
    const int32_t col = k * int32_t(kTileK);
    pl::producer_fill(at.port.a, st.a, kTileBytesA, [&](uint32_t stage, uint32_t full) {
      pl::tma::load_2d(stage, args.tma_a, full, col, row_a);
    });
    // This CTA's half of B lands in both CTAs' stage; each CTA's barrier expects both.
    pl::producer_fill(at.port.b, st.b, kTileBytesB, [&](uint32_t stage, uint32_t full) {
      pl::tma::load_2d_multicast(stage + rank * kHalfBytesB, args.tma_b, full, col, row_b,
                                 kPair);
    });
    st.a.advance(at.port.a);
    st.b.advance(at.port.b);
  }
}
