// grouped_store_epilogue: fp32 accumulators -> bf16 -> swizzled shared-memory staging
// -> bounded 16-byte global stores. Runs in the warps that hold the accumulators (a
// register hand-off); every thread stages its fragment and copies its share out.
#include <type_traits>

#include "pl_grouped_store_epilogue.h"
#include "pipelink/epilogue.cuh"

using Params = pl_params_grouped_store_epilogue;
using Element = Params::dtype;

using Shape = pl::epi::StagedShape<Params::tile_m, Params::tile_n, Params::store_n,
                                   Params::buffers, Element>;

constexpr uint32_t kTileM = Params::tile_m;
constexpr uint32_t kTileN = Params::tile_n;
constexpr uint32_t kStoreN = Params::store_n;               // columns per staged chunk
constexpr uint32_t kBuffers = Params::buffers;
constexpr uint32_t kThreads = Shape::kThreads;
constexpr uint32_t kAccCount = Shape::kAccCount;
static_assert(std::is_same_v<Element, __nv_bfloat16>, "this epilogue writes bf16: set dtype: bf16");
using Turns = pl::epi::StagingTurns<kBuffers>;
using Copy = pl::epi::BoundedCopy<kTileM, kStoreN, kThreads>;

// Epilogue's perspective, per tile: stage a chunk, wait for the whole role, copy it
// out within the bounds (pl::epi::StagingTurns: why one barrier per chunk is enough
// with rotating buffers, and one buffer needs a second).
extern "C" __device__ void pl_grouped_store_epilogue_store(
    const pl_place_grouped_store_epilogue& at, const pl_args_grouped_store_epilogue& args,
    const pl::KernelInfo&, const pl::WorkTile& tile, pl_state_grouped_store_epilogue_store&,
    float (&acc)[kAccCount]) {
  const uint32_t thread = pl::thread_in_role(at.role.store);
  const uint32_t first_row = pl::epi::warp_row(thread);
  const int32_t row0 = tile.first_row(kTileM);
  const int32_t col0 = tile.n_block * int32_t(kTileN);
  const Copy copy = Copy::within(args.c, args.rows, args.cols, tile);   // this problem's rows
#pragma unroll
  for (uint32_t c = 0; c < Shape::kChunks; ++c) {
    const uint32_t buffer = at.smem.staging + (c % kBuffers) * Shape::kStagingBytes;
    pl::epi::stage_chunk_bf16<Shape::kBlocksPerChunk>(buffer, first_row, c, acc);
    pl::named_sync(at.bar.staged, kThreads);
    copy.run(buffer, thread, row0, col0 + int32_t(c * kStoreN));
    Turns::after_copy(at.bar.staged, kThreads);
  }
}
