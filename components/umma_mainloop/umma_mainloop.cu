// umma_mainloop: the MMA warp of a warp-specialised Blackwell GEMM. The warp walks the
// operand rings together; one elected lane issues the tile's tcgen05.mma into a Tensor
// Memory accumulator buffer, and its commits hand the operand stages back as the MMAs
// finish reading them and the finished buffer to the epilogue warps. With a CTA pair
// (cta_group 2) only the pair's leader issues, M = 256 over both CTAs, and every commit
// reaches both CTAs.
#include <type_traits>

#include "pl_umma_mainloop.h"
#include "pipelink/tcgen05.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM100_ALL)
#error "umma_mainloop issues tcgen05.mma, which only sm_100a has: build it for sm_100a"
#endif

using Params = pl_params_umma_mainloop;
using Element = Params::dtype;

constexpr uint32_t kTileM = Params::tile_m;                         // rows per CTA
constexpr uint32_t kTileN = Params::tile_n;
constexpr uint32_t kTileK = Params::tile_k;
constexpr uint32_t kCtaGroup = Params::cta_group;
constexpr bool kPair = kCtaGroup == 2;
constexpr uint32_t kMmaM = kCtaGroup * kTileM;                      // rows per MMA
constexpr uint32_t kKSteps = kTileK / pl::tcgen05::kK;              // MMAs per k-tile
constexpr uint32_t kRowBytes = kTileK * sizeof(Element);
constexpr bool kMnMajorA = pl::mn_major(Params::a_major);
constexpr bool kMnMajorB = pl::mn_major(Params::b_major);
using OperandA = pl::tcgen05::Sw128Operand<kMnMajorA, kTileK>;
using OperandB = pl::tcgen05::Sw128Operand<kMnMajorB, kTileK>;
constexpr uint32_t kIdesc = pl::tcgen05::idesc_bf16_f32<kMmaM, kTileN, kMnMajorA, kMnMajorB>();
constexpr uint32_t kLeader = 0;                                     // a pair's issuing rank

static_assert(std::is_same_v<Element, __nv_bfloat16>,
              "this mainloop multiplies bf16: set dtype: bf16");
static_assert(kCtaGroup == 1 || kCtaGroup == 2, "cta_group is 1 (one CTA) or 2 (a CTA pair)");
static_assert(kTileM == pl::tcgen05::kFullM,
              "row r of D is lane r of a CTA's Tensor Memory: set tile_m to 128");
static_assert(kRowBytes == pl::tcgen05::kSwizzleBytes,
              "a stage's K spans one 128-byte swizzled row: set tile_k = 128 / sizeof(dtype)");
static_assert(pl::known_major(Params::a_major) && pl::known_major(Params::b_major),
              "a_major and b_major are k (K contiguous) or mn (M or N contiguous)");

// One MMA, and one commit arrival on the barrier at `mbar` once the MMAs so far are
// done: on this CTA, or on both CTAs of the pair.
__device__ __forceinline__ void mma(uint32_t d, uint64_t a, uint64_t b, uint32_t accumulate) {
  if constexpr (kPair) {
    pl::tcgen05::mma_ss_pair(d, a, b, kIdesc, accumulate);
  } else {
    pl::tcgen05::mma_ss(d, a, b, kIdesc, accumulate);
  }
}

__device__ __forceinline__ void commit(uint32_t mbar) {
  if constexpr (kPair) {
    pl::tcgen05::commit_pair(mbar, pl::tcgen05::kPairMask);
  } else {
    pl::tcgen05::commit(mbar);
  }
}

// The MMA warp's perspective, per k-tile: the whole warp waits for the stage pair
// (for a CTA pair, both CTAs' copies land on the leader's barriers); one elected lane
// issues its MMAs and hands the stages back once those MMAs have read them.
__device__ __forceinline__ void issue_k_tile(const pl_place_umma_mainloop& at, uint32_t d,
                                             bool first, pl_state_umma_mainloop_mma& st) {
  pl::consumer_wait(at.port.a, st.a);
  pl::consumer_wait(at.port.b, st.b);
  pl::tcgen05::fence_after_thread_sync();
  if (pl::elect_one_sync()) {
    const uint64_t desc_a = OperandA::desc(pl::stage_offset(at.port.a, st.a));
    const uint64_t desc_b = OperandB::desc(pl::stage_offset(at.port.b, st.b));
#pragma unroll
    for (uint32_t s = 0; s < kKSteps; ++s) {
      // The tile's first MMA overwrites what the buffer's last tile left.
      mma(d, pl::tcgen05::desc_advance(desc_a, s * OperandA::kKStepBytes),
          pl::tcgen05::desc_advance(desc_b, s * OperandB::kKStepBytes), !first || s > 0);
    }
    commit(pl::empty_barrier(at.port.a, st.a));
    commit(pl::empty_barrier(at.port.b, st.b));
  }
  __syncwarp();
  st.a.advance(at.port.a);
  st.b.advance(at.port.b);
}

// The MMA warp's perspective, per tile: take a free accumulator buffer (its readers
// have released it), run the k-tiles into it, and report it full. A tile with no
// k-tiles issues no MMA: the commit still arrives, and the epilogue, which reads the
// same record, writes zeros instead of reading the buffer. A pair's peer issues
// nothing: its rings and buffers are driven from the leader.
extern "C" __device__ void pl_umma_mainloop_mma(const pl_place_umma_mainloop& at,
                                                const pl_args_umma_mainloop&,
                                                const pl::KernelInfo& k, const pl::WorkTile& tile,
                                                pl_state_umma_mainloop_mma& st) {
  if (kPair && pl::cluster::rank() != kLeader) return;
  const uint32_t k_tiles = tile.k_tiles();
  pl::producer_acquire(at.port.acc, st.acc);
  pl::tcgen05::fence_after_thread_sync();
  const uint32_t d = k.tmem_base + pl::stage_column(at.port.acc, st.acc);
  for (uint32_t kt = 0; kt < k_tiles; ++kt) issue_k_tile(at, d, kt == 0, st);
  if (pl::elect_one_sync()) commit(pl::full_barrier(at.port.acc, st.acc));
  __syncwarp();
  st.acc.advance(at.port.acc);
}
