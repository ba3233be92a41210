// Eight bf16 in one 16-byte vector (uint4), as the row-wise components move them: one
// 128-bit load or store per eight columns, the arithmetic in fp32.
#pragma once

#include <cstdint>
#include <cuda_bf16.h>

#include "pipelink/warp.cuh"

namespace pl::vec {

constexpr uint32_t kBf16x8 = 8;   // bf16 per 16-byte vector

__device__ __forceinline__ void unpack(const uint4& v, float (&f)[kBf16x8]) {
  const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (uint32_t i = 0; i < kBf16x8 / 2; ++i) {
    const float2 p = __bfloat1622float2(pairs[i]);
    f[2 * i] = p.x;
    f[2 * i + 1] = p.y;
  }
}

// Rounds scale * f to bf16, once per element.
__device__ __forceinline__ uint4 pack(const float (&f)[kBf16x8], float scale = 1.0f) {
  uint4 v;
  __nv_bfloat162* pairs = reinterpret_cast<__nv_bfloat162*>(&v);
#pragma unroll
  for (uint32_t i = 0; i < kBf16x8 / 2; ++i) {
    pairs[i] = __floats2bfloat162_rn(scale * f[2 * i], scale * f[2 * i + 1]);
  }
  return v;
}

// acc += scale * v, in fp32.
__device__ __forceinline__ void add_scaled(float (&acc)[kBf16x8], float scale, const uint4& v) {
  float f[kBf16x8];
  unpack(v, f);
#pragma unroll
  for (uint32_t i = 0; i < kBf16x8; ++i) acc[i] += scale * f[i];
}

// Memory-bound passes keep several loads in flight per thread before they use any, so
// an SM has enough bytes outstanding to cover HBM's latency.
constexpr uint32_t kVectorsInFlight = 4;

// Visits i = first, first + stride, ... below count: load(i) for kBatch indices, then
// use(i, loaded) for each; the indices left over one at a time. Whole batches only, so
// no load is predicated and no register has to keep an old value for a skipped one.
template <uint32_t kBatch, typename Index, typename Load, typename Use>
__device__ __forceinline__ void batched(Index first, Index count, Index stride, Load load,
                                        Use use) {
  Index i = first;
#pragma unroll 1
  for (; i + (kBatch - 1) * stride < count; i += kBatch * stride) {
    decltype(load(i)) x[kBatch];
#pragma unroll
    for (uint32_t n = 0; n < kBatch; ++n) x[n] = load(i + n * stride);
#pragma unroll
    for (uint32_t n = 0; n < kBatch; ++n) use(i + n * stride, x[n]);
  }
#pragma unroll 1
  for (; i < count; i += stride) use(i, load(i));
}

// One choice of a gather-sum, held by lane j for choice j: the warp reads each slot and
// weight once per row, and passes them round with a shuffle per use.
struct Choice {
  int32_t slot;   // the row; negative: none
  float weight;
};

__device__ __forceinline__ Choice lane_choice(const int32_t* slots, const float* weights,
                                              uint32_t count) {
  const uint32_t j = lane();
  if (j >= count) return {-1, 0.0f};
  return {__ldcg(slots + j), weights != nullptr ? __ldcg(weights + j) : 1.0f};
}

__device__ __forceinline__ Choice choice(const Choice& mine, uint32_t j) {
  return {__shfl_sync(~0u, mine.slot, j), __shfl_sync(~0u, mine.weight, j)};
}

// The choices [0, count) two at a time, so a caller can have both rows' loads in flight
// before it adds either: pair(j, choice j, choice j + 1) where both have a row (warp-
// uniform: the usual case), else one(j, choice j) for each; then one(j, ...) for the
// last choice of an odd count.
template <class Pair, class One>
__device__ __forceinline__ void for_choice_pairs(const Choice& mine, uint32_t count, Pair pair,
                                                 One one) {
  uint32_t j = 0;
#pragma unroll 1
  for (; j + 1 < count; j += 2) {
    const Choice first = choice(mine, j), second = choice(mine, j + 1);
    if (first.slot >= 0 && second.slot >= 0) {
      pair(j, first, second);
    } else {
      one(j, first);
      one(j + 1, second);
    }
  }
  if (j < count) one(j, choice(mine, j));
}

// kBatch of a lane's vectors of row `slot`, a warp apart from vector v.
template <uint32_t kBatch>
__device__ __forceinline__ void load_batch(uint4 (&x)[kBatch], const __nv_bfloat16* rows,
                                           size_t cols, int32_t slot, uint32_t v) {
  const uint4* in = reinterpret_cast<const uint4*>(rows + size_t(slot) * cols) + v;
#pragma unroll
  for (uint32_t n = 0; n < kBatch; ++n) x[n] = __ldcg(in + n * kWarpThreads);
}

template <uint32_t kBatch>
__device__ __forceinline__ void add_batch(float (&acc)[kBatch][kBf16x8], float w,
                                          const uint4 (&x)[kBatch]) {
#pragma unroll
  for (uint32_t n = 0; n < kBatch; ++n) add_scaled(acc[n], w, x[n]);
}

// acc += one choice's kBatch vectors (nothing for a negative slot).
template <uint32_t kBatch>
__device__ __forceinline__ void add_choice(float (&acc)[kBatch][kBf16x8], const Choice& c,
                                           const __nv_bfloat16* rows, size_t cols, uint32_t v) {
  if (c.slot < 0) return;
  uint4 x[kBatch];
  load_batch(x, rows, cols, c.slot, v);
  add_batch(acc, c.weight, x);
}

// kBatch of a lane's vectors of a gather-sum (below), a warp apart, starting at v. The
// choices go two at a time: both loads in flight before either is added (in order).
template <uint32_t kBatch>
__device__ __forceinline__ void weighted_row_sum_batch(uint32_t v, uint4* out, const uint4* base,
                                                       const __nv_bfloat16* rows, size_t cols,
                                                       const Choice& mine, uint32_t count) {
  float acc[kBatch][kBf16x8] = {};
  if (base != nullptr) {
#pragma unroll
    for (uint32_t n = 0; n < kBatch; ++n) {
      add_scaled(acc[n], 1.0f, __ldcg(base + v + n * kWarpThreads));
    }
  }
  for_choice_pairs(
      mine, count,
      [&](uint32_t, const Choice& first, const Choice& second) {
        uint4 x0[kBatch], x1[kBatch];
        load_batch(x0, rows, cols, first.slot, v);
        load_batch(x1, rows, cols, second.slot, v);
        add_batch(acc, first.weight, x0);
        add_batch(acc, second.weight, x1);
      },
      [&](uint32_t, const Choice& c) { add_choice(acc, c, rows, cols, v); });
#pragma unroll
  for (uint32_t n = 0; n < kBatch; ++n) out[v + n * kWarpThreads] = pack(acc[n]);
}

// A warp's share of one row of a gather-sum: out = base + sum_j weights[j] rows[slots[j]]
// over the row's `vectors` 16-byte vectors, in fp32 and in j order, rounded once (a
// negative slot adds nothing; null base or weights read as zero and ones). count is at
// most a warp's lanes (lane j holds choice j). Every input was written earlier in the
// launch, or may have been: L2 loads, never the non-coherent path. kBatch vectors per
// lane of each of two choices: kVectorsInFlight loads outstanding.
template <uint32_t kBatch = kVectorsInFlight / 2>
__device__ __forceinline__ void weighted_row_sum(uint4* out, const uint4* base,
                                                 const __nv_bfloat16* rows, size_t cols,
                                                 const int32_t* slots, const float* weights,
                                                 uint32_t count, uint32_t vectors) {
  constexpr uint32_t kBatchSpan = kBatch * kWarpThreads;
  const Choice mine = lane_choice(slots, weights, count);
  uint32_t v = lane();
#pragma unroll 1
  for (; v + kBatchSpan - kWarpThreads < vectors; v += kBatchSpan) {
    weighted_row_sum_batch<kBatch>(v, out, base, rows, cols, mine, count);
  }
#pragma unroll 1
  for (; v < vectors; v += kWarpThreads) {
    weighted_row_sum_batch<1>(v, out, base, rows, cols, mine, count);
  }
}

}  // namespace pl::vec
