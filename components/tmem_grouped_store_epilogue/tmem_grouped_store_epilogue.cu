// tmem_grouped_store_epilogue: fp32 accumulators in Tensor Memory -> bf16 -> swizzled
// shared-memory staging -> bounded 16-byte global stores. One warpgroup, one
// accumulator row per thread (pipelink/tmem_epilogue.cuh walks the tile); every thread
// stages its row and copies its share of each chunk out.
#include <type_traits>

#include "pl_tmem_grouped_store_epilogue.h"
#include "pipelink/tmem_epilogue.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM100_ALL)
#error "tmem_grouped_store_epilogue reads Tensor Memory, which only sm_100a has: build it for sm_100a"
#endif

using Params = pl_params_tmem_grouped_store_epilogue;
using Element = Params::dtype;

constexpr uint32_t kTileM = Params::tile_m;
constexpr uint32_t kTileN = Params::tile_n;
constexpr uint32_t kStoreN = Params::store_n;     // columns per load, staging row and copy
constexpr uint32_t kBuffers = Params::buffers;
constexpr uint32_t kStagingBytes = kTileM * kStoreN * sizeof(Element);

using Tile = pl::epi::TmemTile<kTileM, kTileN, kStoreN, kBuffers, kStagingBytes>;
using Copy = pl::epi::BoundedCopy<kTileM, kStoreN, Tile::kThreads>;

static_assert(std::is_same_v<Element, __nv_bfloat16>, "this epilogue writes bf16: set dtype: bf16");

// Epilogue's perspective, per tile: each chunk of a row is rounded to bf16 and staged;
// then every thread copies its pieces of the chunk inside this problem's rows.
extern "C" __device__ void pl_tmem_grouped_store_epilogue_store(
    const pl_place_tmem_grouped_store_epilogue& at,
    const pl_args_tmem_grouped_store_epilogue& args, const pl::KernelInfo& k,
    const pl::WorkTile& tile, pl_state_tmem_grouped_store_epilogue_store& st) {
  const uint32_t thread = pl::thread_in_role(at.role.store);
  const Tile walk{at.port.acc, st.acc, k, tile, thread, pl::warp_in_role(at.role.store),
                  at.bar.staged, at.smem.staging};
  const int32_t row0 = tile.first_row(kTileM);
  const int32_t col0 = tile.n_block * int32_t(kTileN);
  const Copy copy = Copy::within(args.c, args.rows, args.cols, tile);
  walk.run(
      [](uint32_t buffer, uint32_t r, const float (&v)[kStoreN], uint32_t) {
        pl::epi::stage_row_bf16<kStoreN>(buffer, r, v);
      },
      [&](uint32_t buffer, uint32_t c) {
        copy.run(buffer, thread, row0, col0 + int32_t(c * kStoreN));
      });
}
