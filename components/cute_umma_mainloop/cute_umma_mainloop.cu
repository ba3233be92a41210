// cute_umma_mainloop: the MMA warp of a warp-specialised Blackwell GEMM, in CuTe.
// The contract is umma_mainloop's: the same rings in, the same Tensor Memory
// accumulator buffers out. Each placed stage is a cute::Tensor over the swizzled K-major
// tile TMA wrote; a TiledMMA of one tcgen05.mma atom (128 x TILE_N x 16 on one CTA, or
// 256 x TILE_N x 16 over a CTA pair) turns the stage into UMMA shared-memory
// descriptors, and cute::gemm issues the MMAs into a CuTe TMEM tensor at the buffer the
// tmem port placed. PipeLink's pipeline ABI, not CUTLASS's pipeline classes, waits for
// the stages and the buffer and hands them back (tcgen05.commit onto the port's
// barriers, on both CTAs of a pair).
#include <type_traits>

#include <cute/arch/mma_sm100_umma.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/tensor.hpp>

#include "pl_cute_umma_mainloop.h"
#include "pipelink/tcgen05.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM100_ALL)
#error "cute_umma_mainloop issues tcgen05.mma, which only sm_100a has: build it for sm_100a"
#endif

using Params = pl_params_cute_umma_mainloop;
using Element = Params::dtype;
using MmaElement = cutlass::bfloat16_t;   // CuTe's spelling of the same 16-bit bf16

constexpr uint32_t kTileM = Params::tile_m;                         // rows per CTA
constexpr uint32_t kTileN = Params::tile_n;
constexpr uint32_t kTileK = Params::tile_k;
constexpr uint32_t kCtaGroup = Params::cta_group;
constexpr bool kPair = kCtaGroup == 2;
constexpr uint32_t kLeader = 0;                                     // a pair's issuing rank
constexpr uint32_t kRowBytes = kTileK * sizeof(Element);           // one K-major row
constexpr uint32_t kLaneStride = 1u << pl::tcgen05::kLaneShift;    // TMEM: lane << 16

static_assert(pl::same_word(Params::a_major, "k") && pl::same_word(Params::b_major, "k"),
              "this CuTe mainloop reads K-major stages (a_major: k, b_major: k); for MN-major "
              "operands use the hand-written mainloop");
static_assert(kCtaGroup == 1 || kCtaGroup == 2, "cta_group is 1 (one CTA) or 2 (a CTA pair)");

using TileM = cute::Int<kTileM>;
using TileN = cute::Int<kTileN>;
using TileK = cute::Int<kTileK>;
using MmaM = cute::Int<kCtaGroup * kTileM>;                          // rows per MMA
// One tcgen05.mma atom, both operands K-major in shared memory, the fp32 accumulator in
// Tensor Memory: 128 x TILE_N x 16 issued for one CTA, or 256 x TILE_N x 16 issued by a
// pair's leader for both CTAs (cta_group::2; each CTA holds half of A's and B's rows).
using MmaAtom = std::conditional_t<
    kPair,
    cute::SM100_MMA_F16BF16_2x1SM_SS<MmaElement, MmaElement, float, MmaM::value, kTileN,
                                     cute::UMMA::Major::K, cute::UMMA::Major::K>,
    cute::SM100_MMA_F16BF16_SS<MmaElement, MmaElement, float, MmaM::value, kTileN,
                               cute::UMMA::Major::K, cute::UMMA::Major::K>>;
// The tile is exactly one atom along M and N: no atom layout to tile it over.
using TiledMma = decltype(cute::make_tiled_mma(MmaAtom{}));
using AtomK = cute::Int<cute::size<2>(typename cute::MMA_Traits<MmaAtom>::Shape_MNK{})>;
// One CTA's stage of each ring, as TMA's 128-byte swizzle left it, cut into the atom's
// blocks: ((ROWS, 16), 1, K_STEPS), ROWS this CTA's share of the MMA's rows.
using StageA = decltype(cute::UMMA::tile_to_mma_shape(
    cute::UMMA::Layout_K_SW128_Atom<MmaElement>{},
    cute::partition_shape_A(TiledMma{}, cute::Shape<MmaM, TileK>{})));
using StageB = decltype(cute::UMMA::tile_to_mma_shape(
    cute::UMMA::Layout_K_SW128_Atom<MmaElement>{},
    cute::partition_shape_B(TiledMma{}, cute::Shape<TileN, TileK>{})));
// This CTA's accumulator buffer in Tensor Memory, ((TILE_M, TILE_N), 1, 1) -> TMEM
// address offset: the layout CuTe gives the atom's D (a pair's peer holds the other
// TILE_M rows at the same address).
using AccLayout = decltype(cute::partition_fragment_C(TiledMma{},
                                                      cute::Shape<MmaM, TileN>{}).layout());
using AccTensor = decltype(cute::make_tensor(cute::make_tmem_ptr<float>(), AccLayout{}));

static_assert(std::is_same_v<Element, __nv_bfloat16> && sizeof(MmaElement) == sizeof(Element),
              "this mainloop multiplies bf16: set dtype: bf16");
static_assert(kTileM == pl::tcgen05::kFullM,
              "row r of D is lane r of a CTA's Tensor Memory: set tile_m to 128");
static_assert(kRowBytes == pl::tcgen05::kSwizzleBytes,
              "stages are 128-byte-swizzled K-major rows: set tile_k = 128 / sizeof(dtype)");
static_assert(kTileK % AtomK::value == 0 && AtomK::value == pl::tcgen05::kK,
              "a k-tile is a whole number of K = 16 MMAs: make tile_k a multiple of 16");
static_assert(decltype(cute::size(TiledMma{}))::value == kCtaGroup,
              "one thread per CTA of the MMA (the contract's mma role is one warp): keep the "
              "TiledMMA a single atom");
static_assert(cute::size<0, 0>(StageA{}) == kTileM &&
                  cute::size<0, 0>(StageB{}) == kTileN / kCtaGroup,
              "a CTA's stages hold tile_m rows of A and tile_n / cta_group rows of B (the "
              "ports' shapes): keep the atom one tile wide");
static_assert(cute::size<0, 0>(AccLayout{}) == kTileM && cute::size<0, 1>(AccLayout{}) == kTileN &&
                  cute::size(AccLayout{}) == kTileM * kTileN &&
                  cute::stride<0, 0>(AccLayout{}) == kLaneStride &&
                  cute::stride<0, 1>(AccLayout{}) == 1,
              "the acc port is tmem_f32_m128_rows (row r in lane r, column n in the buffer's "
              "column n): keep 128 fp32 rows of tile_n columns per CTA");

// Shared-memory view from the placement: the stage `s` of a ring, as a CuTe tensor.
template <class StageLayout>
__device__ __forceinline__ auto stage_tensor(const pl::PipePort& port, const pl::PipeState& s) {
  const auto stage = cute::make_smem_ptr(pl::smem_ptr<MmaElement>(pl::stage_offset(port, s)));
  return cute::make_tensor(stage, StageLayout{});
}

// One commit arrival on the barrier at `mbar` once the MMAs issued so far are done: on
// this CTA, or on both CTAs of the pair. The elected lane must be the one CuTe elected
// to issue them (a commit tracks its own thread's MMAs): elect.sync over the full warp
// elects the same leader every time.
__device__ __forceinline__ void commit(uint32_t mbar) {
  if (pl::elect_one_sync()) {
    if constexpr (kPair) {
      pl::tcgen05::commit_pair(mbar, pl::tcgen05::kPairMask);
    } else {
      pl::tcgen05::commit(mbar);
    }
  }
}

// The MMA warp's perspective, per k-tile: the whole warp waits for the stage pair (for
// a CTA pair, both CTAs' copies land on the leader's barriers) and runs cute::gemm,
// whose atom elects one lane to issue each MMA; the same lane hands both stages back
// once those MMAs have read them (one commit arrival each).
__device__ __forceinline__ void issue_k_tile(const pl_place_cute_umma_mainloop& at,
                                             TiledMma& mma, AccTensor& acc,
                                             pl_state_cute_umma_mainloop_mma& st) {
  pl::consumer_wait(at.port.a, st.a);
  pl::consumer_wait(at.port.b, st.b);
  pl::tcgen05::fence_after_thread_sync();
  // The leader's descriptors, one per 16 of K; a pair's peer reads its own stages at
  // the same offsets.
  const cute::Tensor a_descs =
      TiledMma::make_fragment_A(stage_tensor<StageA>(at.port.a, st.a));  // (MMA, 1, K_STEPS)
  const cute::Tensor b_descs =
      TiledMma::make_fragment_B(stage_tensor<StageB>(at.port.b, st.b));  // (MMA, 1, K_STEPS)
  // One cute::gemm per 16 of K rather than one per k-tile: the accumulate flag is the
  // TiledMMA's, and only the tile's first MMA may overwrite what the buffer's last tile
  // left.
#pragma unroll
  for (int s = 0; s < cute::size<2>(a_descs); ++s) {
    cute::gemm(mma, a_descs(cute::_, cute::_, s), b_descs(cute::_, cute::_, s), acc);
    mma.accumulate_ = cute::UMMA::ScaleOut::One;
  }
  commit(pl::empty_barrier(at.port.a, st.a));
  commit(pl::empty_barrier(at.port.b, st.b));
  __syncwarp();
  st.a.advance(at.port.a);
  st.b.advance(at.port.b);
}

// The MMA warp's perspective, per tile: take a free accumulator buffer (its readers
// have released it), run the k-tiles into it, and report it full. A tile with no
// k-tiles issues no MMA: the commit still arrives, and the epilogue, which reads the
// same record, writes zeros instead of reading the buffer. A pair's peer issues
// nothing: its rings and buffers are driven from the leader.
extern "C" __device__ void pl_cute_umma_mainloop_mma(const pl_place_cute_umma_mainloop& at,
                                                     const pl_args_cute_umma_mainloop&,
                                                     const pl::KernelInfo& k,
                                                     const pl::WorkTile& tile,
                                                     pl_state_cute_umma_mainloop_mma& st) {
  if (kPair && pl::cluster::rank() != kLeader) return;
  const uint32_t k_tiles = tile.k_tiles();   // the loader's count: both read the record
  pl::producer_acquire(at.port.acc, st.acc);
  pl::tcgen05::fence_after_thread_sync();
  // The buffer the port placed: the kernel's Tensor Memory base plus the stage's column.
  AccTensor acc = cute::make_tensor(
      cute::make_tmem_ptr<float>(k.tmem_base + pl::stage_column(at.port.acc, st.acc)),
      AccLayout{});                                                   // ((TILE_M, TILE_N), 1, 1)
  TiledMma mma;
  mma.accumulate_ = cute::UMMA::ScaleOut::Zero;
  for (uint32_t kt = 0; kt < k_tiles; ++kt) issue_k_tile(at, mma, acc, st);
  commit(pl::full_barrier(at.port.acc, st.acc));
  __syncwarp();
  st.acc.advance(at.port.acc);
}
