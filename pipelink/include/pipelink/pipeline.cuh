// The paired pipeline API over a placed ring port: an smem_pipeline (PipePort, stages
// in shared memory) or a tmem port (TmemPort, accumulator buffers in Tensor Memory; its
// producer commits with tcgen05.commit, see pipelink/tcgen05.cuh).
//
//   producer: acquire(state) -> write stage (or TMA into it) -> commit(state[, tx bytes])
//   consumer: wait(state)    -> read stage                  -> release(state)
//   both:     state.advance(port)
//
// A consumer that reads a stage with ordinary loads and hands it back to a TMA
// producer must fence first: the copy engine (async proxy) writes the stage next,
// and without `pl::fence_proxy_async_smem()` in every reading thread before the
// release (or before the named barrier that precedes an elected release) the
// overwrite can overtake the reads.
//
// The glue owns each PipeState and keeps it across work tiles, so a component
// handles one tile per call and the ring never restarts out of phase.
#pragma once

#include <cstdint>

#include "pipelink/cluster.cuh"
#include "pipelink/mbarrier.cuh"
#include "pipelink/types.cuh"
#include "pipelink/warp.cuh"

namespace pl {

struct PipeState {
  uint32_t stage = 0;
  uint32_t phase = 0;

  template <class Port>
  __device__ void advance(const Port& port) {
    if (++stage == port.stages) {
      stage = 0;
      phase ^= 1;
    }
  }

  // Steps over `count` stages that another consumer takes (a pingpong team's
  // records): where this consumer's next stage is, without waiting on any.
  template <class Port>
  __device__ void skip(const Port& port, uint32_t count) {
    const uint32_t to = stage + count;
    phase ^= (to / port.stages) & 1;
    stage = to % port.stages;
  }
};

// A ring between a component's own roles (roles.<r>.state): the component places its
// buffers and mbarriers itself, and keeps a PipeState per role in the glue's state.
// OwnRing{stages} is what PipeState::advance needs of it; own_barrier the mbarrier of a
// state's stage in an array of `stages` of them.
struct OwnRing {
  uint32_t stages;
};

__device__ __forceinline__ uint32_t own_barrier(uint32_t array, const PipeState& s) {
  return array + s.stage * mbar::kBytes;
}

__device__ __forceinline__ uint32_t stage_offset(const PipePort& port, const PipeState& s) {
  return port.buffer + s.stage * port.stage_bytes;
}

// The first Tensor Memory column of the current buffer of a tmem port (add the
// kernel's TMEM base for an address).
__device__ __forceinline__ uint32_t stage_column(const TmemPort& port, const PipeState& s) {
  return port.column + s.stage * port.stage_columns;
}

template <class Port>
__device__ __forceinline__ uint32_t full_barrier(const Port& port, const PipeState& s) {
  return port.full + s.stage * mbar::kBytes;
}

template <class Port>
__device__ __forceinline__ uint32_t empty_barrier(const Port& port, const PipeState& s) {
  return port.empty + s.stage * mbar::kBytes;
}

// Producer's view: the first pass over the ring finds every stage empty, hence
// the inverted parity.
template <class Port>
__device__ __forceinline__ void producer_acquire(const Port& port, const PipeState& s) {
  mbar::wait(empty_barrier(port, s), s.phase ^ 1);
}

__device__ __forceinline__ void producer_commit(const PipePort& port, const PipeState& s) {
  mbar::arrive(full_barrier(port, s));
}

// For TMA producers: arm the full barrier with the bytes the copy engine will land.
__device__ __forceinline__ void producer_expect(const PipePort& port, const PipeState& s,
                                                uint32_t tx_bytes) {
  mbar::arrive_expect_tx(full_barrier(port, s), tx_bytes);
}

// A TMA producer warp's fill of one stage: the warp waits for the stage together, then
// one elected lane (elect.sync: issued once, with no loop over active lanes) arms the
// full barrier for `tx_bytes` and issues `copy(stage offset, full barrier offset)`.
template <class Copy>
__device__ __forceinline__ void producer_fill(const PipePort& port, const PipeState& s,
                                              uint32_t tx_bytes, Copy&& copy) {
  producer_acquire(port, s);
  if (elect_one_sync()) {
    producer_expect(port, s, tx_bytes);
    copy(stage_offset(port, s), full_barrier(port, s));
  }
  __syncwarp();
}

// Consumer's view.
template <class Port>
__device__ __forceinline__ void consumer_wait(const Port& port, const PipeState& s) {
  mbar::wait(full_barrier(port, s), s.phase);
}

template <class Port>
__device__ __forceinline__ void consumer_release(const Port& port, const PipeState& s) {
  mbar::arrive(empty_barrier(port, s));
}

// A stage of a ring that the MULTICAST CTAs of the cluster fill together by TMA
// multicast (port field `multicast`): each CTA's readers release it in all of them, so
// no producer overwrites a peer's copy that is still being read.
template <uint32_t MULTICAST, class Port>
__device__ __forceinline__ void consumer_release_all(const Port& port, const PipeState& s) {
  if constexpr (MULTICAST == 1) {
    consumer_release(port, s);
  } else {
#pragma unroll
    for (uint32_t peer = 0; peer < MULTICAST; ++peer) {
      cluster::arrive_peer(empty_barrier(port, s), peer);
    }
  }
}

}  // namespace pl
