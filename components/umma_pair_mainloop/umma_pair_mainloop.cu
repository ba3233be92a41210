// umma_pair_mainloop: the MMA warp of a CTA-pair Blackwell GEMM. In the pair's leader
// the warp walks the operand rings together and one elected lane issues the tile's
// M = 256 tcgen05.mma.cta_group::2 into a Tensor Memory buffer that spans both CTAs;
// its commits reach both CTAs' barriers. The peer's MMA warp issues nothing.
#include <type_traits>

#include "pl_umma_pair_mainloop.h"
#include "pipelink/tcgen05.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM100_ALL)
#error "umma_pair_mainloop issues tcgen05.mma.cta_group::2, which only sm_100a has"
#endif

using Params = pl_params_umma_pair_mainloop;
using Element = Params::dtype;

constexpr uint32_t kTileM = Params::tile_m;                         // rows per CTA
constexpr uint32_t kTileN = Params::tile_n;
constexpr uint32_t kTileK = Params::tile_k;
constexpr uint32_t kPairM = 2 * kTileM;                             // rows per MMA
constexpr uint32_t kKSteps = kTileK / pl::tcgen05::kK;              // MMAs per k-tile
constexpr uint32_t kKStepBytes = pl::tcgen05::kK * sizeof(Element);  // along a K-major row
constexpr uint32_t kRowBytes = kTileK * sizeof(Element);
constexpr uint32_t kIdesc = pl::tcgen05::idesc_bf16_f32<kPairM, kTileN>();
constexpr uint32_t kLeader = 0;                                     // cluster rank that issues

static_assert(std::is_same_v<Element, __nv_bfloat16>,
              "this mainloop multiplies bf16: set dtype: bf16");
static_assert(kPairM == pl::tcgen05::kPairM,
              "one M = 256 MMA covers the pair's rows, 128 in each CTA: set tile_m to 128");
static_assert(kRowBytes == pl::tcgen05::kSwizzleBytes,
              "stages are 128-byte-swizzled K-major rows: set tile_k = 128 / sizeof(dtype)");

// The leader's MMA warp, per k-tile: wait until both CTAs' copies of the stage pair
// have landed (they complete on the leader's barriers), issue the MMAs from one lane,
// and release both CTAs' copies of the stages once the MMAs have read them.
__device__ __forceinline__ void issue_k_tile(const pl_place_umma_pair_mainloop& at, uint32_t d,
                                             bool first, pl_state_umma_pair_mainloop_mma& st) {
  pl::consumer_wait(at.port.a, st.a);
  pl::consumer_wait(at.port.b, st.b);
  pl::tcgen05::fence_after_thread_sync();
  if (pl::elect_one_sync()) {
    const uint64_t desc_a = pl::tcgen05::desc_sw128_kmajor(pl::stage_offset(at.port.a, st.a));
    const uint64_t desc_b = pl::tcgen05::desc_sw128_kmajor(pl::stage_offset(at.port.b, st.b));
#pragma unroll
    for (uint32_t s = 0; s < kKSteps; ++s) {
      // The tile's first MMA overwrites what the buffer's last tile left.
      pl::tcgen05::mma_ss_pair(d, pl::tcgen05::desc_advance(desc_a, s * kKStepBytes),
                               pl::tcgen05::desc_advance(desc_b, s * kKStepBytes), kIdesc,
                               !first || s > 0);
    }
    pl::tcgen05::commit_pair(pl::empty_barrier(at.port.a, st.a), pl::tcgen05::kPairMask);
    pl::tcgen05::commit_pair(pl::empty_barrier(at.port.b, st.b), pl::tcgen05::kPairMask);
  }
  __syncwarp();
  st.a.advance(at.port.a);
  st.b.advance(at.port.b);
}

// The MMA warp's perspective, per tile: in the leader, take a buffer both CTAs'
// readers have released, run the k-tiles into it and report it full to both CTAs (a
// tile with no k-tiles issues no MMA; the commit still arrives and the epilogues write
// zeros). In the peer, nothing: its rings and buffers are driven from the leader.
extern "C" __device__ void pl_umma_pair_mainloop_mma(const pl_place_umma_pair_mainloop& at,
                                                     const pl_args_umma_pair_mainloop&,
                                                     const pl::KernelInfo& k,
                                                     const pl::WorkTile& tile,
                                                     pl_state_umma_pair_mainloop_mma& st) {
  if (pl::cluster::rank() != kLeader) return;
  const uint32_t k_tiles = tile.k_tiles();
  pl::producer_acquire(at.port.acc, st.acc);
  pl::tcgen05::fence_after_thread_sync();
  const uint32_t d = k.tmem_base + pl::stage_column(at.port.acc, st.acc);
  for (uint32_t kt = 0; kt < k_tiles; ++kt) issue_k_tile(at, d, kt == 0, st);
  if (pl::elect_one_sync()) {
    pl::tcgen05::commit_pair(pl::full_barrier(at.port.acc, st.acc), pl::tcgen05::kPairMask);
  }
  __syncwarp();
  st.acc.advance(at.port.acc);
}
