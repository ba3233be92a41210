// row_store: an epilogue in the warps of row_reduce. Thread t of the role holds the
// column-group sums of row t of the current tile in registers.
#include "pl_row_store.h"

using Params = pl_params_row_store;

constexpr uint32_t kRows = Params::rows;
constexpr uint32_t kGroups = Params::groups;

static_assert(kRows % pl::kWarpThreads == 0, "rows must fill whole warps: make it a multiple of 32");

// Epilogue's perspective: one row per thread, then one thread publishes the tile.
extern "C" __device__ void pl_row_store_store(const pl_place_row_store& at,
                                              const pl_args_row_store& args,
                                              const pl::KernelInfo& k, const pl::WorkTile& tile,
                                              pl_state_row_store_store&, float (&acc)[kGroups]) {
  const uint32_t row_in_tile = pl::thread_in_role(at.role.store);
  const uint64_t row = uint64_t(tile.m_block) * kRows + row_in_tile;
  float total = 0.0f;
#pragma unroll
  for (uint32_t j = 0; j < kGroups; ++j) {
    args.out[row * kGroups + j] = acc[j];
    total += acc[j];
  }
  const uint32_t slot = uint32_t(tile.m_block);
  if (slot >= at.port.partial.slots) __trap();  // more tiles than max_tiles: raise it
  pl::global_slot<float>(at.port.partial, k, slot)[row_in_tile] = total;
  __threadfence();
  pl::named_sync(at.bar.published, kRows);
  if (row_in_tile == 0) pl::global_publish(at.port.partial, k, slot);
}
