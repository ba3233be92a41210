// tmem_store_epilogue: fp32 accumulators in Tensor Memory -> bf16 -> swizzled
// shared-memory staging -> TMA store. One warpgroup, one accumulator row per thread
// (pipelink/tmem_epilogue.cuh walks the tile); one thread of the role issues the stores.
#include <type_traits>

#include "pl_tmem_store_epilogue.h"
#include "pipelink/tmem_epilogue.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM100_ALL)
#error "tmem_store_epilogue reads Tensor Memory, which only sm_100a has: build it for sm_100a"
#endif

using Params = pl_params_tmem_store_epilogue;
using Element = Params::dtype;

constexpr uint32_t kTileM = Params::tile_m;
constexpr uint32_t kTileN = Params::tile_n;
constexpr uint32_t kStoreN = Params::store_n;     // columns per load, staging row and TMA store
constexpr uint32_t kBuffers = Params::buffers;
constexpr uint32_t kStagingBytes = kTileM * kStoreN * sizeof(Element);

using Tile = pl::epi::TmemTile<kTileM, kTileN, kStoreN, kBuffers, kStagingBytes,
                               Params::cta_group>;

static_assert(std::is_same_v<Element, __nv_bfloat16>, "this epilogue writes bf16: set dtype: bf16");

// Epilogue's perspective, per tile: each chunk of a row is rounded to bf16 and staged;
// the issuer stores the chunk at its place in C.
extern "C" __device__ void pl_tmem_store_epilogue_store(const pl_place_tmem_store_epilogue& at,
                                                        const pl_args_tmem_store_epilogue& args,
                                                        const pl::KernelInfo& k,
                                                        const pl::WorkTile& tile,
                                                        pl_state_tmem_store_epilogue_store& st) {
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
extern "C" __device__ void pl_tmem_store_epilogue_store_tail(
    const pl_place_tmem_store_epilogue& at, const pl_args_tmem_store_epilogue&,
    const pl::KernelInfo&, pl_state_tmem_store_epilogue_store&) {
  const pl::epi::StagedStore<kBuffers> out{at.bar.staged, Tile::kThreads,
                                           pl::thread_in_role(at.role.store) == 0};
  out.drain();
}
