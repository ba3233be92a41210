// wgmma_mainloop: the consumer warpgroups of a warp-specialised Hopper GEMM.
// Warpgroup g multiplies rows [64g, 64g+64) of each A stage by the whole B stage and
// accumulates a (64, TILE_N) fp32 block in registers, handed to the epilogue. Either
// operand's stages may be K-major or MN-major (params a_major, b_major).
#include <type_traits>

#include "pl_wgmma_mainloop.h"
#include "pipelink/wgmma.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "wgmma_mainloop issues wgmma, which only sm_90a has: build it for sm_90a"
#endif

using Params = pl_params_wgmma_mainloop;

static_assert(Params::multicast_b == 1 || Params::multicast_b == 2,
              "B is read by one CTA or multicast across a CTA pair: set multicast_b to 1 or 2");
using Element = Params::dtype;

constexpr uint32_t kTileM = Params::tile_m;
constexpr uint32_t kTileN = Params::tile_n;
constexpr uint32_t kTileK = Params::tile_k;
constexpr uint32_t kWarpgroups = kTileM / pl::wgmma::kM;
constexpr uint32_t kAccCount = pl::wgmma::kM * kTileN / pl::kWarpgroupThreads;  // per thread
constexpr uint32_t kKSteps = kTileK / pl::wgmma::kK;               // wgmma per stage
constexpr uint32_t kRowBytes = kTileK * sizeof(Element);
constexpr uint32_t kAccumulate = 1;                                 // wgmma scale-d: D += A B
constexpr bool kMnMajorA = pl::mn_major(Params::a_major);
constexpr bool kMnMajorB = pl::mn_major(Params::b_major);
using OperandA = pl::wgmma::Sw128Operand<kMnMajorA, kTileK>;
using OperandB = pl::wgmma::Sw128Operand<kMnMajorB, kTileK>;
constexpr uint32_t kWarpgroupBytesA = OperandA::kRows64Bytes;      // (64, TILE_K) of A

static_assert(std::is_same_v<Element, __nv_bfloat16>,
              "this mainloop multiplies bf16: set dtype: bf16");
static_assert(kTileM % pl::wgmma::kM == 0 && kWarpgroups >= 1,
              "each consumer warpgroup owns 64 rows: make tile_m a multiple of 64");
static_assert(kTileN == 64 || kTileN == 128 || kTileN == 168 || kTileN == 192 || kTileN == 256,
              "one wgmma covers the tile's width: set tile_n to 64, 128, 168, 192 or 256");
static_assert(kRowBytes == pl::wgmma::kSwizzleBytes,
              "a stage's K spans one 128-byte swizzled row: set tile_k = 128 / sizeof(dtype)");
static_assert(pl::known_major(Params::a_major) && pl::known_major(Params::b_major),
              "a_major and b_major are k (K contiguous) or mn (M or N contiguous)");
static_assert(kWarpgroupBytesA % pl::wgmma::kSwizzleAtomBytes == 0,
              "a warpgroup's rows of A must start on a 1024-byte swizzle atom");

// One warpgroup's perspective: hands both stages of the k-tile whose wgmma batch
// retired back to the producer (one arrival per warpgroup, from its first thread).
__device__ __forceinline__ void release(const pl_place_wgmma_mainloop& at, bool releaser,
                                        pl::PipeState& a, pl::PipeState& b) {
  if (releaser) {
    pl::consumer_release(at.port.a, a);
    pl::consumer_release_all<Params::multicast_b>(at.port.b, b);
  }
  a.advance(at.port.a);
  b.advance(at.port.b);
}

// Consumer warpgroups' perspective, per tile: wait for a stage pair, issue its
// wgmma batch, then retire the previous batch and release its stages, so one batch
// is always in flight behind the next wait.
extern "C" __device__ void pl_wgmma_mainloop_mma(const pl_place_wgmma_mainloop& at,
                                                 const pl_args_wgmma_mainloop&,
                                                 const pl::KernelInfo&, const pl::WorkTile& tile,
                                                 pl_state_wgmma_mainloop_mma& st,
                                                 float (&acc)[kAccCount]) {
  const uint32_t warpgroup = pl::warpgroup_in_role(at.role.mma);
  const bool releaser = pl::thread_in_role(at.role.mma) % pl::kWarpgroupThreads == 0;
  const uint32_t a_rows = warpgroup * kWarpgroupBytesA;   // this warpgroup's rows of A
  // Zeroing, rather than a first wgmma that ignores D, ends the accumulators' life at
  // the previous tile's epilogue: nothing stays live across the tile boundary.
#pragma unroll
  for (uint32_t i = 0; i < kAccCount; ++i) acc[i] = 0.0f;
  const uint32_t k_tiles = tile.k_tiles();   // the loader's count: both read the record
  if (k_tiles == 0) return;
  pl::PipeState retire_a = st.a, retire_b = st.b;
  for (uint32_t k = 0; k < k_tiles; ++k) {
    pl::consumer_wait(at.port.a, st.a);
    pl::consumer_wait(at.port.b, st.b);
    const uint64_t desc_a = OperandA::desc(pl::stage_offset(at.port.a, st.a) + a_rows);
    const uint64_t desc_b = OperandB::desc(pl::stage_offset(at.port.b, st.b));
    pl::wgmma::fence_operands(acc);
    pl::wgmma::fence();
#pragma unroll
    for (uint32_t s = 0; s < kKSteps; ++s) {
      pl::wgmma::mma_bf16_ss<kTileN, kMnMajorA, kMnMajorB>(
          acc, pl::wgmma::desc_advance(desc_a, s * OperandA::kKStepBytes),
          pl::wgmma::desc_advance(desc_b, s * OperandB::kKStepBytes), kAccumulate);
    }
    pl::wgmma::commit();
    pl::wgmma::fence_operands(acc);
    pl::wgmma::wait<1>();
    if (k > 0) release(at, releaser, retire_a, retire_b);
    st.a.advance(at.port.a);
    st.b.advance(at.port.b);
  }
  pl::wgmma::wait<0>();
  pl::wgmma::fence_operands(acc);
  release(at, releaser, retire_a, retire_b);
}
