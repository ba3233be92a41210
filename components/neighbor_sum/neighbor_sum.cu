// neighbor_sum: reads a tile another CTA produced, through the global workspace.
#include "pl_neighbor_sum.h"

using Params = pl_params_neighbor_sum;

constexpr uint32_t kRows = Params::rows;
constexpr uint32_t kPerLane = kRows / pl::kWarpThreads;
constexpr uint32_t kFullMask = 0xffffffffu;

static_assert(kRows % pl::kWarpThreads == 0, "rows must be a multiple of 32");

// One warp: lane 0 acquires the neighbour's counter, then the warp sums its slot.
extern "C" __device__ void pl_neighbor_sum_sum(const pl_place_neighbor_sum& at,
                                               const pl_args_neighbor_sum& args,
                                               const pl::KernelInfo& k, const pl::WorkTile& tile,
                                               pl_state_neighbor_sum_sum&) {
  const uint32_t neighbor = (uint32_t(tile.m_block) + 1) % args.tiles;
  if (pl::lane() == 0) pl::global_acquire(at.port.partial, k, neighbor, 1);
  __syncwarp();
  const float* slot = pl::global_slot<const float>(at.port.partial, k, neighbor);
  float sum = 0.0f;
#pragma unroll
  for (uint32_t i = 0; i < kPerLane; ++i) sum += __ldcg(slot + i * pl::kWarpThreads + pl::lane());
#pragma unroll
  for (uint32_t offset = pl::kWarpThreads / 2; offset > 0; offset /= 2)
    sum += __shfl_xor_sync(kFullMask, sum, offset);
  if (pl::lane() == 0) args.out[tile.m_block] = sum;
}
