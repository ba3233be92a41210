// dynamic_scheduler: persistent grid that claims output tiles from a global counter.
//
// The first gridDim.x tiles go to blocks by index (no atomic on the launch's critical
// path); tile gridDim.x + c goes to whichever block's atomicAdd returned c. Every tile
// number is claimed exactly once, and a block stops at its first number past the end.
#include "pl_dynamic_scheduler.h"

// Scheduler's perspective, one lane, per record.
extern "C" __device__ pl::WorkTile pl_dynamic_scheduler_schedule(
    const pl_place_dynamic_scheduler& at, const pl_args_dynamic_scheduler& args,
    const pl::KernelInfo& k, uint32_t iteration, pl_state_dynamic_scheduler_schedule&) {
  uint32_t t = blockIdx.x;
  if (iteration > 0) {
    auto* counter = reinterpret_cast<uint32_t*>(static_cast<unsigned char*>(k.workspace) +
                                                 at.counter.next_tile);
    t = gridDim.x + atomicAdd(counter, 1u);
  }
  return pl::gemm_tile(t, args.m_tiles, args.n_tiles, args.group_m, args.k_tiles);
}
