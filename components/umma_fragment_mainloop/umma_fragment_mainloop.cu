// umma_mainloop: the consumer warps of a warp-specialised Blackwell GEMM. One thread
// issues the tile's tcgen05.mma into Tensor Memory, one M = 64 MMA per warpgroup's 64
// rows and 16 of K; once they have completed, every thread reads its rows back into
// the wgmma-shaped register fragment the epilogue in the same warps takes.
#include <type_traits>

#include "pl_umma_mainloop.h"
#include "pipelink/tcgen05.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM100_ALL)
#error "umma_mainloop issues tcgen05.mma, which only sm_100a has: build it for sm_100a"
#endif

using Params = pl_params_umma_mainloop;
using Element = Params::dtype;

constexpr uint32_t kTileM = Params::tile_m;
constexpr uint32_t kTileN = Params::tile_n;
constexpr uint32_t kTileK = Params::tile_k;
constexpr uint32_t kWarpgroups = kTileM / pl::tcgen05::kM;          // one M = 64 MMA each
constexpr uint32_t kThreads = kWarpgroups * pl::kWarpgroupThreads;
constexpr uint32_t kAccCount = pl::tcgen05::kM * kTileN / pl::kWarpgroupThreads;  // per thread
constexpr uint32_t kKSteps = kTileK / pl::tcgen05::kK;              // MMA per row block and stage
constexpr uint32_t kKStepBytes = pl::tcgen05::kK * sizeof(Element);  // along a K-major row
constexpr uint32_t kRowBytes = kTileK * sizeof(Element);
constexpr uint32_t kWarpgroupBytesA = pl::tcgen05::kM * kRowBytes;   // (64, TILE_K) of A
constexpr uint32_t kIdesc = pl::tcgen05::idesc_bf16_f32<pl::tcgen05::kM, kTileN>();
constexpr uint32_t kIssuer = 0;          // the role's thread that issues every MMA and commit
constexpr uint32_t kIssuerWarp = kIssuer / pl::kWarpThreads;
// M = 64 MMAs fill lanes 0..15 or 16..31 of every sub-partition: two row blocks at most.
constexpr uint32_t kMaxWarpgroups =
    pl::tcgen05::kSubpartitionLanes / pl::tcgen05::kHalfSubpartitionLanes;

static_assert(std::is_same_v<Element, __nv_bfloat16>,
              "this mainloop multiplies bf16: set dtype: bf16");
static_assert(kTileM % pl::tcgen05::kM == 0 && kWarpgroups >= 1 && kWarpgroups <= kMaxWarpgroups,
              "each consumer warpgroup owns one 64-row block of Tensor Memory lanes: set "
              "tile_m to 64 or 128");
static_assert(kTileN == 64 || kTileN == 128 || kTileN == 256,
              "one MMA covers the tile's width and tcgen05.ld reads it whole: set tile_n to "
              "64, 128 or 256");
static_assert(kRowBytes == pl::tcgen05::kSwizzleBytes,
              "stages are 128-byte-swizzled K-major rows: set tile_k = 128 / sizeof(dtype)");
static_assert(kWarpgroupBytesA % pl::tcgen05::kSwizzleAtomBytes == 0,
              "a warpgroup's rows of A must start on a 1024-byte swizzle atom");

// The accumulator's first column; its lanes are all 128 (two 64-row blocks, see
// pipelink/tcgen05.cuh). The column is placed, the lanes are the hardware's.
__device__ __forceinline__ uint32_t accumulator(const pl_place_umma_mainloop& at,
                                                const pl::KernelInfo& k) {
  return k.tmem_base + at.tmem.acc;
}

// The issuer's perspective, per tile: for each k-tile, wait for the stage pair, issue
// the MMAs of every row block, and hand both stages back with commits (one arrival on
// each empty barrier once those MMAs have read the stage). A last commit on acc_full
// reports the finished accumulator. The issuer alone walks the rings: the other
// threads' copies of the pipeline state are never read.
__device__ __forceinline__ void issue(const pl_place_umma_mainloop& at, uint32_t k_tiles,
                                      uint32_t acc, pl_state_umma_mainloop_mma& st) {
  for (uint32_t k = 0; k < k_tiles; ++k) {
    pl::consumer_wait(at.port.a, st.a);
    pl::consumer_wait(at.port.b, st.b);
    // MMAs after the waits, and after the last tile's acc_free: nobody still reads D.
    pl::tcgen05::fence_after_thread_sync();
    const uint32_t stage_a = pl::stage_offset(at.port.a, st.a);
    const uint64_t desc_b =
        pl::tcgen05::desc_sw128_kmajor(pl::stage_offset(at.port.b, st.b));  // (TILE_N, TILE_K)
#pragma unroll
    for (uint32_t g = 0; g < kWarpgroups; ++g) {
      const uint64_t desc_a =
          pl::tcgen05::desc_sw128_kmajor(stage_a + g * kWarpgroupBytesA);  // (64, TILE_K)
#pragma unroll
      for (uint32_t s = 0; s < kKSteps; ++s) {
        // The tile's first MMA of each row block overwrites what the last tile left.
        const uint32_t accumulate = k > 0 || s > 0;
        pl::tcgen05::mma_ss(pl::tcgen05::d_block(acc, g),
                            pl::tcgen05::desc_advance(desc_a, s * kKStepBytes),
                            pl::tcgen05::desc_advance(desc_b, s * kKStepBytes), kIdesc,
                            accumulate);
      }
    }
    pl::tcgen05::commit(pl::empty_barrier(at.port.a, st.a));
    pl::tcgen05::commit(pl::empty_barrier(at.port.b, st.b));
    st.a.advance(at.port.a);
    st.b.advance(at.port.b);
  }
  pl::tcgen05::commit(at.mbar.acc_full);
}

// Every consumer thread's perspective, per tile: arrive on acc_full and wait for that
// phase (it completes with the issuer's commit), read this warp's 16 rows into the
// fragment, then let the issuer know the lanes may be overwritten: its warp waits on
// acc_free, the others only arrive.
__device__ __forceinline__ void read_accumulator(const pl_place_umma_mainloop& at, uint32_t acc,
                                                 uint32_t warp, float (&frag)[kAccCount]) {
  pl::tcgen05::wait_token(at.mbar.acc_full, pl::tcgen05::arrive_token(at.mbar.acc_full));
  pl::tcgen05::fence_after_thread_sync();
  // The role is warpgroup-aligned, so warp % 4 here is the hardware's sub-partition.
  const uint32_t warpgroup = warp / pl::kWarpgroupWarps;
  const uint32_t quarter = warp % pl::kWarpgroupWarps;
  pl::tcgen05::load_fragment<kTileN>(pl::tcgen05::fragment_lanes(acc, warpgroup, quarter), frag);
  pl::tcgen05::fence_before_thread_sync();
  if (warp == kIssuerWarp) {
    pl::named_sync(at.bar.acc_free, kThreads);
  } else {
    pl::named_arrive(at.bar.acc_free, kThreads);
  }
}

// Consumer warps' perspective, per tile: the issuer runs the K loop while the rest of
// its warp and the other warps go straight to waiting for the accumulator.
extern "C" __device__ void pl_umma_mainloop_mma(const pl_place_umma_mainloop& at,
                                                const pl_args_umma_mainloop&,
                                                const pl::KernelInfo& k, const pl::WorkTile& tile,
                                                pl_state_umma_mainloop_mma& st,
                                                float (&acc)[kAccCount]) {
  const uint32_t k_tiles = tile.k_tiles();   // the loader's count: both read the record
  if (k_tiles == 0) {   // no MMA, no commit: the sum over an empty K is zero
#pragma unroll
    for (uint32_t i = 0; i < kAccCount; ++i) acc[i] = 0.0f;
    return;
  }
  const uint32_t tmem = accumulator(at, k);
  if (pl::thread_in_role(at.role.mma) == kIssuer) issue(at, k_tiles, tmem, st);
  __syncwarp();   // tcgen05.ld is warp-collective: the issuer's warp reconverges first
  read_accumulator(at, tmem, pl::warp_in_role(at.role.mma), acc);
}
