// Phases of one kernel: the roles of each phase run on the CTA's warps after those of
// the phase before. Between two phases every thread of the CTA meets, so the next
// phase may reuse the shared memory of the last. Where a phase reads what another
// phase wrote in other CTAs (recipe: `after:`), the CTAs meet grid-wide through a
// counter per awaited phase in the workspace, zeroed before each launch: one thread
// per CTA adds itself once done, the waiting CTAs' first threads acquire the count.
// The runtime launches such a kernel cooperatively, sized to the resident CTAs, so
// every CTA it waits for is running: no wait can deadlock.
#pragma once

#include <cstdint>

#include "pipelink/smem.cuh"
#include "pipelink/tma.cuh"
#include "pipelink/types.cuh"

namespace pl::phase {

constexpr uint32_t kCtaBarrier = 0;        // the id __syncthreads uses: every thread
constexpr uint32_t kBackoffNs = 128;       // between polls of a counter

// The whole CTA meets, each warp arriving from wherever its roles left it: the
// non-aligned barrier.sync, after the warp reconverges (a role may end with a lane
// still on its own, e.g. a TMA issuer).
__device__ __forceinline__ void cta_sync(uint32_t threads) {
  __syncwarp();
  asm volatile("barrier.sync %0, %1;" :: "r"(kCtaBarrier), "r"(threads) : "memory");
}

__device__ __forceinline__ uint32_t* counter(const KernelInfo& k, uint32_t offset) {
  return reinterpret_cast<uint32_t*>(static_cast<unsigned char*>(k.workspace) + offset);
}

// Every thread, at the end of a phase: its shared-memory writes are ordered before the
// next phase's TMA (async proxy) writes to the same bytes, then the CTA meets. The
// roles' tails have drained their TMA stores (cp.async.bulk.wait_group 0) by now.
__device__ __forceinline__ void end(uint32_t threads) {
  fence_proxy_async_smem();
  cta_sync(threads);
}

// One thread per CTA, after end(): this CTA is done with the phase, and every global
// write of it (its TMA stores too) is released to the GPU with the count.
__device__ __forceinline__ void arrive(const KernelInfo& k, uint32_t offset) {
  tma::fence_proxy_async_global();
  asm volatile("red.release.gpu.global.add.u32 [%0], 1;" :: "l"(counter(k, offset)) : "memory");
}

// One thread per CTA: waits until every CTA of the grid has arrived.
__device__ __forceinline__ void wait(const KernelInfo& k, uint32_t offset) {
  const uint32_t ctas = gridDim.x * gridDim.y * gridDim.z;
  for (;;) {
    uint32_t done;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];"
                 : "=r"(done) : "l"(counter(k, offset)) : "memory");
    if (done >= ctas) break;
    __nanosleep(kBackoffNs);
  }
}

// Every thread, at the start of a phase that waited: the CTA meets behind its first
// thread's acquire, and the data it made visible is ordered before this thread's TMA
// (async proxy) reads of global memory.
__device__ __forceinline__ void begin(uint32_t threads) {
  cta_sync(threads);
  tma::fence_proxy_async_global();
}

// Builds with phase clocks (LinkOptions.phase_clock) only: thread `thread` of the CTA
// records %globaltimer (ns) in slot `index` of the CTA's row of `slots` clocks at
// `offset` in the workspace: slot 0 when the CTA starts, slot i + 1 when it has finished
// phase i (after the CTA meets). CTAs past `ctas` are not recorded.
__device__ __forceinline__ void clock(const KernelInfo& k, uint32_t offset, uint32_t ctas,
                                      uint32_t slots, uint32_t index, uint32_t thread) {
  if (threadIdx.x != thread) return;
  // The CTA's index read here (volatile), not once for every clock: a row address the
  // compiler hoisted to the kernel's start would stay live, and spill, in every role.
  uint32_t x, y, z, nx, ny;
  asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(x));
  asm volatile("mov.u32 %0, %%ctaid.y;" : "=r"(y));
  asm volatile("mov.u32 %0, %%ctaid.z;" : "=r"(z));
  asm volatile("mov.u32 %0, %%nctaid.x;" : "=r"(nx));
  asm volatile("mov.u32 %0, %%nctaid.y;" : "=r"(ny));
  const uint32_t cta = x + nx * (y + ny * z);
  if (cta >= ctas) return;
  uint64_t now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now) :: "memory");
  auto* row = reinterpret_cast<uint64_t*>(static_cast<unsigned char*>(k.workspace) + offset);
  row[size_t(cta) * slots + index] = now;
}

}  // namespace pl::phase
