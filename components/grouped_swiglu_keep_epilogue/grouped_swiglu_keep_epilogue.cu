// grouped_swiglu_keep_epilogue: fp32 gate/up accumulators -> silu(gate) * up -> H, and
// the accumulators themselves -> the pre-activations, both through swizzled staging
// and bounded 16-byte global stores (pl::epi::stage_chunk_swiglu, stage_chunk_bf16,
// BoundedCopy): a grouped tile stops at its expert's last row.
#include <type_traits>

#include "pl_grouped_swiglu_keep_epilogue.h"
#include "pipelink/epilogue.cuh"

using Params = pl_params_grouped_swiglu_keep_epilogue;
using Element = Params::dtype;

constexpr uint32_t kTileM = Params::tile_m;
constexpr uint32_t kTileN = Params::tile_n;                 // gate + up columns
constexpr uint32_t kOutN = kTileN / 2;                      // output columns per tile
constexpr uint32_t kStoreN = Params::store_n;               // columns per staged chunk
constexpr uint32_t kBuffers = Params::buffers;
constexpr uint32_t kPrePerChunk = 2;                        // pre-activation chunks per output chunk

// The output tile is (TILE_M x TILE_N / 2); the accumulators hold TILE_N columns.
using Shape = pl::epi::StagedShape<kTileM, kOutN, kStoreN, kBuffers, Element>;
constexpr uint32_t kThreads = Shape::kThreads;
constexpr uint32_t kAccCount = 2 * Shape::kAccCount;
using Copy = pl::epi::BoundedCopy<kTileM, kStoreN, kThreads>;

static_assert(std::is_same_v<Element, __nv_bfloat16>, "this epilogue writes bf16: set dtype: bf16");
static_assert(kBuffers >= 2, "one barrier per chunk orders staging against copying only "
                             "with two or more rotating buffers: make buffers >= 2");

// Epilogue's perspective, per tile: per output chunk c, stage its outputs and the two
// pre-activation chunks behind them (accumulator chunks 2c, 2c + 1), wait for the whole
// role, copy all three out within the expert's rows. The output buffers rotate, the
// pre-activation pair does not: a second barrier after the copies frees it.
extern "C" __device__ void pl_grouped_swiglu_keep_epilogue_store(
    const pl_place_grouped_swiglu_keep_epilogue& at,
    const pl_args_grouped_swiglu_keep_epilogue& args, const pl::KernelInfo&,
    const pl::WorkTile& tile, pl_state_grouped_swiglu_keep_epilogue_store&,
    float (&acc)[kAccCount]) {
  const uint32_t thread = pl::thread_in_role(at.role.store);
  const uint32_t first_row = pl::epi::warp_row(thread);
  const int32_t row0 = tile.first_row(kTileM);
  const int32_t row_end = min(tile.m_end, int32_t(args.rows));   // this expert's rows
  const int32_t out_col0 = tile.n_block * int32_t(kOutN);
  const int32_t pre_col0 = tile.n_block * int32_t(kTileN);
  const bool aligned = args.cols % Copy::kPieceElems == 0;        // 16-byte aligned rows
  const Copy out{args.out, int32_t(args.cols), row_end, aligned};
  const Copy pre{args.pre, int32_t(kPrePerChunk * args.cols), row_end, aligned};
#pragma unroll
  for (uint32_t c = 0; c < Shape::kChunks; ++c) {
    const uint32_t buffer = at.smem.staging + (c % kBuffers) * Shape::kStagingBytes;
    const uint32_t pre_buffer = at.smem.pre_staging;
    pl::epi::stage_chunk_swiglu<Shape::kBlocksPerChunk>(buffer, first_row, c, acc);
#pragma unroll
    for (uint32_t p = 0; p < kPrePerChunk; ++p) {
      pl::epi::stage_chunk_bf16<Shape::kBlocksPerChunk>(
          pre_buffer + p * Shape::kStagingBytes, first_row, kPrePerChunk * c + p, acc);
    }
    pl::named_sync(at.bar.staged, kThreads);
    out.run(buffer, thread, row0, out_col0 + int32_t(c * kStoreN));
#pragma unroll
    for (uint32_t p = 0; p < kPrePerChunk; ++p) {
      pre.run(pre_buffer + p * Shape::kStagingBytes, thread, row0,
              pre_col0 + int32_t((kPrePerChunk * c + p) * kStoreN));
    }
    pl::named_sync(at.bar.staged, kThreads);     // the pre-activation pair is free again
  }
}
