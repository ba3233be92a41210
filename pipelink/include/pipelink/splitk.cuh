// Split-K across CTAs: the pieces of a split_tile record meet in the workspace.
//
//   piece k_split > 0:  store its fp32 partial, then set its flag to the launch's token
//                       (release) and stop;
//   piece 0:            wait for every other flag to hold the token (acquire), reset
//                       them, add the partials in piece order to its own accumulators,
//                       then store the tile.
//
// The sum runs in a fixed order whatever order the pieces finish in, so the result is
// bitwise the same launch after launch. Flags compare against the launch token
// (pl::KernelInfo::launch), not against zero, so the workspace needs no zeroing before a
// launch; the reset lets a CUDA graph replay a launch, token and all. Only piece 0
// waits, and a scheduler hands out the others so that the CTAs it waits for never wait
// first: splitk_scheduler gives every CTA at most one piece, after its whole tiles;
// streamk_scheduler makes every later piece its CTA's first streamed record and piece 0
// its CTA's last. With the grid co-resident, no spin can deadlock.
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

// One split tile's pieces as seen by every thread of the role that holds its
// accumulators (`thread`: its index in the role; `barrier`: a named barrier of the
// role's THREADS threads), ACC floats per thread in all, CHUNK at a time (an
// accumulator that arrives in chunks, e.g. from Tensor Memory, never sits in
// registers whole). A piece after the first stores its chunks and publishes them;
// piece 0 acquires the others and adds their chunks, in piece order, to its own.
template <uint32_t ACC, uint32_t THREADS>
struct Pieces {
  const WorkTile& tile;
  const KernelInfo& k;
  uint32_t thread;
  uint32_t barrier;

  __device__ __forceinline__ bool split() const { return tile.is_split(); }
  __device__ __forceinline__ uint32_t pieces() const { return uint32_t(tile.k_splits); }
  // This piece stores the tile (a whole tile, or piece 0 of a split one).
  __device__ __forceinline__ bool stores() const { return !split() || tile.k_split == 0; }

  // Piece 0 never publishes: the record's offsets are piece 1's, the others follow.
  __device__ __forceinline__ uint64_t* flag(uint32_t piece) const {
    return reinterpret_cast<uint64_t*>(
        workspace_at(k, tile.flag + (piece - 1) * sizeof(uint64_t)));
  }
  __device__ __forceinline__ float4* partial(uint32_t piece) const {
    return reinterpret_cast<float4*>(
        workspace_at(k, tile.partials + (piece - 1) * kPartialBytes<ACC, THREADS>));
  }

  // A piece after the first: chunk `chunk` (floats chunk * CHUNK ...) of its partial.
  template <uint32_t CHUNK>
  __device__ __forceinline__ void store(uint32_t chunk, const float (&acc)[CHUNK]) const {
    static_assert(CHUNK % kFloatsPerVector == 0, "accumulators move as float4");
    float4* mine = partial(uint32_t(tile.k_split)) + chunk * (CHUNK / kFloatsPerVector) * THREADS;
#pragma unroll
    for (uint32_t j = 0; j < CHUNK / kFloatsPerVector; ++j) {
      const uint32_t f = j * kFloatsPerVector;
      __stcg(mine + j * THREADS + thread, make_float4(acc[f], acc[f + 1], acc[f + 2], acc[f + 3]));
    }
  }

  // A piece after the first, after its chunks: every thread's partial is written
  // before the release publishes it.
  __device__ __forceinline__ void publish() const {
    named_sync(barrier, THREADS);
    if (thread == 0) {
      asm volatile("st.release.gpu.global.u64 [%0], %1;"
                   :: "l"(flag(uint32_t(tile.k_split))), "l"(k.launch) : "memory");
    }
  }

  // Piece 0, before its first add: every other piece has published.
  __device__ __forceinline__ void acquire() const {
    if (thread == 0) {
      for (uint32_t piece = 1; piece < pieces(); ++piece) {
        uint64_t seen;
        do {
          asm volatile("ld.acquire.gpu.global.u64 %0, [%1];"
                       : "=l"(seen) : "l"(flag(piece)) : "memory");
        } while (seen != k.launch);
        *flag(piece) = 0;                  // ready for a replay of this very launch
      }
    }
    named_sync(barrier, THREADS);          // the acquires order every thread's reads
  }

  // Piece 0: adds chunk `chunk` of every other piece, in piece order.
  template <uint32_t CHUNK>
  __device__ __forceinline__ void add(uint32_t chunk, float (&acc)[CHUNK]) const {
    for (uint32_t piece = 1; piece < pieces(); ++piece) {
      const float4* theirs = partial(piece) + chunk * (CHUNK / kFloatsPerVector) * THREADS;
#pragma unroll
      for (uint32_t j = 0; j < CHUNK / kFloatsPerVector; ++j) {
        const float4 v = __ldcg(theirs + j * THREADS + thread);
        const uint32_t f = j * kFloatsPerVector;
        acc[f] += v.x;
        acc[f + 1] += v.y;
        acc[f + 2] += v.z;
        acc[f + 3] += v.w;
      }
    }
  }
};

// The whole-fragment form, for accumulators held in registers: returns whether `acc`
// now holds the whole tile (true: store it) or this piece's partial went to the
// workspace (false: piece 0 stores the tile).
template <uint32_t ACC, uint32_t THREADS>
__device__ __forceinline__ bool combine(const WorkTile& tile, const KernelInfo& k,
                                        float (&acc)[ACC], uint32_t thread, uint32_t barrier) {
  const Pieces<ACC, THREADS> pieces{tile, k, thread, barrier};
  if (!pieces.split()) return true;
  if (!pieces.stores()) {
    pieces.store(0, acc);
    pieces.publish();
    return false;
  }
  pieces.acquire();
  pieces.add(0, acc);
  return true;
}

}  // namespace pl::splitk
