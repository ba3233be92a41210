// cute_tmem_store_epilogue: tmem_store_epilogue with its Tensor Memory reads in CuTe.
// The contract is tmem_store_epilogue's: the same accumulator buffers in, the same bf16
// tiles of C out. The placed buffer is a CuTe TMEM tensor; a TiledCopy of CuTe's
// SM100_TMEM_LOAD_32dp32b64x atom (tcgen05.ld.32x32b.x64), made with make_tmem_copy over
// its 128 x 64 blocks, reads them into registers, 64 columns of one row per thread.
// The walk over the tile (the wait for the buffer, its release, split-K pieces), the
// bf16 staging and the TMA store are PipeLink's (pipelink/tmem_epilogue.cuh, this is
// its READER); so is the tcgen05.wait::ld, which CuTe's atom leaves to the caller.
#include <type_traits>
#include <utility>

#include <cute/atom/copy_traits_sm100.hpp>
#include <cute/tensor.hpp>

#include "pl_cute_tmem_store_epilogue.h"
#include "pipelink/tmem_epilogue.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM100_ALL)
#error "cute_tmem_store_epilogue reads Tensor Memory, which only sm_100a has: build it for sm_100a"
#endif

using Params = pl_params_cute_tmem_store_epilogue;
using Element = Params::dtype;

constexpr uint32_t kTileM = Params::tile_m;
constexpr uint32_t kTileN = Params::tile_n;
constexpr uint32_t kStoreN = Params::store_n;     // columns per chunk, staging row and TMA store
constexpr uint32_t kBuffers = Params::buffers;
constexpr uint32_t kStagingBytes = kTileM * kStoreN * sizeof(Element);
constexpr uint32_t kLoadN = pl::epi::kTmemLoadColumns;            // one atom: 64 columns
constexpr uint32_t kLaneStride = 1u << pl::tcgen05::kLaneShift;   // TMEM: lane << 16

static_assert(std::is_same_v<Element, __nv_bfloat16>, "this epilogue writes bf16: set dtype: bf16");

using Rows = cute::Int<kTileM>;
using LoadN = cute::Int<kLoadN>;
// The acc port's buffer, layout tmem_f32_m128_rows: (row, column) -> TMEM address offset,
// row r in lane r, column n in the buffer's column n.
using AccLayout =
    cute::Layout<cute::Shape<Rows, cute::Int<kTileN>>, cute::Stride<cute::Int<kLaneStride>, cute::_1>>;
using AccTensor = decltype(cute::make_tensor(cute::make_tmem_ptr<float>(), AccLayout{}));
// The buffer in blocks of one load: (TILE_M, 64, 1, TILE_N / 64).
using Blocks = decltype(cute::flat_divide(std::declval<AccTensor>(), cute::Shape<Rows, LoadN>{}));
using Block = decltype(std::declval<Blocks>()(cute::_, cute::_, 0, 0));
// Four warps, one tcgen05.ld.32x32b.x64 each: warp w reads lanes [32 w, 32 w + 32) (its
// sub-partition), thread t row t, 64 columns.
using TmemLoad = decltype(cute::make_tmem_copy(cute::SM100_TMEM_LOAD_32dp32b64x{},
                                               std::declval<Block>()));
// What one thread's load holds, ((64, 1), 1, 1): register i is the block's column i.
using Fragment = decltype(cute::make_layout(cute::shape(
    TmemLoad{}.get_slice(0u).partition_D(cute::make_identity_tensor(cute::Shape<Rows, LoadN>{})))));

static_assert(cute::size(Fragment{}) == kLoadN,
              "one thread's fragment of a block is one 64-column row");
// (thread, register) -> (row, column) of the block as a column-major index: thread t's
// register i is row t, column i exactly when this is the identity 8192:1.
using ThreadRegisters =
    decltype(cute::coalesce(TmemLoad{}.tidfrg_D(cute::Layout<cute::Shape<Rows, LoadN>>{})));
static_assert(std::is_same_v<ThreadRegisters, cute::Layout<cute::Int<kTileM * kLoadN>, cute::_1>>,
              "the TMEM copy must give thread t of the warpgroup row t (lane t of the "
              "tmem_f32_m128_rows buffer), register i column i");

// TmemTile's READER: thread `thread`'s view of the buffer, one block per read.
struct CuteRows {
  using Src = decltype(TmemLoad{}.get_slice(0u).partition_S(std::declval<Blocks>()));
  Src src;   // (LOAD, 1, 1, 1, TILE_N / 64): the blocks' TMEM addresses for this warp

  __device__ __forceinline__ CuteRows(uint32_t buffer, uint32_t thread, uint32_t /*warp*/)
      : src(TmemLoad{}.get_slice(thread).partition_S(cute::flat_divide(
            cute::make_tensor(cute::make_tmem_ptr<float>(buffer), AccLayout{}),
            cute::Shape<Rows, LoadN>{}))) {}

  // Columns chunk + offset + [0, 64) of this thread's row into v, loaded.
  __device__ __forceinline__ void operator()(uint32_t chunk, uint32_t offset,
                                             float (&v)[kLoadN]) const {
    cute::Tensor frag = cute::make_tensor(cute::make_rmem_ptr(&v[0]), Fragment{});
    const auto block = src(cute::_, cute::_, cute::_, 0, (chunk + offset) / kLoadN);
    // CuTe's copy asserts, without NDEBUG (nvcc gets none), that the thread's warp
    // reaches the block's lanes: a compare and an __assertfail call per load, whose call
    // costs the whole tile loop registers and convergence code. The role is
    // warpgroup-aligned (TmemTile), so it holds; saying so folds the check away in both
    // builds (a #define NDEBUG here could not: a monolithic build includes CuTe's
    // headers before this file, and the macro would leak into the components after it).
    const uint32_t taddr = cute::raw_pointer_cast(block.data());
    __builtin_assume(uint32_t(threadIdx.x) / 32 % 4 == (taddr >> 16) / 32 % 4);
    cute::copy(TmemLoad{}, block, frag);
    pl::epi::wait_loaded(v);   // CuTe's atom issues the load only
  }
};

using Tile = pl::epi::TmemTile<kTileM, kTileN, kStoreN, kBuffers, kStagingBytes,
                               Params::cta_group, CuteRows>;

// Epilogue's perspective, per tile: each chunk of a row is read through CuTe's copy,
// rounded to bf16 and staged; the issuer stores the chunk at its place in C.
extern "C" __device__ void pl_cute_tmem_store_epilogue_store(
    const pl_place_cute_tmem_store_epilogue& at, const pl_args_cute_tmem_store_epilogue& args,
    const pl::KernelInfo& k, const pl::WorkTile& tile,
    pl_state_cute_tmem_store_epilogue_store& st) {
  const Tile walk{at.port.acc, st.acc, k, tile, pl::thread_in_role(at.role.store),
                  pl::warp_in_role(at.role.store), at.bar.staged, at.smem.staging};
  const int32_t row = tile.m_block * int32_t(kTileM);
  const int32_t col = tile.n_block * int32_t(kTileN);
  walk.run(
      [](uint32_t buffer, uint32_t r, const float (&v)[kStoreN], uint32_t) {
        pl::epi::stage_row_bf16<kStoreN>(buffer, r, v);
      },
      walk.tma_store<kStoreN>(args.tma_c, col, row));
}

// Epilogue's perspective, once after the last tile: the stores have landed.
extern "C" __device__ void pl_cute_tmem_store_epilogue_store_tail(
    const pl_place_cute_tmem_store_epilogue& at, const pl_args_cute_tmem_store_epilogue&,
    const pl::KernelInfo&, pl_state_cute_tmem_store_epilogue_store&) {
  const pl::epi::StagedStore<kBuffers> out{at.bar.staged, Tile::kThreads,
                                           pl::thread_in_role(at.role.store) == 0};
  out.drain();
}
