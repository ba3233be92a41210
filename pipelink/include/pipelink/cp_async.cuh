// cp.async (sm_80+): 16-byte copies from global into shared memory that the issuing
// thread commits in groups and waits for, or has an mbarrier track. Writes through the
// generic proxy: a stage that wgmma, tcgen05.mma or a TMA store reads next needs
// pl::fence_proxy_async_smem() between the copies landing and that read.
#pragma once

#include <cstdint>

namespace pl::cp_async {

constexpr uint32_t kPieceBytes = 16;   // one copy

// 16 bytes from `src` to the shared address `dst`; bytes 0 writes zeros and reads nothing.
__device__ __forceinline__ void copy16(uint32_t dst, const void* src, uint32_t bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
               :: "r"(dst), "l"(src), "r"(bytes) : "memory");
}

__device__ __forceinline__ void commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}

// Waits until at most PENDING of this thread's committed groups are in flight.
template <uint32_t PENDING>
__device__ __forceinline__ void wait() {
  asm volatile("cp.async.wait_group %0;" :: "n"(PENDING) : "memory");
}

}  // namespace pl::cp_async
