// swiglu_epilogue: Y = silu(X W_gate^T) * (X W_up^T) from one GEMM over gate/up rows
// interleaved in blocks of 8 (see interleave below), written as bf16 through
// swizzled shared-memory staging and TMA stores. One thread of the role issues them.
//
// Interleave (host side): with I the intermediate size, Ip = ceil(I / 8) * 8 and
// W_gate, W_up ([I, K]) zero-padded to Ip rows,
//   W = torch.stack([W_gate.view(Ip // 8, 8, K), W_up.view(Ip // 8, 8, K)], dim=1)
//            .reshape(2 * Ip, K)
// i.e. W[16q + r] = W_gate[8q + r], W[16q + 8 + r] = W_up[8q + r]. Accumulator block
// 2p of a tile (8 columns) is gate, block 2p + 1 the matching up: a thread holds both
// halves of every output it writes. Output tile (m, n) covers columns
// [n * TILE_N / 2, (n + 1) * TILE_N / 2) of Y.
//
// Arch-neutral: stmatrix, TMA stores and tanh.approx exist on sm_90a, sm_100a and
// sm_120a alike, so no part of this file is gated on __CUDA_ARCH__.
#include <type_traits>

#include "pl_swiglu_epilogue.h"
#include "pipelink/epilogue.cuh"
#include "pipelink/splitk.cuh"

using Params = pl_params_swiglu_epilogue;
using Element = Params::dtype;

constexpr uint32_t kTileM = Params::tile_m;
constexpr uint32_t kTileN = Params::tile_n;                 // gate + up columns
constexpr uint32_t kOutN = kTileN / 2;                      // output columns per tile
constexpr uint32_t kStoreN = Params::store_n;               // columns per TMA store
constexpr uint32_t kBuffers = Params::buffers;
constexpr uint32_t kThreads = kTileM / pl::epi::kRowsPerWarp * pl::kWarpThreads;
constexpr uint32_t kAccCount = pl::epi::kRowsPerWarpgroup * kTileN / pl::kWarpgroupThreads;
constexpr uint32_t kChunks = kOutN / kStoreN;               // TMA stores per tile
constexpr uint32_t kBlocksPerChunk = kStoreN / pl::epi::kBlockCols;
constexpr uint32_t kStagingBytes = kTileM * kStoreN * sizeof(Element);  // (TILE_M, STORE_N)

static_assert(std::is_same_v<Element, __nv_bfloat16>, "this epilogue writes bf16: set dtype: bf16");
static_assert(kTileM % pl::epi::kRowsPerWarpgroup == 0,
              "the accumulators come in 64-row warpgroup blocks: make tile_m a multiple of 64");
static_assert(kStoreN * sizeof(Element) == pl::epi::kSwizzleRowBytes,
              "a staging row is one 128-byte swizzle row: set store_n = 128 / sizeof(dtype)");
static_assert(kOutN % kStoreN == 0, "tile_n / 2 must be a multiple of store_n");
static_assert(kChunks % kBuffers == 0,
              "staging buffers rotate per chunk across tiles: make tile_n / 2 / store_n a "
              "multiple of buffers");
static_assert(kTileM <= pl::tma::kMaxBoxRows, "a TMA box spans at most 256 rows: lower tile_m");

// Epilogue's perspective, per tile: every thread turns its gate/up pairs into output
// blocks chunk by chunk in the staging tile; the issuer stores each complete chunk.
extern "C" __device__ void pl_swiglu_epilogue_store(const pl_place_swiglu_epilogue& at,
                                                    const pl_args_swiglu_epilogue& args,
                                                    const pl::KernelInfo& k, const pl::WorkTile& tile,
                                                    pl_state_swiglu_epilogue_store&,
                                                    float (&acc)[kAccCount]) {
  const uint32_t thread = pl::thread_in_role(at.role.store);
  if (!pl::splitk::combine<kAccCount, kThreads>(tile, k, acc, thread, at.bar.staged)) {
    return;   // a piece of a split tile: its partial is published, piece 0 stores
  }
  const uint32_t first_row = pl::epi::warp_row(thread);
  const pl::epi::StagedStore<kBuffers> out{at.bar.staged, kThreads, thread == 0};
  const int32_t row = tile.m_block * int32_t(kTileM);
  const int32_t col = tile.n_block * int32_t(kOutN);
#pragma unroll
  for (uint32_t c = 0; c < kChunks; ++c) {
    const uint32_t buffer = at.smem.staging + (c % kBuffers) * kStagingBytes;
    out.begin();
    pl::epi::stage_chunk_swiglu<kBlocksPerChunk>(buffer, first_row, c, acc);
    out.finish(args.tma_out, buffer, col + int32_t(c * kStoreN), row);
  }
}

// Epilogue's perspective, once after the last tile: the stores have landed.
extern "C" __device__ void pl_swiglu_epilogue_store_tail(const pl_place_swiglu_epilogue& at,
                                                         const pl_args_swiglu_epilogue&,
                                                         const pl::KernelInfo&,
                                                         pl_state_swiglu_epilogue_store&) {
  const pl::epi::StagedStore<kBuffers> out{at.bar.staged, kThreads,
                                           pl::thread_in_role(at.role.store) == 0};
  out.drain();
}
