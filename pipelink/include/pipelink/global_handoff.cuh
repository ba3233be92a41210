// Global-memory hand-off between CTAs: the producer writes a slot and releases
// its counter; a consumer in any CTA acquires the counter before reading.
#pragma once

#include <cstdint>

#include "pipelink/types.cuh"

namespace pl {

template <class T>
__device__ __forceinline__ T* global_slot(const GlobalPort& port, const KernelInfo& k,
                                          uint32_t slot) {
  auto* base = static_cast<unsigned char*>(k.workspace);
  return reinterpret_cast<T*>(base + port.slot_offset + uint64_t(slot) * port.slot_bytes);
}

__device__ __forceinline__ uint32_t* global_counter(const GlobalPort& port,
                                                    const KernelInfo& k, uint32_t slot) {
  auto* base = static_cast<unsigned char*>(k.workspace);
  return reinterpret_cast<uint32_t*>(base + port.counter_offset) + slot;
}

// Producer side, one thread, after every writer of the slot has passed a barrier:
// the release orders the slot's writes before the counter.
__device__ __forceinline__ void global_publish(const GlobalPort& port, const KernelInfo& k,
                                               uint32_t slot) {
  uint32_t* counter = global_counter(port, k, slot);
  asm volatile("red.release.gpu.global.add.u32 [%0], 1;" :: "l"(counter) : "memory");
}

// Consumer side, one thread, before a barrier that lets its peers read the slot.
__device__ __forceinline__ void global_acquire(const GlobalPort& port, const KernelInfo& k,
                                               uint32_t slot, uint32_t expected) {
  uint32_t* counter = global_counter(port, k, slot);
  uint32_t seen;
  do {
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
  } while (seen < expected);
}

}  // namespace pl
