// Dynamic shared memory addressed by placed offsets.
#pragma once

#include <cstdint>

namespace pl {

// The kernel's one dynamic shared-memory window. 1024-byte alignment is what
// TMA's 128-byte swizzle needs for its destination tiles; the placer never
// asks for more.
__device__ __forceinline__ unsigned char* smem_base() {
  extern __shared__ __align__(1024) unsigned char pl_dynamic_smem[];
  return pl_dynamic_smem;
}

template <class T>
__device__ __forceinline__ T* smem_ptr(uint32_t offset) {
  return reinterpret_cast<T*>(smem_base() + offset);
}

// 32-bit shared-window address, as PTX shared-space instructions take it.
__device__ __forceinline__ uint32_t smem_addr(uint32_t offset) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(smem_base())) + offset;
}

// One 16-byte shared store at the placed offset `offset`.
__device__ __forceinline__ void st_shared_v4(uint32_t offset, uint32_t a, uint32_t b, uint32_t c,
                                             uint32_t d) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};"
               :: "r"(smem_addr(offset)), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}

// 32-bit and 2 x 32-bit shared stores and loads at placed offsets. Volatile, with a
// memory clobber: they stay where the code puts them between the named barriers and
// mbarrier waits that order them against other warps.
__device__ __forceinline__ void st_shared_b32(uint32_t offset, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;" :: "r"(smem_addr(offset)), "r"(v) : "memory");
}

__device__ __forceinline__ void st_shared_f32(uint32_t offset, float v) {
  asm volatile("st.shared.f32 [%0], %1;" :: "r"(smem_addr(offset)), "f"(v) : "memory");
}

__device__ __forceinline__ void st_shared_v2_f32(uint32_t offset, float a, float b) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};"
               :: "r"(smem_addr(offset)), "f"(a), "f"(b) : "memory");
}

__device__ __forceinline__ float ld_shared_f32(uint32_t offset) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(smem_addr(offset)) : "memory");
  return v;
}

__device__ __forceinline__ float2 ld_shared_v2_f32(uint32_t offset) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];"
               : "=f"(v.x), "=f"(v.y) : "r"(smem_addr(offset)) : "memory");
  return v;
}

// Ordinary shared stores that TMA or wgmma read next must cross into the async proxy.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// The geometry of a 128-byte-swizzled 16-bit MMA operand tile of kTileK columns of K,
// read `kInstrK` of K per instruction: K-major, each row is one 128-byte swizzled row
// and an instruction's K is 32 bytes along it; MN-major, the tile is blocks of 64 M (or
// N) elements by kTileK rows, kBlockBytes apart, and an instruction's K is kInstrK rows
// of 128 bytes. Either way a slice of 64 rows of M (one wgmma's) takes kRows64Bytes.
template <bool kMnMajor, uint32_t kTileK, uint32_t kInstrK>
struct Sw128Geometry {
  static constexpr uint32_t kSwizzleRowBytes = 128;
  static constexpr uint32_t kElementBytes = 2;
  static constexpr uint32_t kBlockBytes = kTileK * kSwizzleRowBytes;
  static constexpr uint32_t kKStepBytes =
      kMnMajor ? kInstrK * kSwizzleRowBytes : kInstrK * kElementBytes;
  static constexpr uint32_t kSliceRows = 64;
  static constexpr uint32_t kRows64Bytes = kSliceRows * kTileK * kElementBytes;
};

}  // namespace pl
