// attn_tmem_store_epilogue: an attention output tile from Tensor Memory -> bf16 ->
// swizzled staging -> 4-D TMA store. One warpgroup, one row per thread
// (pipelink/tmem_epilogue.cuh walks the tile); one thread of the role issues the stores.
#include <type_traits>

#include "pl_attn_tmem_store_epilogue.h"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM100_ALL)
#error "attn_tmem_store_epilogue reads Tensor Memory, which only sm_100a has: build it for sm_100a"
#endif

using Params = pl_params_attn_tmem_store_epilogue;
using Element = Params::dtype;

constexpr uint32_t kTileM = Params::tile_m;
constexpr uint32_t kHeadDim = Params::head_dim;
constexpr uint32_t kStoreN = Params::store_n;     // columns per load, staging row and store
constexpr uint32_t kBuffers = Params::buffers;
constexpr uint32_t kStagingBytes = kTileM * kStoreN * sizeof(Element);

using Tile = pl::epi::TmemTile<kTileM, kHeadDim, kStoreN, kBuffers, kStagingBytes>;

static_assert(std::is_same_v<Element, __nv_bfloat16>, "this epilogue writes bf16: set dtype: bf16");
static_assert(kTileM <= pl::tma::kMaxBoxRows, "a TMA box spans at most 256 rows: lower tile_m");

// Epilogue's perspective, per record: each chunk of a row is rounded to bf16 and staged;
// the issuer stores it at {chunk column, head, first row, sequence}.
extern "C" __device__ void pl_attn_tmem_store_epilogue_store(
    const pl_place_attn_tmem_store_epilogue& at, const pl_args_attn_tmem_store_epilogue& args,
    const pl::KernelInfo& k, const pl::WorkTile& tile,
    pl_state_attn_tmem_store_epilogue_store& st) {
  const uint32_t row = pl::thread_in_role(at.role.store);
  const Tile walk{at.port.acc, st.acc, k, tile, row, pl::warp_in_role(at.role.store),
                  at.bar.staged, at.smem.staging};
  const int32_t first_row = tile.m_block * int32_t(kTileM);
  const bool issuer = row == 0;
  walk.run(
      [](uint32_t buffer, uint32_t r, const float (&v)[kStoreN], uint32_t) {
        pl::epi::stage_row_bf16<kStoreN>(buffer, r, v);
      },
      [&](uint32_t buffer, uint32_t c) {
        if (!issuer) return;
        pl::tma::store_4d(args.tma_o, buffer, int32_t(c * kStoreN), tile.n_block, first_row,
                          tile.group);
        pl::tma::store_commit();
      });
}

// Once, after the last record: the stores have read their staging before the block exits.
extern "C" __device__ void pl_attn_tmem_store_epilogue_store_tail(
    const pl_place_attn_tmem_store_epilogue& at, const pl_args_attn_tmem_store_epilogue&,
    const pl::KernelInfo&, pl_state_attn_tmem_store_epilogue_store&) {
  const pl::epi::StagedStore<kBuffers> out{at.bar.staged, Tile::kThreads,
                                           pl::thread_in_role(at.role.store) == 0};
  out.drain();
}
