// tmem_bias_gelu_epilogue: Y = gelu_tanh(acc + bias[col]) from a Tensor Memory
// accumulator -> bf16 -> swizzled shared-memory staging -> TMA store. One warpgroup,
// one accumulator row per thread (pipelink/tmem_epilogue.cuh walks the tile).
#include <type_traits>

#include "pl_tmem_bias_gelu_epilogue.h"
#include "pipelink/tmem_epilogue.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM100_ALL)
#error "tmem_bias_gelu_epilogue reads Tensor Memory, which only sm_100a has: build it for sm_100a"
#endif

using Params = pl_params_tmem_bias_gelu_epilogue;
using Element = Params::dtype;

constexpr uint32_t kTileM = Params::tile_m;
constexpr uint32_t kTileN = Params::tile_n;
constexpr uint32_t kStoreN = Params::store_n;     // columns per load, staging row and TMA store
constexpr uint32_t kBuffers = Params::buffers;
constexpr uint32_t kStagingBytes = kTileM * kStoreN * sizeof(Element);
constexpr uint32_t kPieceCols = pl::epi::kChunkBytes / sizeof(Element);   // 8 per 16 bytes

using Tile = pl::epi::TmemTile<kTileM, kTileN, kStoreN, kBuffers, kStagingBytes>;

static_assert(std::is_same_v<Element, __nv_bfloat16>, "this epilogue writes bf16: set dtype: bf16");
static_assert(kStoreN * sizeof(Element) == pl::epi::kSwizzleRowBytes,
              "a staging row is one 128-byte swizzle row: set store_n = 128 / sizeof(dtype)");

// One chunk of a row: gelu(acc + bias) for its store_n columns, staged in 16-byte
// pieces. `bias` and `cols_left` start at the chunk's first column.
__device__ __forceinline__ void stage_bias_gelu_row(uint32_t buffer, uint32_t row,
                                                    const float (&v)[kStoreN],
                                                    const Element* bias, int32_t cols_left) {
#pragma unroll
  for (uint32_t q = 0; q < kStoreN / kPieceCols; ++q) {
    uint32_t packed[kPieceCols / 2];
#pragma unroll
    for (uint32_t i = 0; i < kPieceCols / 2; ++i) {
      const uint32_t j = q * kPieceCols + 2 * i;
      packed[i] = pl::epi::pack_bf16x2(
          pl::epi::gelu_tanh(v[j] + pl::epi::bias_at(bias, cols_left, j)),
          pl::epi::gelu_tanh(v[j + 1] + pl::epi::bias_at(bias, cols_left, j + 1)));
    }
    pl::st_shared_v4(buffer + pl::epi::sw128_offset(row, q), packed[0], packed[1], packed[2],
                     packed[3]);
  }
}

// Epilogue's perspective, per tile: each chunk of a row gets its columns' bias and
// GELU, and is staged; the issuer stores the chunk at its place in Y.
extern "C" __device__ void pl_tmem_bias_gelu_epilogue_store(
    const pl_place_tmem_bias_gelu_epilogue& at, const pl_args_tmem_bias_gelu_epilogue& args,
    const pl::KernelInfo& k, const pl::WorkTile& tile,
    pl_state_tmem_bias_gelu_epilogue_store& st) {
  const Tile walk{at.port.acc, st.acc, k, tile, pl::thread_in_role(at.role.store),
                  pl::warp_in_role(at.role.store), at.bar.staged, at.smem.staging};
  const int32_t row = tile.m_block * int32_t(kTileM);
  const int32_t col = tile.n_block * int32_t(kTileN);
  // Read once: the barriers' memory clobbers would reload args per use.
  const Element* tile_bias = args.bias + col;
  const int32_t cols_left = int32_t(args.n) - col;
  walk.run(
      [&](uint32_t buffer, uint32_t r, const float (&v)[kStoreN], uint32_t c) {
        const uint32_t first = c * kStoreN;
        stage_bias_gelu_row(buffer, r, v, tile_bias + first, cols_left - int32_t(first));
      },
      walk.tma_store<kStoreN>(args.tma_c, col, row));
}

// Epilogue's perspective, once after the last tile: the stores have landed.
extern "C" __device__ void pl_tmem_bias_gelu_epilogue_store_tail(
    const pl_place_tmem_bias_gelu_epilogue& at, const pl_args_tmem_bias_gelu_epilogue&,
    const pl::KernelInfo&, pl_state_tmem_bias_gelu_epilogue_store&) {
  const pl::epi::StagedStore<kBuffers> out{at.bar.staged, Tile::kThreads,
                                           pl::thread_in_role(at.role.store) == 0};
  out.drain();
}
