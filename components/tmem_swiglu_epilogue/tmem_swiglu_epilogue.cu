// tmem_swiglu_epilogue: Y = silu(X W_gate^T) * (X W_up^T) from one GEMM over gate/up
// rows interleaved in blocks of 8, accumulated in Tensor Memory; bf16 through swizzled
// shared-memory staging and TMA stores. One warpgroup, one accumulator row per thread
// (pipelink/tmem_epilogue.cuh walks the tile): a thread holds both halves of every
// output of its row, so the interleave needs no exchange.
#include <type_traits>

#include "pl_tmem_swiglu_epilogue.h"
#include "pipelink/tmem_epilogue.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM100_ALL)
#error "tmem_swiglu_epilogue reads Tensor Memory, which only sm_100a has: build it for sm_100a"
#endif

using Params = pl_params_tmem_swiglu_epilogue;
using Element = Params::dtype;

constexpr uint32_t kTileM = Params::tile_m;
constexpr uint32_t kTileN = Params::tile_n;                 // gate + up columns
constexpr uint32_t kOutN = kTileN / 2;                      // output columns per tile
constexpr uint32_t kStoreN = Params::store_n;               // output columns per TMA store
constexpr uint32_t kChunkN = 2 * kStoreN;                   // accumulator columns behind them
constexpr uint32_t kBuffers = Params::buffers;
constexpr uint32_t kStagingBytes = kTileM * kStoreN * sizeof(Element);

using Tile = pl::epi::TmemTile<kTileM, kTileN, kChunkN, kBuffers, kStagingBytes>;

static_assert(std::is_same_v<Element, __nv_bfloat16>, "this epilogue writes bf16: set dtype: bf16");
static_assert(kStoreN * sizeof(Element) == pl::epi::kSwizzleRowBytes,
              "a staging row is one 128-byte swizzle row: set store_n = 128 / sizeof(dtype)");

// Epilogue's perspective, per tile: each chunk of a row becomes store_n outputs,
// staged; the issuer stores the chunk at its place in Y.
extern "C" __device__ void pl_tmem_swiglu_epilogue_store(
    const pl_place_tmem_swiglu_epilogue& at, const pl_args_tmem_swiglu_epilogue& args,
    const pl::KernelInfo& k, const pl::WorkTile& tile, pl_state_tmem_swiglu_epilogue_store& st) {
  const Tile walk{at.port.acc, st.acc, k, tile, pl::thread_in_role(at.role.store),
                  pl::warp_in_role(at.role.store), at.bar.staged, at.smem.staging};
  const int32_t row = tile.m_block * int32_t(kTileM);
  const int32_t col = tile.n_block * int32_t(kOutN);
  walk.run(
      [](uint32_t buffer, uint32_t r, const float (&v)[kChunkN], uint32_t) {
        pl::epi::stage_swiglu_row<kStoreN>(buffer, r, v);
      },
      walk.tma_store<kStoreN>(args.tma_out, col, row));
}

// Epilogue's perspective, once after the last tile: the stores have landed.
extern "C" __device__ void pl_tmem_swiglu_epilogue_store_tail(
    const pl_place_tmem_swiglu_epilogue& at, const pl_args_tmem_swiglu_epilogue&,
    const pl::KernelInfo&, pl_state_tmem_swiglu_epilogue_store&) {
  const pl::epi::StagedStore<kBuffers> out{at.bar.staged, Tile::kThreads,
                                           pl::thread_in_role(at.role.store) == 0};
  out.drain();
}
