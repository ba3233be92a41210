// cute_mainloop: the consumer warpgroups of a warp-specialised Hopper GEMM, in CuTe.
// The contract is wgmma_mainloop's: the same rings in, the same accumulator fragment
// out. Each placed stage is a cute::Tensor over the swizzled K-major tile TMA wrote; a
// TiledMMA (one 64 x TILE_N x 16 atom per warpgroup, warpgroups stacked along M) turns
// the stage into wgmma descriptors, and cute::gemm accumulates straight into the
// register port `acc`, which the glue owns. PipeLink's pipeline ABI, not CUTLASS's
// pipeline classes, waits for and releases the stages.
#include <type_traits>

#include <cute/arch/mma_sm90.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/tensor.hpp>

#include "pl_cute_mainloop.h"
#include "pipelink/wgmma.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "cute_mainloop issues wgmma, which only sm_90a has: build it for sm_90a"
#endif

using Params = pl_params_cute_mainloop;

static_assert(pl::same_word(Params::a_major, "k") && pl::same_word(Params::b_major, "k"),
              "this CuTe mainloop reads K-major stages (a_major: k, b_major: k); for MN-major "
              "operands use the hand-written mainloop");
static_assert(Params::multicast_b == 1 || Params::multicast_b == 2,
              "B is read by one CTA or multicast across a CTA pair: set multicast_b to 1 or 2");
using Element = Params::dtype;
using MmaElement = cutlass::bfloat16_t;   // CuTe's spelling of the same 16-bit bf16

constexpr uint32_t kTileM = Params::tile_m;
constexpr uint32_t kTileN = Params::tile_n;
constexpr uint32_t kTileK = Params::tile_k;
constexpr uint32_t kAccCount = pl::wgmma::kM * kTileN / pl::kWarpgroupThreads;  // per thread
constexpr uint32_t kRowBytes = kTileK * sizeof(Element);           // one K-major row
constexpr uint32_t kSwizzleBytes = 128;                            // the rings' SWIZZLE_128B

using TileM = cute::Int<kTileM>;
using TileN = cute::Int<kTileN>;
using TileK = cute::Int<kTileK>;
// One wgmma atom, 64 x TILE_N x 16, both operands K-major in shared memory ...
using MmaAtom = decltype(cute::GMMA::ss_op_selector<MmaElement, MmaElement, float,
                                                    cute::Shape<TileM, TileN, TileK>,
                                                    cute::GMMA::Major::K,
                                                    cute::GMMA::Major::K>());
// ... once per consumer warpgroup along M: warpgroup g owns rows [64g, 64g + 64).
using AtomM = cute::Int<cute::size<0>(typename cute::MMA_Traits<MmaAtom>::Shape_MNK{})>;
using Warpgroups = cute::Layout<cute::Shape<cute::Int<kTileM / AtomM::value>, cute::_1,
                                            cute::_1>>;
using TiledMma = decltype(cute::make_tiled_mma(MmaAtom{}, Warpgroups{}));
// One stage of each ring, as TMA's 128-byte swizzle left it.
using StageA = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW128_Atom<MmaElement>{},
                                            cute::Shape<TileM, TileK>{}));  // (TILE_M, TILE_K)
using StageB = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW128_Atom<MmaElement>{},
                                            cute::Shape<TileN, TileK>{}));  // (TILE_N, TILE_K)
// A thread's accumulators, compact in fragment order: (MMA, MMA_M, MMA_N).
using AccLayout = decltype(cute::make_layout(
    cute::partition_shape_C(TiledMma{}, cute::Shape<TileM, TileN>{})));

static_assert(std::is_same_v<Element, __nv_bfloat16> && sizeof(MmaElement) == sizeof(Element),
              "this mainloop multiplies bf16: set dtype: bf16");
static_assert(kTileM % AtomM::value == 0,
              "each consumer warpgroup owns 64 rows: make tile_m a multiple of 64");
static_assert(kRowBytes == kSwizzleBytes,
              "stages are 128-byte-swizzled K-major rows: set tile_k = 128 / sizeof(dtype)");
static_assert(cute::size(AccLayout{}) == kAccCount &&
                  cute::size<0>(AccLayout{}) == kAccCount,
              "the acc port is one wgmma D fragment per thread: make tile_n one wgmma wide "
              "(a multiple of 8 up to 256)");
static_assert(AtomM::value == pl::wgmma::kM && cute::size(TiledMma{}) ==
                  kTileM / pl::wgmma::kM * pl::kWarpgroupThreads,
              "the contract's mma role is one warpgroup per 64 rows: keep tile_m // 16 warps");

// Shared-memory view from the placement: the stage `s` of a ring, as a CuTe tensor.
template <class StageLayout>
__device__ __forceinline__ auto stage_tensor(const pl::PipePort& port, const pl::PipeState& s) {
  const auto stage = cute::make_smem_ptr(pl::smem_ptr<MmaElement>(pl::stage_offset(port, s)));
  return cute::make_tensor(stage, StageLayout{});
}

// One warpgroup's perspective: hands both stages of the k-tile whose wgmma batch
// retired back to the producer (one arrival per warpgroup, from its first thread).
__device__ __forceinline__ void release(const pl_place_cute_mainloop& at, bool releaser,
                                        pl::PipeState& a, pl::PipeState& b) {
  if (releaser) {
    pl::consumer_release(at.port.a, a);
    pl::consumer_release_all<Params::multicast_b>(at.port.b, b);
  }
  a.advance(at.port.a);
  b.advance(at.port.b);
}

// Consumer warpgroups' perspective, per tile: wait for a stage pair, issue its
// cute::gemm (one wgmma per 16 of K), then retire the previous batch and release its
// stages, so one batch is always in flight behind the next wait.
extern "C" __device__ void pl_cute_mainloop_mma(const pl_place_cute_mainloop& at,
                                                const pl_args_cute_mainloop&,
                                                const pl::KernelInfo&, const pl::WorkTile& tile,
                                                pl_state_cute_mainloop_mma& st,
                                                float (&acc)[kAccCount]) {
  const bool releaser = pl::thread_in_role(at.role.mma) % pl::kWarpgroupThreads == 0;
  const TiledMma mma;
  // Every thread of a wgmma reads its whole operands, so the A and B partitions depend
  // on the warpgroup alone: slicing by the warpgroup's first thread (a warp-uniform
  // index) keeps the descriptors in uniform registers.
  const auto warpgroup_mma =
      mma.get_thread_slice(pl::warpgroup_in_role(at.role.mma) * pl::kWarpgroupThreads);
  cute::Tensor accum = cute::make_tensor(cute::make_rmem_ptr(acc), AccLayout{});  // (MMA, 1, 1)
  // Zeroing, rather than a first wgmma that ignores D, ends the accumulators' life at
  // the previous tile's epilogue: nothing stays live across the tile boundary.
  cute::clear(accum);
  const uint32_t k_tiles = tile.k_tiles();   // the loader's count: both read the record
  if (k_tiles == 0) return;
  pl::PipeState retire_a = st.a, retire_b = st.b;
  for (uint32_t k = 0; k < k_tiles; ++k) {
    pl::consumer_wait(at.port.a, st.a);
    pl::consumer_wait(at.port.b, st.b);
    const cute::Tensor sA = stage_tensor<StageA>(at.port.a, st.a);        // (TILE_M, TILE_K)
    const cute::Tensor sB = stage_tensor<StageB>(at.port.b, st.b);        // (TILE_N, TILE_K)
    // This warpgroup's wgmma descriptors, one per 16 of K.
    const cute::Tensor a_descs =
        warpgroup_mma.make_fragment_A(warpgroup_mma.partition_A(sA));  // (MMA, 1, K_STEPS)
    const cute::Tensor b_descs =
        warpgroup_mma.make_fragment_B(warpgroup_mma.partition_B(sB));  // (MMA, 1, K_STEPS)
    cute::warpgroup_fence_operand(accum);
    cute::warpgroup_arrive();
    cute::gemm(mma, a_descs, b_descs, accum);
    cute::warpgroup_commit_batch();
    cute::warpgroup_fence_operand(accum);
    cute::warpgroup_wait<1>();
    if (k > 0) release(at, releaser, retire_a, retire_b);
    st.a.advance(at.port.a);
    st.b.advance(at.port.b);
  }
  cute::warpgroup_wait<0>();
  cute::warpgroup_fence_operand(accum);
  release(at, releaser, retire_a, retire_b);
}
