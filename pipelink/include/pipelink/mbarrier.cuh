// mbarrier primitives on placed shared-memory offsets.
#pragma once

#include <cstdint>

#include "pipelink/smem.cuh"

namespace pl::mbar {

constexpr uint32_t kBytes = 8;  // one mbarrier object

__device__ __forceinline__ void init(uint32_t offset, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;"
               :: "r"(smem_addr(offset)), "r"(arrivals) : "memory");
}

// Makes initialised barriers visible to the async proxy (TMA) and the cluster.
__device__ __forceinline__ void fence_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void arrive(uint32_t offset) {
  asm volatile("{\n .reg .b64 state;\n mbarrier.arrive.shared::cta.b64 state, [%0];\n}"
               :: "r"(smem_addr(offset)) : "memory");
}

__device__ __forceinline__ void arrive_expect_tx(uint32_t offset, uint32_t bytes) {
  asm volatile("{\n .reg .b64 state;\n"
               " mbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n}"
               :: "r"(smem_addr(offset)), "r"(bytes) : "memory");
}

__device__ __forceinline__ bool try_wait(uint32_t offset, uint32_t parity) {
  uint32_t done;
  asm volatile("{\n .reg .pred p;\n"
               " mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
               " selp.u32 %0, 1, 0, p;\n}"
               : "=r"(done) : "r"(smem_addr(offset)), "r"(parity) : "memory");
  return done != 0;
}

// Waits for the phase with the given parity to complete.
__device__ __forceinline__ void wait(uint32_t offset, uint32_t parity) {
  while (!try_wait(offset, parity)) {
  }
}

}  // namespace pl::mbar
