// Hopper warpgroup MMA (wgmma.mma_async) on shared-memory operands: matrix
// descriptors for 128-byte-swizzled K-major and MN-major tiles, the fence/commit/wait protocol,
// and the bf16 x bf16 -> fp32 instruction for N = 32, 64, 128, 168, 192 and 256.
//
// The instructions exist on sm_90a only: a component that calls these lists just
// sm_90a in its arch (pipelink.cuh includes this header everywhere; uncalled, it
// emits nothing).
//
// Accumulator fragment (PTX ISA, "wgmma .m64nNk16 register fragment D"): thread t
// of the warpgroup holds N/2 floats; float i sits at
//   row = 16 * (t / 32) + (t % 32) / 4 + 8 * ((i / 2) % 2)
//   col =  8 * (i / 4)  + 2 * (t % 4)  + i % 2
// pipelink/epilogue.cuh names this layout for register hand-offs.
#pragma once

#include <cstdint>

#include "pipelink/smem.cuh"

namespace pl::wgmma {

constexpr uint32_t kM = 64;                    // rows of A and D per warpgroup instruction
constexpr uint32_t kK = 16;                    // K per instruction for 16-bit inputs
constexpr uint32_t kSwizzleBytes = 128;        // one swizzled row: 64 bf16 of K
constexpr uint32_t kSwizzleRows = 8;           // rows in one swizzle atom
constexpr uint32_t kSwizzleAtomBytes = kSwizzleBytes * kSwizzleRows;  // base alignment
constexpr uint32_t kDescUnit = 16;             // descriptor addresses count 16-byte units

// Descriptor fields (PTX ISA, "Matrix Descriptor Format"): 14-bit start address,
// leading- and stride-dimension byte offsets, all in 16-byte units; swizzle mode in
// bits 62-63.
constexpr uint32_t kDescAddressBits = 14;
constexpr uint32_t kDescLeadingShift = 16;
constexpr uint32_t kDescStrideShift = 32;
constexpr uint32_t kDescSwizzleShift = 62;
constexpr uint64_t kDescSwizzle128B = 1;
// K-major with a 128-byte swizzle: one instruction's K (32 bytes) never leaves a
// swizzled row, so the leading offset is not used; 1 by convention.
constexpr uint64_t kDescLeadingUnused = 1;
// Eight-row groups of a K-major, 128-byte-swizzled tile sit one atom apart.
constexpr uint64_t kDescStrideSw128 = kSwizzleAtomBytes / kDescUnit;

// Descriptor of a K-major bf16 tile TMA wrote with a 128-byte swizzle at the placed
// shared-memory `offset` (a multiple of 1024, relative to the dynamic window).
__device__ __forceinline__ uint64_t desc_sw128_kmajor(uint32_t offset) {
  const uint64_t start = (smem_addr(offset) / kDescUnit) & ((1u << kDescAddressBits) - 1);
  return start | (kDescLeadingUnused << kDescLeadingShift) |
         (kDescStrideSw128 << kDescStrideShift) | (kDescSwizzle128B << kDescSwizzleShift);
}

// MN-major with a 128-byte swizzle (the canonical ((64, m), (8, k)) layout of 16-bit
// elements): the tile is blocks of 64 MN-elements (one 128-byte swizzled row) by the
// stage's K rows, one TMA box each. The leading offset steps from one MN block to the
// next (`block_bytes` apart), the stride offset from one 8-row group of K to the next.
__device__ __forceinline__ uint64_t desc_sw128_mnmajor(uint32_t offset, uint32_t block_bytes) {
  const uint64_t start = (smem_addr(offset) / kDescUnit) & ((1u << kDescAddressBits) - 1);
  return start | (uint64_t(block_bytes / kDescUnit) << kDescLeadingShift) |
         (kDescStrideSw128 << kDescStrideShift) | (kDescSwizzle128B << kDescSwizzleShift);
}

// A 128-byte-swizzled operand tile of `kTileK` columns of K (pl::Sw128Geometry) and
// its descriptor.
template <bool kMnMajor, uint32_t kTileK>
struct Sw128Operand : Sw128Geometry<kMnMajor, kTileK, kK> {
  __device__ static uint64_t desc(uint32_t offset) {
    if constexpr (kMnMajor) {
      return desc_sw128_mnmajor(offset, Sw128Geometry<kMnMajor, kTileK, kK>::kBlockBytes);
    } else {
      return desc_sw128_kmajor(offset);
    }
  }
};

// The descriptor `bytes` further along K inside the same swizzled rows: the hardware
// applies the swizzle to the final address, so K steps just move the start address.
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t bytes) {
  return desc + bytes / kDescUnit;
}

// Operand tiles of a head (pl::attn::load_head_tile): `rows` rows by head_dim columns
// stored as 64-column boxes side by side, each `rows` x 128 bytes, 128-byte swizzled.
// Read K-major (K = head_dim), the descriptor of K step `s` for the 64 rows from
// `first_row`:
__device__ __forceinline__ uint64_t desc_boxed_kmajor(uint32_t offset, uint32_t rows,
                                                      uint32_t first_row, uint32_t s) {
  constexpr uint32_t kStepsPerBox = kSwizzleBytes / (kK * 2);   // 16-bit elements
  const uint32_t box = offset + (s / kStepsPerBox) * rows * kSwizzleBytes;
  return desc_advance(desc_sw128_kmajor(box + first_row * kSwizzleBytes),
                      (s % kStepsPerBox) * kK * 2);
}

// Read MN-major (K = rows, N = head_dim from column 64 `first_box`), the descriptor of
// K step `s` (the rows [16 s, 16 s + 16)).
__device__ __forceinline__ uint64_t desc_boxed_mnmajor(uint32_t offset, uint32_t rows,
                                                       uint32_t first_box, uint32_t s) {
  const uint32_t box_bytes = rows * kSwizzleBytes;
  return desc_advance(desc_sw128_mnmajor(offset + first_box * box_bytes, box_bytes),
                      s * kK * kSwizzleBytes);
}

// Orders this warpgroup's register and shared-memory accesses before the wgmma that
// follows (needed before the first wgmma of a batch).
__device__ __forceinline__ void fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}

// Closes the batch of wgmma issued since the last commit.
__device__ __forceinline__ void commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}

// Waits until at most N committed batches are still running.
template <int N>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory");
}

// Pins accumulator registers at this point of the program: the compiler may not
// move their reads or writes across it (wgmma writes them asynchronously).
template <int N>
__device__ __forceinline__ void fence_operands(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i]) :: "memory");
}

// D (64 x N, fp32) = A * B^T (+ D when `accumulate` is non-zero), A and B from
// shared memory through descriptors, N = 32, 64, 128, 168, 192 or 256. kMnMajorA / kMnMajorB: the
// operand's tile is MN-major (the instruction's transpose bit); else K-major.
#define PL_WGMMA_D8(d, i)                                                                 \
  "+f"(d[i + 0]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]),         \
      "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])

template <int N, bool kMnMajorA = false, bool kMnMajorB = false>
__device__ __forceinline__ void mma_bf16_ss(float (&d)[N / 2], uint64_t a, uint64_t b,
                                            uint32_t accumulate) {
  static_assert(N == 32 || N == 64 || N == 128 || N == 168 || N == 192 || N == 256,
                "wgmma tiles here are 32, 64, 128, 168, 192 or 256 wide: change tile_n");
  constexpr int kTransA = kMnMajorA, kTransB = kMnMajorB;
  if constexpr (N == 32) {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %18, 0;\n"
        " wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7,"
        "%8, %9, %10, %11, %12, %13, %14, %15"
        "}, %16, %17, p, 1, 1, %19, %20;\n}\n"
        : PL_WGMMA_D8(d, 0), PL_WGMMA_D8(d, 8)
        : "l"(a), "l"(b), "r"(accumulate), "n"(kTransA), "n"(kTransB));
  } else if constexpr (N == 64) {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %34, 0;\n"
        " wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7,"
        "%8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23,"
        "%24, %25, %26, %27, %28, %29, %30, %31"
        "}, %32, %33, p, 1, 1, %35, %36;\n}\n"
        : PL_WGMMA_D8(d, 0), PL_WGMMA_D8(d, 8), PL_WGMMA_D8(d, 16), PL_WGMMA_D8(d, 24)
        : "l"(a), "l"(b), "r"(accumulate), "n"(kTransA), "n"(kTransB));
  } else if constexpr (N == 128) {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %66, 0;\n"
        " wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7,"
        "%8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23,"
        "%24, %25, %26, %27, %28, %29, %30, %31,"
        "%32, %33, %34, %35, %36, %37, %38, %39,"
        "%40, %41, %42, %43, %44, %45, %46, %47,"
        "%48, %49, %50, %51, %52, %53, %54, %55,"
        "%56, %57, %58, %59, %60, %61, %62, %63"
        "}, %64, %65, p, 1, 1, %67, %68;\n}\n"
        : PL_WGMMA_D8(d, 0), PL_WGMMA_D8(d, 8), PL_WGMMA_D8(d, 16), PL_WGMMA_D8(d, 24),
          PL_WGMMA_D8(d, 32), PL_WGMMA_D8(d, 40), PL_WGMMA_D8(d, 48), PL_WGMMA_D8(d, 56)
        : "l"(a), "l"(b), "r"(accumulate), "n"(kTransA), "n"(kTransB));
  } else if constexpr (N == 168) {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %86, 0;\n"
        " wgmma.mma_async.sync.aligned.m64n168k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7,"
        "%8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23,"
        "%24, %25, %26, %27, %28, %29, %30, %31,"
        "%32, %33, %34, %35, %36, %37, %38, %39,"
        "%40, %41, %42, %43, %44, %45, %46, %47,"
        "%48, %49, %50, %51, %52, %53, %54, %55,"
        "%56, %57, %58, %59, %60, %61, %62, %63,"
        "%64, %65, %66, %67, %68, %69, %70, %71,"
        "%72, %73, %74, %75, %76, %77, %78, %79,"
        "%80, %81, %82, %83"
        "}, %84, %85, p, 1, 1, %87, %88;\n}\n"
        : PL_WGMMA_D8(d, 0), PL_WGMMA_D8(d, 8), PL_WGMMA_D8(d, 16), PL_WGMMA_D8(d, 24),
          PL_WGMMA_D8(d, 32), PL_WGMMA_D8(d, 40), PL_WGMMA_D8(d, 48), PL_WGMMA_D8(d, 56),
          PL_WGMMA_D8(d, 64), PL_WGMMA_D8(d, 72), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]),
          "+f"(d[83])
        : "l"(a), "l"(b), "r"(accumulate), "n"(kTransA), "n"(kTransB));
  } else if constexpr (N == 192) {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %98, 0;\n"
        " wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7,"
        "%8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23,"
        "%24, %25, %26, %27, %28, %29, %30, %31,"
        "%32, %33, %34, %35, %36, %37, %38, %39,"
        "%40, %41, %42, %43, %44, %45, %46, %47,"
        "%48, %49, %50, %51, %52, %53, %54, %55,"
        "%56, %57, %58, %59, %60, %61, %62, %63,"
        "%64, %65, %66, %67, %68, %69, %70, %71,"
        "%72, %73, %74, %75, %76, %77, %78, %79,"
        "%80, %81, %82, %83, %84, %85, %86, %87,"
        "%88, %89, %90, %91, %92, %93, %94, %95"
        "}, %96, %97, p, 1, 1, %99, %100;\n}\n"
        : PL_WGMMA_D8(d, 0), PL_WGMMA_D8(d, 8), PL_WGMMA_D8(d, 16), PL_WGMMA_D8(d, 24),
          PL_WGMMA_D8(d, 32), PL_WGMMA_D8(d, 40), PL_WGMMA_D8(d, 48), PL_WGMMA_D8(d, 56),
          PL_WGMMA_D8(d, 64), PL_WGMMA_D8(d, 72), PL_WGMMA_D8(d, 80), PL_WGMMA_D8(d, 88)
        : "l"(a), "l"(b), "r"(accumulate), "n"(kTransA), "n"(kTransB));
  } else if constexpr (N == 256) {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %130, 0;\n"
        " wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7,"
        "%8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23,"
        "%24, %25, %26, %27, %28, %29, %30, %31,"
        "%32, %33, %34, %35, %36, %37, %38, %39,"
        "%40, %41, %42, %43, %44, %45, %46, %47,"
        "%48, %49, %50, %51, %52, %53, %54, %55,"
        "%56, %57, %58, %59, %60, %61, %62, %63,"
        "%64, %65, %66, %67, %68, %69, %70, %71,"
        "%72, %73, %74, %75, %76, %77, %78, %79,"
        "%80, %81, %82, %83, %84, %85, %86, %87,"
        "%88, %89, %90, %91, %92, %93, %94, %95,"
        "%96, %97, %98, %99, %100, %101, %102, %103,"
        "%104, %105, %106, %107, %108, %109, %110, %111,"
        "%112, %113, %114, %115, %116, %117, %118, %119,"
        "%120, %121, %122, %123, %124, %125, %126, %127"
        "}, %128, %129, p, 1, 1, %131, %132;\n}\n"
        : PL_WGMMA_D8(d, 0), PL_WGMMA_D8(d, 8), PL_WGMMA_D8(d, 16), PL_WGMMA_D8(d, 24),
          PL_WGMMA_D8(d, 32), PL_WGMMA_D8(d, 40), PL_WGMMA_D8(d, 48), PL_WGMMA_D8(d, 56),
          PL_WGMMA_D8(d, 64), PL_WGMMA_D8(d, 72), PL_WGMMA_D8(d, 80), PL_WGMMA_D8(d, 88),
          PL_WGMMA_D8(d, 96), PL_WGMMA_D8(d, 104), PL_WGMMA_D8(d, 112), PL_WGMMA_D8(d, 120)
        : "l"(a), "l"(b), "r"(accumulate), "n"(kTransA), "n"(kTransB));
  }
}


// D (64 x N, fp32) = A * B^T (+ D when `accumulate` is non-zero) with A from registers:
// the m64k16 bf16 fragment, thread t of the warpgroup holding rows r = 16 (t / 32) +
// (t % 32) / 4 and r + 8, columns 2 (t % 4) + {0, 1} and + 8, in a[0..3] as (r, c),
// (r + 8, c), (r, c + 8), (r + 8, c + 8). That is the accumulator fragment of a
// 16-column slice of an m64nN product, rounded and packed in pairs: so an attention
// core's probabilities P feed P V without leaving registers. N = 64 or 128;
// kMnMajorB: B's tile is MN-major.
template <int N, bool kMnMajorB = false>
__device__ __forceinline__ void mma_bf16_rs(float (&d)[N / 2], const uint32_t (&a)[4],
                                            uint64_t b, uint32_t accumulate) {
  static_assert(N == 64 || N == 128,
                "register-A wgmma here is 64 or 128 wide: use head_dim 64 or 128");
  constexpr int kTransB = kMnMajorB;
  if constexpr (N == 64) {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %37, 0;\n"
        " wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7,"
        "%8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23,"
        "%24, %25, %26, %27, %28, %29, %30, %31"
        "}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
        : PL_WGMMA_D8(d, 0), PL_WGMMA_D8(d, 8), PL_WGMMA_D8(d, 16), PL_WGMMA_D8(d, 24)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate),
          "n"(kTransB));
  } else if constexpr (N == 128) {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %69, 0;\n"
        " wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7,"
        "%8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23,"
        "%24, %25, %26, %27, %28, %29, %30, %31,"
        "%32, %33, %34, %35, %36, %37, %38, %39,"
        "%40, %41, %42, %43, %44, %45, %46, %47,"
        "%48, %49, %50, %51, %52, %53, %54, %55,"
        "%56, %57, %58, %59, %60, %61, %62, %63"
        "}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
        : PL_WGMMA_D8(d, 0), PL_WGMMA_D8(d, 8), PL_WGMMA_D8(d, 16), PL_WGMMA_D8(d, 24),
          PL_WGMMA_D8(d, 32), PL_WGMMA_D8(d, 40), PL_WGMMA_D8(d, 48), PL_WGMMA_D8(d, 56)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate),
          "n"(kTransB));
  }
}

// Pins register-A fragments at this point of the program, as fence_operands does the
// accumulators.
template <int N>
__device__ __forceinline__ void fence_fragments(uint32_t (&a)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(a[i][j]) :: "memory");
  }
}

#undef PL_WGMMA_D8

}  // namespace pl::wgmma
