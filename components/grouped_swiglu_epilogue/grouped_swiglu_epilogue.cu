// grouped_swiglu_epilogue: fp32 gate/up accumulators -> silu(gate) * up -> bf16 ->
// swizzled shared-memory staging -> bounded 16-byte global stores. The SwiGLU math and
// staging are swiglu_epilogue's (pl::epi::stage_chunk_swiglu), the bounded copy
// grouped_store_epilogue's (pl::epi::BoundedCopy): a grouped tile stops at its
// expert's last row, which a TMA store cannot.
#include <type_traits>

#include "pl_grouped_swiglu_epilogue.h"
#include "pipelink/epilogue.cuh"

using Params = pl_params_grouped_swiglu_epilogue;
using Element = Params::dtype;

constexpr uint32_t kTileM = Params::tile_m;
constexpr uint32_t kOutN = Params::tile_n / 2;              // output columns per tile
constexpr uint32_t kStoreN = Params::store_n;               // columns per staged chunk
constexpr uint32_t kBuffers = Params::buffers;

// The output tile is (TILE_M x TILE_N / 2); the accumulators hold TILE_N columns.
using Shape = pl::epi::StagedShape<kTileM, kOutN, kStoreN, kBuffers, Element>;
constexpr uint32_t kThreads = Shape::kThreads;
constexpr uint32_t kAccCount = 2 * Shape::kAccCount;
using Copy = pl::epi::BoundedCopy<kTileM, kStoreN, kThreads>;

static_assert(std::is_same_v<Element, __nv_bfloat16>, "this epilogue writes bf16: set dtype: bf16");
static_assert(kBuffers >= 2, "one barrier per chunk orders staging against copying only "
                             "with two or more rotating buffers: make buffers >= 2");

// Epilogue's perspective, per tile: stage a chunk of SwiGLU outputs, wait for the whole
// role, copy it out within the expert's rows. A thread stages chunk c only after
// passing chunk c-1's barrier, which every thread reached after copying chunk c-2,
// the last user of this buffer.
extern "C" __device__ void pl_grouped_swiglu_epilogue_store(
    const pl_place_grouped_swiglu_epilogue& at, const pl_args_grouped_swiglu_epilogue& args,
    const pl::KernelInfo&, const pl::WorkTile& tile, pl_state_grouped_swiglu_epilogue_store&,
    float (&acc)[kAccCount]) {
  const uint32_t thread = pl::thread_in_role(at.role.store);
  const uint32_t first_row = pl::epi::warp_row(thread);
  const int32_t row0 = tile.first_row(kTileM);
  const int32_t col0 = tile.n_block * int32_t(kOutN);
  const Copy copy = Copy::within(args.out, args.rows, args.cols, tile);   // this expert's rows
#pragma unroll
  for (uint32_t c = 0; c < Shape::kChunks; ++c) {
    const uint32_t buffer = at.smem.staging + (c % kBuffers) * Shape::kStagingBytes;
    pl::epi::stage_chunk_swiglu<Shape::kBlocksPerChunk>(buffer, first_row, c, acc);
    pl::named_sync(at.bar.staged, kThreads);
    copy.run(buffer, thread, row0, col0 + int32_t(c * kStoreN));
  }
}
