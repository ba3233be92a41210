// Plain types of the placement ABI. Layout-stable: the glue emits aggregate
// initialisers in this field order.
#pragma once

#include <cstdint>

namespace pl {

// A TMA descriptor as the driver encodes it (CUtensorMap), opaque to device code.
// Kernel parameters hold it by value; components get a pointer to it.
struct alignas(64) TensorMap {
  uint64_t opaque[16];
};

// One smem_pipeline port as placed: a ring of `stages` buffers of `stage_bytes`
// each, with a `full` and an `empty` mbarrier per stage.
struct PipePort {
  uint32_t buffer;       // shared-memory offset of stage 0
  uint32_t stage_bytes;  // distance between stages
  uint32_t full;         // shared-memory offset of the full mbarrier array
  uint32_t empty;        // shared-memory offset of the empty mbarrier array
  uint32_t stages;
};

// A register hand-off needs no placement: the glue owns the array.

// A global-memory hand-off between CTAs: slots in the kernel's workspace, plus
// one release/acquire counter per slot.
struct GlobalPort {
  uint64_t slot_offset;  // byte offset of slot 0 in the workspace
  uint64_t slot_bytes;
  uint64_t counter_offset;  // byte offset of the uint32 counters in the workspace
  uint32_t slots;
};

// The unit of work every role of one kernel iterates over, produced by the
// scheduler (a component, or the default of one tile per CTA).
struct WorkTile {
  int32_t m_block;
  int32_t n_block;
  int32_t batch;
  int32_t valid;
  __device__ bool is_valid() const { return valid != 0; }
};

// Where a role's warps start: every warp index a component uses is relative to it.
struct RolePlace {
  uint32_t warp_base;
  uint32_t warps;
};

// Kernel-wide facts the glue passes to every role (its own warps are in RolePlace).
struct KernelInfo {
  void* workspace;       // global workspace for global hand-offs (may be null)
  uint32_t tmem_base;    // Tensor Memory address the glue allocated (sm_100a), else 0;
                         // a component's columns are tmem_base + at.tmem.<alloc>
};

}  // namespace pl
