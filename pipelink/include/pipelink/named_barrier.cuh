// Named barriers by placed id (never a literal: the linker chooses 1..15).
//
// The non-aligned forms (barrier.sync, barrier.arrive), not bar.sync (which means
// barrier.sync.aligned): .aligned promises that every participating thread executes the
// same barrier instruction, and a role whose warps span warpgroups with different
// setmaxnreg budgets is emitted once per warpgroup by the glue, so its threads reach
// the barrier from different copies. With .aligned that is undefined behaviour, and
// compute-sanitizer's synccheck reports it ("divergent thread(s) in block").
#pragma once

#include <cstdint>

namespace pl {

__device__ __forceinline__ void named_sync(uint32_t id, uint32_t threads) {
  asm volatile("barrier.sync %0, %1;" :: "r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ void named_arrive(uint32_t id, uint32_t threads) {
  asm volatile("barrier.arrive %0, %1;" :: "r"(id), "r"(threads) : "memory");
}

}  // namespace pl
