// Split-K across CTAs: the pieces of a split_tile record meet in the workspace.
//
//   piece k_split < k_splits - 1:  store its fp32 partial, then set its flag to the
//                                  launch's token (release) and stop;
//   the last piece:                wait for every other flag to hold the token (acquire),
//                                  reset them, add the partials in piece order to its own
//                                  accumulators, then store the tile.
//
// The sum runs in a fixed order whatever order the pieces finish in, so the result is
// bitwise the same launch after launch. Flags compare against the launch token
// (pl::KernelInfo::launch), not against zero, so the workspace needs no zeroing before a
// launch; the reset lets a CUDA graph replay a launch, token and all. Only the last
// piece waits, and a scheduler gives every CTA at most one piece after its whole tiles
// (splitk_scheduler), so the CTAs it waits for never wait themselves: with the grid
// co-resident, no spin can deadlock.
#pragma once

#include <cstdint>

#include "pipelink/named_barrier.cuh"
#include "pipelink/types.cuh"

namespace pl::splitk {

constexpr uint32_t kFloatsPerVector = 4;   // partials move as float4

// One piece's partial: every thread's accumulators, float4 j of thread t at
// j * THREADS + t, so a warp reads and writes 512 contiguous bytes.
template <uint32_t ACC, uint32_t THREADS>
constexpr uint32_t kPartialBytes = ACC * THREADS * sizeof(float);

__device__ __forceinline__ unsigned char* workspace_at(const KernelInfo& k, uint32_t offset) {
  return static_cast<unsigned char*>(k.workspace) + offset;
}

// Called by every thread of the role holding the tile's accumulators (`thread` is its
// index in the role; `barrier` a named barrier of the role's THREADS threads). Returns
// whether `acc` now holds the whole tile (true: store it) or this piece's partial
// went to the workspace (false: the last piece stores the tile).
template <uint32_t ACC, uint32_t THREADS>
__device__ __forceinline__ bool combine(const WorkTile& tile, const KernelInfo& k,
                                        float (&acc)[ACC], uint32_t thread, uint32_t barrier) {
  static_assert(ACC % kFloatsPerVector == 0, "accumulators move as float4");
  constexpr uint32_t kVectors = ACC / kFloatsPerVector;
  if (!tile.is_split()) return true;
  const uint32_t last = uint32_t(tile.k_splits - 1);
  auto flag = [&](uint32_t piece) {
    return reinterpret_cast<uint64_t*>(workspace_at(k, tile.flag + piece * sizeof(uint64_t)));
  };
  auto partial = [&](uint32_t piece) {
    return reinterpret_cast<float4*>(
        workspace_at(k, tile.partials + piece * kPartialBytes<ACC, THREADS>));
  };
  if (uint32_t(tile.k_split) < last) {
    float4* mine = partial(uint32_t(tile.k_split));
#pragma unroll
    for (uint32_t j = 0; j < kVectors; ++j) {
      const uint32_t f = j * kFloatsPerVector;
      __stcg(mine + j * THREADS + thread, make_float4(acc[f], acc[f + 1], acc[f + 2], acc[f + 3]));
    }
    named_sync(barrier, THREADS);          // every thread's partial is written ...
    if (thread == 0) {                     // ... before the release publishes it
      asm volatile("st.release.gpu.global.u64 [%0], %1;"
                   :: "l"(flag(uint32_t(tile.k_split))), "l"(k.launch) : "memory");
    }
    return false;
  }
  if (thread == 0) {
    for (uint32_t piece = 0; piece < last; ++piece) {
      uint64_t seen;
      do {
        asm volatile("ld.acquire.gpu.global.u64 %0, [%1];"
                     : "=l"(seen) : "l"(flag(piece)) : "memory");
      } while (seen != k.launch);
      *flag(piece) = 0;                    // ready for a replay of this very launch
    }
  }
  named_sync(barrier, THREADS);            // the acquires order every thread's reads
  for (uint32_t piece = 0; piece < last; ++piece) {
    const float4* theirs = partial(piece);
#pragma unroll
    for (uint32_t j = 0; j < kVectors; ++j) {
      const float4 v = __ldcg(theirs + j * THREADS + thread);
      const uint32_t f = j * kFloatsPerVector;
      acc[f] += v.x;
      acc[f + 1] += v.y;
      acc[f + 2] += v.z;
      acc[f + 3] += v.w;
    }
  }
  return true;
}

}  // namespace pl::splitk
