// Thread-block clusters (sm_90+): a CTA's rank in its cluster, addresses in a peer
// CTA's shared memory, arrivals on a peer's mbarrier, and the cluster-wide barrier.
//
// A kernel whose recipe sets launch.cluster is compiled with __cluster_dims__; the
// glue runs a cluster barrier after the mbarriers are initialised (no CTA arrives on a
// peer's barrier before the peer has set it up) and another before Tensor Memory is
// freed and the CTAs exit (no CTA leaves while a peer may still reach its memory).
#pragma once

#include <cstdint>

#include "pipelink/smem.cuh"

namespace pl::cluster {

// This CTA's rank in its cluster.
__device__ __forceinline__ uint32_t rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

// The shared::cluster address of the placed offset `offset` in CTA `peer`'s memory.
__device__ __forceinline__ uint32_t peer_addr(uint32_t offset, uint32_t peer) {
  uint32_t addr;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
               : "=r"(addr) : "r"(smem_addr(offset)), "r"(peer));
  return addr;
}

// One arrival on the mbarrier at `offset` in CTA `peer`. The default semantics
// (release at CTA scope) suffice for an empty-stage release: what it orders are this
// thread's completed reads of a stage before the peer's TMA overwrites it, and the
// copy engine waits on the barrier itself. Release at cluster scope would also flush
// this thread's writes to the whole cluster, on every stage, for nothing.
__device__ __forceinline__ void arrive_peer(uint32_t offset, uint32_t peer) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];"
               :: "r"(peer_addr(offset, peer)) : "memory");
}

// Every thread of every CTA of the cluster.
__device__ __forceinline__ void sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n"
               "barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

}  // namespace pl::cluster
