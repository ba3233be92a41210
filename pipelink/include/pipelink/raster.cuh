// Grouped rasterisation of a GEMM's output tiles, shared by the schedulers.
#pragma once

#include <cstdint>

#include "pipelink/types.cuh"

namespace pl {

struct TileCoord {
  int32_t m_block;
  int32_t n_block;
};

// Linear tile t (< m_tiles * n_tiles) of an (m_tiles x n_tiles) grid. Tiles are
// numbered in groups of group_m tile rows, column by column inside a group (the last
// group may be shorter), so tiles close in t share rows of A and columns of B in L2.
__device__ __forceinline__ TileCoord raster_tile(uint32_t t, uint32_t m_tiles, uint32_t n_tiles,
                                                 uint32_t group_m) {
  group_m = group_m > 0 ? group_m : 1;
  const uint32_t group_tiles = group_m * n_tiles;
  const uint32_t first_row = (t / group_tiles) * group_m;
  const uint32_t rows = min(m_tiles - first_row, group_m);
  const uint32_t in_group = t % group_tiles;
  return TileCoord{int32_t(first_row + in_group % rows), int32_t(in_group / rows)};
}

// Linear tile t as a gemm_tile record over k-tiles [0, k_tiles), or the end marker
// when t is past the last tile.
__device__ __forceinline__ WorkTile gemm_tile(uint32_t t, uint32_t m_tiles, uint32_t n_tiles,
                                              uint32_t group_m, uint32_t k_tiles) {
  if (t >= m_tiles * n_tiles) return WorkTile{};
  const TileCoord c = raster_tile(t, m_tiles, n_tiles, group_m);
  return WorkTile{c.m_block, c.n_block, 0, 0, int32_t(k_tiles), 1, 0, kRowsUnbounded};
}

}  // namespace pl
