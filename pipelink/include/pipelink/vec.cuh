// Eight bf16 in one 16-byte vector (uint4), as the row-wise components move them: one
// 128-bit load or store per eight columns, the arithmetic in fp32.
#pragma once

#include <cstdint>
#include <cuda_bf16.h>

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

}  // namespace pl::vec
