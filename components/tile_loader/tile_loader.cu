// tile_loader: one producer warp streaming tiles of a row-major tensor into a
// shared-memory ring with TMA. Work tile m reads rows [m*ROWS, (m+1)*ROWS) and
// k_tiles consecutive column blocks of COLS.
#include "pl_tile_loader.h"

using Params = pl_params_tile_loader;
using Element = Params::dtype;

constexpr uint32_t kTileBytes = Params::rows * Params::cols * sizeof(Element);

static_assert(Params::cols * sizeof(Element) % 16 == 0,
              "a TMA box row must be a multiple of 16 bytes: raise cols");
static_assert(Params::rows <= pl::tma::kMaxBoxRows &&
                  Params::cols * sizeof(Element) <= pl::tma::kMaxBoxRows * 16,
              "TMA boxes span at most 256 elements per dimension: lower rows or cols");

// Producer's perspective: one elected lane issues every copy.
extern "C" __device__ void pl_tile_loader_producer(const pl_place_tile_loader& at,
                                                   const pl_args_tile_loader& args,
                                                   const pl::KernelInfo&, const pl::WorkTile& tile,
                                                   pl_state_tile_loader_producer& st) {
  if (!pl::elect_one_in_warp()) return;
  const int32_t row = tile.m_block * Params::rows;
  for (uint32_t k = 0; k < args.k_tiles; ++k) {
    pl::producer_acquire(at.port.tiles, st.tiles);
    pl::producer_expect(at.port.tiles, st.tiles, kTileBytes);
    pl::tma::load_2d(pl::stage_offset(at.port.tiles, st.tiles), args.src,
                     pl::full_barrier(at.port.tiles, st.tiles), int32_t(k * Params::cols), row);
    st.tiles.advance(at.port.tiles);
  }
}
