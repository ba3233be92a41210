// Warp and warpgroup indices relative to a role's placed base.
#pragma once

#include <cstdint>

#include "pipelink/types.cuh"

namespace pl {

constexpr uint32_t kWarpThreads = 32;
constexpr uint32_t kWarpgroupWarps = 4;
constexpr uint32_t kWarpgroupThreads = kWarpThreads * kWarpgroupWarps;
constexpr uint32_t kFullWarpMask = 0xffffffffu;     // every lane, for warp votes

__device__ __forceinline__ uint32_t lane() { return threadIdx.x % kWarpThreads; }

// Warp index within the role (0 for the role's first warp). Warp-uniform.
__device__ __forceinline__ uint32_t warp_in_role(const RolePlace& role) {
  return __shfl_sync(0xffffffffu, threadIdx.x / kWarpThreads, 0) - role.warp_base;
}

// Thread index within the role.
__device__ __forceinline__ uint32_t thread_in_role(const RolePlace& role) {
  return threadIdx.x - role.warp_base * kWarpThreads;
}

__device__ __forceinline__ uint32_t warpgroup_in_role(const RolePlace& role) {
  return warp_in_role(role) / kWarpgroupWarps;
}

__device__ __forceinline__ uint32_t role_threads(const RolePlace& role) {
  return role.warps * kWarpThreads;
}

__device__ __forceinline__ bool elect_one_in_warp() { return lane() == 0; }

// One lane of a converged warp, chosen by the hardware (elect.sync, sm_90+). Unlike a
// lane test, ptxas knows the branch is taken by one lane of a uniform warp, so the
// uniform-datapath instructions inside (tcgen05.mma, tcgen05.commit) are issued once,
// with no loop over active lanes around each.
__device__ __forceinline__ bool elect_one_sync() {
  uint32_t elected;
  asm volatile("{\n .reg .pred p;\n elect.sync _|p, 0xffffffff;\n selp.u32 %0, 1, 0, p;\n}"
               : "=r"(elected));
  return elected != 0;
}

// The warp's sum of one value per lane, in a fixed butterfly order (the same bits every
// run). Every lane gets the sum.
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (uint32_t offset = kWarpThreads / 2; offset > 0; offset /= 2) {
    x += __shfl_xor_sync(0xffffffffu, x, offset);
  }
  return x;
}

}  // namespace pl
