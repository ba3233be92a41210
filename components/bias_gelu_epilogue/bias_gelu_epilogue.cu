// bias_gelu_epilogue: Y = gelu_tanh(acc + bias[col]) -> bf16 -> swizzled shared-memory
// staging -> TMA store. Runs in the warps that hold the accumulators (a register
// hand-off); one thread of the role issues the stores.
//
// Arch-neutral: stmatrix, TMA stores and tanh.approx exist on sm_90a and sm_100a alike,
// so no part of this file is gated on __CUDA_ARCH__.
#include <type_traits>

#include "pl_bias_gelu_epilogue.h"
#include "pipelink/epilogue.cuh"
#include "pipelink/splitk.cuh"

using Params = pl_params_bias_gelu_epilogue;
using Element = Params::dtype;

using Shape = pl::epi::StagedShape<Params::tile_m, Params::tile_n, Params::store_n,
                                   Params::buffers, Element>;

constexpr uint32_t kTileM = Params::tile_m;
constexpr uint32_t kTileN = Params::tile_n;
constexpr uint32_t kStoreN = Params::store_n;               // columns per TMA store
constexpr uint32_t kBuffers = Params::buffers;
constexpr uint32_t kThreads = Shape::kThreads;
constexpr uint32_t kAccCount = Shape::kAccCount;
constexpr uint32_t kChunks = Shape::kChunks;                // TMA stores per tile
constexpr uint32_t kBlocksPerChunk = Shape::kBlocksPerChunk;
constexpr uint32_t kStagingBytes = Shape::kStagingBytes;    // (TILE_M, STORE_N)
// In every 8-column block a thread holds two adjacent columns, 2 (t % 4) and the next,
// in both of its rows: floats 4j, 4j+1 (upper row) and 4j+2, 4j+3 (8 rows below).
constexpr uint32_t kColsPerThread = 2;
constexpr uint32_t kThreadsPerBlockRow = pl::epi::kBlockCols / kColsPerThread;
constexpr uint32_t kLower = pl::epi::kFloatsPerBlock / 2;   // first float of the lower row


static_assert(std::is_same_v<Element, __nv_bfloat16>, "this epilogue writes bf16: set dtype: bf16");
static_assert(kTileM <= pl::tma::kMaxBoxRows, "a TMA box spans at most 256 rows: lower tile_m");

// One row's pair of outputs in one block: gelu(acc + bias) for both columns, packed.
__device__ __forceinline__ uint32_t gelu_pair(float x0, float x1, float bias0, float bias1) {
  return pl::epi::pack_bf16x2(pl::epi::gelu_tanh(x0 + bias0), pl::epi::gelu_tanh(x1 + bias1));
}

// Epilogue's perspective, per tile: every thread adds its columns' bias, applies GELU
// and writes its fragment chunk by chunk into the staging tile; the issuer stores each
// chunk once it is complete.
extern "C" __device__ void pl_bias_gelu_epilogue_store(const pl_place_bias_gelu_epilogue& at,
                                                       const pl_args_bias_gelu_epilogue& args,
                                                       const pl::KernelInfo& k,
                                                       const pl::WorkTile& tile,
                                                       pl_state_bias_gelu_epilogue_store&,
                                                       float (&acc)[kAccCount]) {
  const uint32_t thread = pl::thread_in_role(at.role.store);
  if (!pl::splitk::combine<kAccCount, kThreads>(tile, k, acc, thread, at.bar.staged)) {
    return;   // a piece of a split tile: its partial is published, piece 0 stores
  }
  const uint32_t first_row = pl::epi::warp_row(thread);
  const pl::epi::StagedStore<kBuffers> out{at.bar.staged, kThreads, thread == 0};
  const int32_t row = tile.m_block * int32_t(kTileM);
  const int32_t col = tile.n_block * int32_t(kTileN);
  // This thread's first column of the tile's first block, in Y, and what is left of bias
  // from there (read once: the barriers' memory clobbers would reload args per use).
  const int32_t thread_col = col + int32_t(pl::lane() % kThreadsPerBlockRow * kColsPerThread);
  const Element* thread_bias = args.bias + thread_col;
  const int32_t cols_left = int32_t(args.n) - thread_col;
#pragma unroll
  for (uint32_t c = 0; c < kChunks; ++c) {
    const uint32_t buffer = at.smem.staging + (c % kBuffers) * kStagingBytes;
    out.begin();
#pragma unroll
    for (uint32_t b = 0; b < kBlocksPerChunk; b += 2) {
      const uint32_t block = c * kBlocksPerChunk + b;
      const uint32_t f = block * pl::epi::kFloatsPerBlock;              // block's first float
      const uint32_t g = f + pl::epi::kFloatsPerBlock;                  // ... and the next's
      const uint32_t col_f = block * pl::epi::kBlockCols;               // past thread_col
      const uint32_t col_g = col_f + pl::epi::kBlockCols;
      const float bias_f[kColsPerThread] = {pl::epi::bias_at(thread_bias, cols_left, col_f),
                                            pl::epi::bias_at(thread_bias, cols_left, col_f + 1)};
      const float bias_g[kColsPerThread] = {pl::epi::bias_at(thread_bias, cols_left, col_g),
                                            pl::epi::bias_at(thread_bias, cols_left, col_g + 1)};
      const uint32_t packed[4] = {
          gelu_pair(acc[f], acc[f + 1], bias_f[0], bias_f[1]),
          gelu_pair(acc[f + kLower], acc[f + kLower + 1], bias_f[0], bias_f[1]),
          gelu_pair(acc[g], acc[g + 1], bias_g[0], bias_g[1]),
          gelu_pair(acc[g + kLower], acc[g + kLower + 1], bias_g[0], bias_g[1])};
      pl::epi::stage_block_pair(buffer, first_row, b, packed);
    }
    out.finish(args.tma_c, buffer, col + int32_t(c * kStoreN), row);
  }
}

// Epilogue's perspective, once after the last tile: the stores have landed.
extern "C" __device__ void pl_bias_gelu_epilogue_store_tail(const pl_place_bias_gelu_epilogue& at,
                                                            const pl_args_bias_gelu_epilogue&,
                                                            const pl::KernelInfo&,
                                                            pl_state_bias_gelu_epilogue_store&) {
  const pl::epi::StagedStore<kBuffers> out{at.bar.staged, kThreads,
                                           pl::thread_in_role(at.role.store) == 0};
  out.drain();
}
