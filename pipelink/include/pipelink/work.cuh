// The work ring: a scheduler broadcasts work records to every looping role.
//
//   scheduler (one lane): acquire(state) -> write record -> commit(state)
//   each consuming warp:  wait(state) -> its roles read the record in place -> release
//   both:                 state.advance(ring)
//
// The full barrier of a stage counts the scheduler's one arrival; its empty barrier
// counts one arrival per consuming warp (the glue sums them over every looping role),
// so a stage is rewritten only after every role has read it. mbarrier arrive has
// release and try_wait acquire semantics, which order the record's plain store and
// loads around them. The last record is invalid (the end marker): every consumer
// reads it, releases it and leaves its loop; the scheduler leaves after writing it.
#pragma once

#include <cstdint>

#include "pipelink/mbarrier.cuh"
#include "pipelink/smem.cuh"
#include "pipelink/types.cuh"
#include "pipelink/warp.cuh"

namespace pl {

struct WorkState {
  uint32_t stage = 0;
  uint32_t phase = 0;

  __device__ void advance(const WorkRing& ring) {
    if (++stage == ring.stages) {
      stage = 0;
      phase ^= 1;
    }
  }
};

__device__ __forceinline__ uint32_t work_record(const WorkRing& ring, const WorkState& s) {
  return ring.records + s.stage * uint32_t(sizeof(WorkTile));
}

// Scheduler's view. The first pass finds every stage empty, hence the inverted parity.
__device__ __forceinline__ void work_acquire(const WorkRing& ring, const WorkState& s) {
  mbar::wait(ring.empty + s.stage * mbar::kBytes, s.phase ^ 1);
}

__device__ __forceinline__ void work_commit(const WorkRing& ring, const WorkState& s,
                                            const WorkTile& record) {
  *smem_ptr<WorkTile>(work_record(ring, s)) = record;
  mbar::arrive(ring.full + s.stage * mbar::kBytes);
}

// A consuming warp's view: every lane waits, then reads the record in place, field by
// field where its roles use them (broadcast loads; the record costs no registers
// across a mainloop), and the warp's first lane hands the stage back once every role
// of the warp is done with the record.
__device__ __forceinline__ const WorkTile& work_wait(const WorkRing& ring, const WorkState& s) {
  mbar::wait(ring.full + s.stage * mbar::kBytes, s.phase);
  return *smem_ptr<const WorkTile>(work_record(ring, s));
}

__device__ __forceinline__ void work_release(const WorkRing& ring, const WorkState& s) {
  __syncwarp();
  if (lane() == 0) mbar::arrive(ring.empty + s.stage * mbar::kBytes);
}

}  // namespace pl
