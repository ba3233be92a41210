// Global-memory hand-off between CTAs: the producer writes a slot and releases
// its counter; a consumer in any CTA acquires the counter before reading.
#pragma once

#include <cstdint>

#include "pipelink/types.cuh"

namespace pl {

// One thread, after every writer it speaks for has passed a barrier: the release
// orders their writes before the counter's increment.
__device__ __forceinline__ void counter_release(uint32_t* counter) {
  asm volatile("red.release.gpu.global.add.u32 [%0], 1;" :: "l"(counter) : "memory");
}

// One thread, before a barrier that lets its peers go on: waits until the counter
// reaches `expected`, acquiring what its releasers wrote.
__device__ __forceinline__ void counter_wait(const uint32_t* counter, uint32_t expected) {
  uint32_t seen;
  do {
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
  } while (seen < expected);
}

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
  counter_release(global_counter(port, k, slot));
}

// Consumer side, one thread, before a barrier that lets its peers read the slot.
__device__ __forceinline__ void global_acquire(const GlobalPort& port, const KernelInfo& k,
                                               uint32_t slot, uint32_t expected) {
  counter_wait(global_counter(port, k, slot), expected);
}

}  // namespace pl
