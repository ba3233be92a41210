// tma_pair_loader: one producer warp per CTA of a CTA pair. Each CTA loads its rows of
// A and its half of B's rows into its own stages; the bytes complete on the leader's
// full barriers, which the leader arms for both CTAs.
#include <type_traits>

#include "pl_tma_pair_loader.h"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM100_ALL)
#error "tma_pair_loader feeds a cta_group::2 MMA, which only sm_100a has: build it for sm_100a"
#endif

using Params = pl_params_tma_pair_loader;
using Element = Params::dtype;

constexpr uint32_t kTileM = Params::tile_m;
constexpr uint32_t kTileN = Params::tile_n;              // the pair's B rows per tile
constexpr uint32_t kHalfN = kTileN / 2;                  // this CTA's share of them
constexpr uint32_t kTileK = Params::tile_k;
constexpr uint32_t kRowBytes = kTileK * sizeof(Element);
constexpr uint32_t kPairBytesA = 2 * kTileM * kRowBytes;  // both CTAs' A copies of a stage
constexpr uint32_t kPairBytesB = 2 * kHalfN * kRowBytes;  // both CTAs' B copies of a stage
constexpr uint32_t kSwizzleBytes = 128;                  // the tensor maps' SWIZZLE_128B
constexpr uint32_t kLeader = 0;                          // the pair's MMA-issuing CTA

static_assert(kRowBytes == kSwizzleBytes,
              "a 128-byte-swizzled K-major row holds 128 bytes: set tile_k = 128 / sizeof(dtype)");
static_assert(kTileM <= pl::tma::kMaxBoxRows && kHalfN <= pl::tma::kMaxBoxRows && kHalfN % 8 == 0,
              "a TMA box spans at most 256 rows in whole 8-row swizzle atoms: check tile_m "
              "and tile_n");

// Producer's perspective, once: pull both descriptors into the cache early.
extern "C" __device__ void pl_tma_pair_loader_producer_init(const pl_place_tma_pair_loader&,
                                                            const pl_args_tma_pair_loader& args,
                                                            const pl::KernelInfo&,
                                                            pl_state_tma_pair_loader_producer&) {
  if (!pl::elect_one_in_warp()) return;
  pl::tma::prefetch_descriptor(args.tma_a);
  pl::tma::prefetch_descriptor(args.tma_b);
}

// One stage of one ring: wait for this CTA's copy of it to be free, then (one elected
// lane) the leader arms its full barrier for both CTAs' bytes and each CTA issues its
// copy, completing on the leader's barrier.
template <class Load>
__device__ __forceinline__ void fill(const pl::PipePort& port, const pl::PipeState& s,
                                     bool leader, uint32_t pair_bytes, Load&& load) {
  pl::producer_acquire(port, s);
  if (pl::elect_one_sync()) {
    if (leader) pl::producer_expect(port, s, pair_bytes);
    load(pl::stage_offset(port, s), pl::cluster::peer_addr(pl::full_barrier(port, s), kLeader));
  }
  __syncwarp();
}

// Producer's perspective, per tile: this CTA's rows of A and half of B, k-tile by k-tile.
extern "C" __device__ void pl_tma_pair_loader_producer(const pl_place_tma_pair_loader& at,
                                                       const pl_args_tma_pair_loader& args,
                                                       const pl::KernelInfo&,
                                                       const pl::WorkTile& tile,
                                                       pl_state_tma_pair_loader_producer& st) {
  const uint32_t rank = pl::cluster::rank();
  const bool leader = rank == kLeader;
  const int32_t row_a = tile.m_block * int32_t(kTileM);
  const int32_t row_b = tile.n_block * int32_t(kTileN) + int32_t(rank * kHalfN);
  for (int32_t k = tile.k_begin; k < tile.k_end; ++k) {
    const int32_t col = k * int32_t(kTileK);
    fill(at.port.a, st.a, leader, kPairBytesA, [&](uint32_t stage, uint32_t full) {
      pl::tma::load_2d_pair(stage, args.tma_a, full, col, row_a);
    });
    fill(at.port.b, st.b, leader, kPairBytesB, [&](uint32_t stage, uint32_t full) {
      pl::tma::load_2d_pair(stage, args.tma_b, full, col, row_b);
    });
    st.a.advance(at.port.a);
    st.b.advance(at.port.b);
  }
}
