// attn_row_store_epilogue: O's tile, one query row per thread, from registers to
// O [B, S, H, D] by TMA through rotating 128-byte-swizzled staging tiles
// (pl::epi::StagedStore). Chunk c of a tile is the box {c * store_n, head,
// m_block * tile_m, sequence} of the 4-D map.
#include <type_traits>

#include "pl_attn_row_store_epilogue.h"

using Params = pl_params_attn_row_store_epilogue;
using Element = Params::dtype;

constexpr uint32_t kTileM = Params::tile_m;
constexpr uint32_t kHeadDim = Params::head_dim;
constexpr uint32_t kStoreN = Params::store_n;
constexpr uint32_t kBuffers = Params::buffers;
constexpr uint32_t kChunks = kHeadDim / kStoreN;
constexpr uint32_t kStagingBytes = kTileM * kStoreN * sizeof(Element);

static_assert(std::is_same_v<Element, __nv_bfloat16>, "this epilogue writes bf16: set dtype: bf16");
static_assert(kTileM <= pl::tma::kMaxBoxRows, "a TMA box spans at most 256 rows: lower tile_m");
static_assert(kHeadDim % kStoreN == 0, "store_n columns at a time tile the row: divide head_dim");

// The store warps' perspective, per record.
extern "C" __device__ void pl_attn_row_store_epilogue_store(
    const pl_place_attn_row_store_epilogue& at, const pl_args_attn_row_store_epilogue& args,
    const pl::KernelInfo&, const pl::WorkTile& tile, pl_state_attn_row_store_epilogue_store&,
    float (&acc)[kHeadDim]) {
  const uint32_t row = pl::thread_in_role(at.role.store);
  const pl::epi::StagedStore<kBuffers> out{at.bar.staged, kTileM, row == 0};
  const int32_t first_row = tile.m_block * int32_t(kTileM);
#pragma unroll
  for (uint32_t c = 0; c < kChunks; ++c) {
    const uint32_t buffer = at.smem.staging + (c % kBuffers) * kStagingBytes;
    out.begin();
    pl::epi::stage_row_bf16<kStoreN>(buffer, row,
                                     *reinterpret_cast<const float (*)[kStoreN]>(acc + c * kStoreN));
    out.finish_4d(args.tma_o, buffer, int32_t(c * kStoreN), tile.n_block, first_row, tile.group);
  }
}

// Once, after the last record: the stores have read their staging before the block exits.
extern "C" __device__ void pl_attn_row_store_epilogue_store_tail(
    const pl_place_attn_row_store_epilogue& at, const pl_args_attn_row_store_epilogue&,
    const pl::KernelInfo&, pl_state_attn_row_store_epilogue_store&) {
  const pl::epi::StagedStore<kBuffers> out{at.bar.staged, kTileM,
                                           pl::thread_in_role(at.role.store) == 0};
  out.drain();
}
