// store_epilogue: fp32 accumulators -> bf16 -> swizzled shared-memory staging -> TMA
// store. Runs in the warps that hold the accumulators (a register hand-off); one
// thread of the role issues the stores.
#include <type_traits>

#include "pl_store_epilogue.h"
#include "pipelink/epilogue.cuh"
#include "pipelink/splitk.cuh"

using Params = pl_params_store_epilogue;
using Element = Params::dtype;

using Shape = pl::epi::StagedShape<Params::tile_m, Params::tile_n, Params::store_n,
                                   Params::buffers, Element, Params::swizzle>;

constexpr uint32_t kTileM = Params::tile_m;
constexpr uint32_t kTileN = Params::tile_n;
constexpr uint32_t kStoreN = Params::store_n;               // columns per TMA store
constexpr uint32_t kBuffers = Params::buffers;
constexpr uint32_t kThreads = Shape::kThreads;
constexpr uint32_t kAccCount = Shape::kAccCount;

static_assert(std::is_same_v<Element, __nv_bfloat16>, "this epilogue writes bf16: set dtype: bf16");
static_assert(kTileM <= pl::tma::kMaxBoxRows, "a TMA box spans at most 256 rows: lower tile_m");

// Epilogue's perspective, per tile: every thread converts its fragment chunk by
// chunk into the staging tile; the issuer stores each chunk once it is complete.
extern "C" __device__ void pl_store_epilogue_store(const pl_place_store_epilogue& at,
                                                   const pl_args_store_epilogue& args,
                                                   const pl::KernelInfo& k, const pl::WorkTile& tile,
                                                   pl_state_store_epilogue_store&,
                                                   float (&acc)[kAccCount]) {
  const uint32_t thread = pl::thread_in_role(at.role.store);
  if (!pl::splitk::combine<kAccCount, kThreads>(tile, k, acc, thread, at.bar.staged)) {
    return;   // a piece of a split tile: its partial is published, piece 0 stores
  }
  const uint32_t first_row = pl::epi::warp_row(thread);
  const pl::epi::StagedStore<kBuffers> out{at.bar.staged, kThreads, thread == 0};
  const int32_t row = tile.m_block * int32_t(kTileM);
  const int32_t col = tile.n_block * int32_t(kTileN);
#pragma unroll
  for (uint32_t c = 0; c < Shape::kChunks; ++c) {
    const uint32_t buffer = at.smem.staging + (c % kBuffers) * Shape::kStagingBytes;
    out.begin();
    pl::epi::stage_chunk_bf16<Shape::kBlocksPerChunk, kAccCount, Shape::Staging>(buffer,
                                                                                  first_row, c, acc);
    out.finish(args.tma_c, buffer, col + int32_t(c * kStoreN), row);
  }
}

// Epilogue's perspective, once after the last tile: the stores have landed.
extern "C" __device__ void pl_store_epilogue_store_tail(const pl_place_store_epilogue& at,
                                                        const pl_args_store_epilogue&,
                                                        const pl::KernelInfo&,
                                                        pl_state_store_epilogue_store&) {
  const pl::epi::StagedStore<kBuffers> out{at.bar.staged, kThreads,
                                           pl::thread_in_role(at.role.store) == 0};
  out.drain();
}
