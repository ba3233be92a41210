// tmem_grouped_swiglu_epilogue: fp32 gate/up accumulators in Tensor Memory ->
// silu(gate) * up -> bf16 -> swizzled shared-memory staging -> bounded 16-byte global
// stores. One warpgroup, one accumulator row per thread (pipelink/tmem_epilogue.cuh
// walks the tile); a thread holds both halves of every output of its row.
#include <type_traits>

#include "pl_tmem_grouped_swiglu_epilogue.h"
#include "pipelink/tmem_epilogue.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM100_ALL)
#error "tmem_grouped_swiglu_epilogue reads Tensor Memory, which only sm_100a has: build it for sm_100a"
#endif

using Params = pl_params_tmem_grouped_swiglu_epilogue;
using Element = Params::dtype;

constexpr uint32_t kTileM = Params::tile_m;
constexpr uint32_t kTileN = Params::tile_n;                 // gate + up columns
constexpr uint32_t kOutN = kTileN / 2;                      // output columns per tile
constexpr uint32_t kStoreN = Params::store_n;               // outputs per staged chunk
constexpr uint32_t kChunkN = 2 * kStoreN;                   // accumulator columns behind them
constexpr uint32_t kBuffers = Params::buffers;
constexpr uint32_t kStagingBytes = kTileM * kStoreN * sizeof(Element);

using Tile = pl::epi::TmemTile<kTileM, kTileN, kChunkN, kBuffers, kStagingBytes>;
using Copy = pl::epi::BoundedCopy<kTileM, kStoreN, Tile::kThreads>;

static_assert(std::is_same_v<Element, __nv_bfloat16>, "this epilogue writes bf16: set dtype: bf16");
static_assert(kStoreN * sizeof(Element) == pl::epi::kSwizzleRowBytes,
              "a staging row is one 128-byte swizzle row: set store_n = 128 / sizeof(dtype)");

// Epilogue's perspective, per tile: each chunk of a row becomes store_n outputs,
// staged; then every thread copies its pieces of the chunk inside this expert's rows.
extern "C" __device__ void pl_tmem_grouped_swiglu_epilogue_store(
    const pl_place_tmem_grouped_swiglu_epilogue& at,
    const pl_args_tmem_grouped_swiglu_epilogue& args, const pl::KernelInfo& k,
    const pl::WorkTile& tile, pl_state_tmem_grouped_swiglu_epilogue_store& st) {
  const uint32_t thread = pl::thread_in_role(at.role.store);
  const Tile walk{at.port.acc, st.acc, k, tile, thread, pl::warp_in_role(at.role.store),
                  at.bar.staged, at.smem.staging};
  const int32_t row0 = tile.first_row(kTileM);
  const int32_t col0 = tile.n_block * int32_t(kOutN);
  const Copy copy = Copy::within(args.out, args.rows, args.cols, tile);
  walk.run(
      [](uint32_t buffer, uint32_t r, const float (&v)[kChunkN], uint32_t) {
        pl::epi::stage_swiglu_row<kStoreN>(buffer, r, v);
      },
      [&](uint32_t buffer, uint32_t c) {
        copy.run(buffer, thread, row0, col0 + int32_t(c * kStoreN));
      });
}
