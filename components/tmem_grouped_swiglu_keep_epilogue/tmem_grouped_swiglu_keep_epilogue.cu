// tmem_grouped_swiglu_keep_epilogue: fp32 gate/up accumulators in Tensor Memory ->
// silu(gate) * up -> H, and the accumulators themselves -> the pre-activations, both
// through swizzled staging and bounded 16-byte global stores. One warpgroup, one
// accumulator row per thread (pipelink/tmem_epilogue.cuh walks the tile).
#include <type_traits>

#include "pl_tmem_grouped_swiglu_keep_epilogue.h"
#include "pipelink/tmem_epilogue.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM100_ALL)
#error "tmem_grouped_swiglu_keep_epilogue reads Tensor Memory, which only sm_100a has: build it for sm_100a"
#endif

using Params = pl_params_tmem_grouped_swiglu_keep_epilogue;
using Element = Params::dtype;

constexpr uint32_t kTileM = Params::tile_m;
constexpr uint32_t kTileN = Params::tile_n;                 // gate + up columns
constexpr uint32_t kOutN = kTileN / 2;                      // output columns per tile
constexpr uint32_t kStoreN = Params::store_n;               // outputs per staged chunk
constexpr uint32_t kChunkN = 2 * kStoreN;                   // accumulator columns behind them
constexpr uint32_t kBuffers = Params::buffers;
constexpr uint32_t kStagingBytes = kTileM * kStoreN * sizeof(Element);
constexpr uint32_t kPrePerChunk = kChunkN / kStoreN;        // pre-activation staging tiles

using Tile = pl::epi::TmemTile<kTileM, kTileN, kChunkN, kBuffers, kStagingBytes>;
using Copy = pl::epi::BoundedCopy<kTileM, kStoreN, Tile::kThreads>;
using Half = const float (&)[kStoreN];                      // one staging row of a chunk

static_assert(std::is_same_v<Element, __nv_bfloat16>, "this epilogue writes bf16: set dtype: bf16");
static_assert(kStoreN * sizeof(Element) == pl::epi::kSwizzleRowBytes,
              "a staging row is one 128-byte swizzle row: set store_n = 128 / sizeof(dtype)");

// Epilogue's perspective, per tile: each chunk of a row becomes store_n outputs and
// 2 store_n pre-activations, staged; then every thread copies its pieces of all three
// inside this expert's rows. The output staging rotates, the pre-activation pair does
// not: a second barrier after the copies frees it for the next chunk.
extern "C" __device__ void pl_tmem_grouped_swiglu_keep_epilogue_store(
    const pl_place_tmem_grouped_swiglu_keep_epilogue& at,
    const pl_args_tmem_grouped_swiglu_keep_epilogue& args, const pl::KernelInfo& k,
    const pl::WorkTile& tile, pl_state_tmem_grouped_swiglu_keep_epilogue_store& st) {
  const uint32_t thread = pl::thread_in_role(at.role.store);
  const Tile walk{at.port.acc, st.acc, k, tile, thread, pl::warp_in_role(at.role.store),
                  at.bar.staged, at.smem.staging};
  const int32_t row0 = tile.first_row(kTileM);
  const int32_t row_end = min(tile.m_end, int32_t(args.rows));
  const bool aligned = args.cols % Copy::kPieceElems == 0;        // 16-byte aligned rows
  const Copy out{args.out, int32_t(args.cols), row_end, aligned};
  const Copy pre{args.pre, int32_t(kPrePerChunk * args.cols), row_end, aligned};
  const int32_t out_col0 = tile.n_block * int32_t(kOutN);
  const int32_t pre_col0 = tile.n_block * int32_t(kTileN);
  const uint32_t pre_buffer = at.smem.pre_staging;
  walk.run(
      [&](uint32_t buffer, uint32_t r, const float (&v)[kChunkN], uint32_t) {
        pl::epi::stage_swiglu_row<kStoreN>(buffer, r, v);
#pragma unroll
        for (uint32_t p = 0; p < kPrePerChunk; ++p) {
          pl::epi::stage_row_bf16<kStoreN>(pre_buffer + p * kStagingBytes, r,
                                           reinterpret_cast<Half>(v[p * kStoreN]));
        }
      },
      [&](uint32_t buffer, uint32_t c) {
        out.run(buffer, thread, row0, out_col0 + int32_t(c * kStoreN));
#pragma unroll
        for (uint32_t p = 0; p < kPrePerChunk; ++p) {
          pre.run(pre_buffer + p * kStagingBytes, thread, row0,
                  pre_col0 + int32_t((kPrePerChunk * c + p) * kStoreN));
        }
        pl::named_sync(at.bar.staged, Tile::kThreads);   // the pre-activation pair is free
      });
}
