// Blackwell (sm_100a) fifth-generation tensor core: tcgen05.mma on shared-memory
// operands (A also from Tensor Memory) with the accumulator in Tensor Memory (TMEM), the
// commit that turns MMA completion into an mbarrier arrival, the thread-sync fences, and
// tcgen05.ld / tcgen05.st of a row between Tensor Memory and registers.
//
// The instructions exist on sm_100a only: a component that calls these lists just
// sm_100a in its arch (pipelink.cuh includes this header everywhere; uncalled, it
// emits nothing).
//
// Tensor Memory. 128 lanes x 512 columns of 32 bits per SM. An address is
// (lane << 16) | column. Warp w of a CTA reaches lanes [32 (w % 4), 32 (w % 4) + 32)
// only (its sub-partition). An M = 128, cta_group::1 MMA (the full-rate shape) writes
// row r of D to lane r (PTX ISA, "Data path layout organization"), so a warpgroup reads
// the tile back one row per thread with tcgen05.ld.32x32b: the layout contracts name
// "tmem_f32_m128_rows". The MMA warp (umma_mainloop) and the epilogue warps
// (pipelink/tmem_epilogue.cuh) meet at a tmem port: accumulator buffers in TMEM with
// full/empty mbarriers, placed by the linker.
#pragma once

#include <cstdint>

#include "pipelink/smem.cuh"

namespace pl::tcgen05 {

constexpr uint32_t kM = 64;                    // the half-rate cta_group::1 MMA's rows
constexpr uint32_t kFullM = 128;               // the full-rate cta_group::1 MMA: row r -> lane r
constexpr uint32_t kFullMinN = 16;             // M = 128, 256: N is 16..256 in steps of 16
constexpr uint32_t kPairM = 256;               // the CTA-pair MMA (cta_group::2): 128 rows each
constexpr uint16_t kPairMask = 0b11;           // both CTAs of a pair, in a cluster of 2
constexpr uint32_t kK = 16;                    // K per MMA for 16-bit inputs
constexpr uint32_t kPerColumn16 = 2;           // 16-bit elements per 32-bit TMEM column
constexpr uint32_t kMinN = 8;                  // M = 64: N is 8..256 in steps of 8
constexpr uint32_t kMaxN = 256;
constexpr uint32_t kSwizzleBytes = 128;        // one swizzled row: 64 bf16 of K
constexpr uint32_t kSwizzleRows = 8;           // rows in one swizzle atom
constexpr uint32_t kSwizzleAtomBytes = kSwizzleBytes * kSwizzleRows;  // base alignment

// -- Tensor Memory addresses ------------------------------------------------------------

constexpr uint32_t kLaneShift = 16;            // address bits 31..16: lane; 15..0: column
constexpr uint32_t kSubpartitionLanes = 32;    // lanes one warp (w % 4) reaches
constexpr uint32_t kSubpartitions = 4;

__device__ __forceinline__ uint32_t tmem_addr(uint32_t base, uint32_t lane, uint32_t column) {
  return base + (lane << kLaneShift) + column;
}

// -- Shared-memory matrix descriptor (PTX ISA, "Shared memory descriptor", tcgen05) -------
//
//   bits  0-13  start address >> 4           bits 32-45  stride byte offset >> 4
//   bits 16-29  leading byte offset >> 4     bits 46-48  fixed 0b001 (the SM100 version;
//   bits 49-51  base offset                               sm_90 wgmma has 0 here)
//   bit  52     leading offset mode (0: relative)
//   bits 61-63  swizzle: 0 none, 1 128B with 32B atoms, 2 128B, 4 64B, 6 32B
//               (sm_90 wgmma: 2 bits at 62-63 with 1 = 128B; not interchangeable)
constexpr uint32_t kDescUnit = 16;             // addresses and offsets count 16-byte units
constexpr uint32_t kDescAddressMask = 0x3FFFF; // the encoding keeps address bits 17..4
constexpr uint32_t kDescLeadingShift = 16;
constexpr uint32_t kDescStrideShift = 32;
constexpr uint32_t kDescVersionShift = 46;
constexpr uint64_t kDescVersionSm100 = 1;
constexpr uint32_t kDescBaseOffsetShift = 49;
constexpr uint64_t kDescBaseOffsetAligned = 0; // the swizzle pattern starts on a 1024-byte
                                               // boundary: stages are 1024-aligned
constexpr uint32_t kDescLayoutShift = 61;
constexpr uint64_t kDescSwizzle128B = 2;
// K-major with a 128-byte swizzle: one MMA's K (32 bytes) never leaves a swizzled row,
// so the leading offset is unused; the ISA says it is assumed 1.
constexpr uint64_t kDescLeadingUnused = 1;
// Eight-row groups of a K-major, 128-byte-swizzled tile sit one atom apart.
constexpr uint64_t kDescStrideSw128 = kSwizzleAtomBytes / kDescUnit;

// Descriptor of a K-major bf16 tile TMA wrote with a 128-byte swizzle at the placed
// shared-memory `offset` (a multiple of 1024, relative to the dynamic window).
__device__ __forceinline__ uint64_t desc_sw128_kmajor(uint32_t offset) {
  const uint64_t start = (smem_addr(offset) & kDescAddressMask) / kDescUnit;
  return start | (kDescLeadingUnused << kDescLeadingShift) |
         (kDescStrideSw128 << kDescStrideShift) | (kDescVersionSm100 << kDescVersionShift) |
         (kDescBaseOffsetAligned << kDescBaseOffsetShift) |
         (kDescSwizzle128B << kDescLayoutShift);
}

// MN-major with a 128-byte swizzle (the canonical ((64, m), (8, k)) layout of 16-bit
// elements): the tile is blocks of 64 MN-elements (one 128-byte swizzled row) by the
// stage's K rows, one TMA box each. The leading offset steps from one MN block to the
// next (`block_bytes` apart), the stride offset from one 8-row group of K to the next.
__device__ __forceinline__ uint64_t desc_sw128_mnmajor(uint32_t offset, uint32_t block_bytes) {
  const uint64_t start = (smem_addr(offset) & kDescAddressMask) / kDescUnit;
  return start | (uint64_t(block_bytes / kDescUnit) << kDescLeadingShift) |
         (kDescStrideSw128 << kDescStrideShift) | (kDescVersionSm100 << kDescVersionShift) |
         (kDescBaseOffsetAligned << kDescBaseOffsetShift) |
         (kDescSwizzle128B << kDescLayoutShift);
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
// swizzles the final address (bits 4-6 ^= bits 7-9), so a K step moves the start
// address only; the pattern still starts on the 1024-byte boundary, so the base
// offset stays 0. (MN-major steps are whole atoms.)
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t bytes) {
  return desc + bytes / kDescUnit;
}

// Operand tiles of an attention head (pl::attn::load_head_tile): `rows` rows by head_dim
// columns stored as 64-column boxes side by side, each `rows` x 128 bytes, 128-byte
// swizzled. Read K-major (K = head_dim), the descriptor of K step `s`: step s lies in box
// s / 4, 32 bytes further along the swizzled rows per step inside it.
__device__ __forceinline__ uint64_t desc_boxed_kmajor(uint32_t offset, uint32_t rows,
                                                      uint32_t s) {
  constexpr uint32_t kStepBytes = kK * 2;                        // 16-bit elements
  constexpr uint32_t kStepsPerBox = kSwizzleBytes / kStepBytes;
  const uint32_t box = offset + (s / kStepsPerBox) * rows * kSwizzleBytes;
  return desc_advance(desc_sw128_kmajor(box), (s % kStepsPerBox) * kStepBytes);
}

// -- Instruction descriptor (PTX ISA, "Instruction descriptor", .kind::f16) ----------------
//
//   bits  0-1 sparsity selector, 2 sparse, 3 saturate     (0: dense, no saturation)
//   bits  4-5 D type: 0 f16, 1 f32                        bit 6 reserved
//   bits  7-9 A type, bits 10-12 B type: 0 f16, 1 bf16
//   bit  13 negate A, bit 14 negate B                     (0)
//   bit  15 transpose A, bit 16 transpose B               (0: K-major)
//   bits 17-22 N >> 3      bit 23 reserved
//   bits 24-28 M >> 4      bit 29 reserved    bits 30-31 max shift (.ws only; 0)
constexpr uint32_t kIdescDTypeShift = 4;
constexpr uint32_t kIdescATypeShift = 7;
constexpr uint32_t kIdescBTypeShift = 10;
constexpr uint32_t kIdescTransposeAShift = 15;
constexpr uint32_t kIdescTransposeBShift = 16;
constexpr uint32_t kIdescNShift = 17;
constexpr uint32_t kIdescNGranule = 8;         // N is stored without its 3 low bits
constexpr uint32_t kIdescMShift = 24;
constexpr uint32_t kIdescMGranule = 16;        // M is stored without its 4 low bits
constexpr uint32_t kIdescF32 = 1;
constexpr uint32_t kIdescBF16 = 1;
constexpr uint32_t kIdescKMajor = 0;
constexpr uint32_t kIdescMnMajor = 1;

// bf16 x bf16 -> f32, dense, an (M x N) D; each operand K-major unless its flag says
// MN-major.
template <uint32_t M, uint32_t N, bool kMnMajorA = false, bool kMnMajorB = false>
constexpr uint32_t idesc_bf16_f32() {
  static_assert(M == kM || M == kFullM || M == kPairM,
                "MMAs are M = 64 or 128 (cta_group::1) or M = 256 (cta_group::2)");
  static_assert(N % (M == kM ? kMinN : kFullMinN) == 0 &&
                    N >= (M == kM ? kMinN : kFullMinN) && N <= kMaxN,
                "an M = 64 MMA is 8..256 columns wide in steps of 8, an M = 128 one 16..256 "
                "in steps of 16: change tile_n");
  return (kIdescF32 << kIdescDTypeShift) | (kIdescBF16 << kIdescATypeShift) |
         (kIdescBF16 << kIdescBTypeShift) |
         ((kMnMajorA ? kIdescMnMajor : kIdescKMajor) << kIdescTransposeAShift) |
         ((kMnMajorB ? kIdescMnMajor : kIdescKMajor) << kIdescTransposeBShift) | ((N / kIdescNGranule) << kIdescNShift) |
         ((M / kIdescMGranule) << kIdescMShift);
}

// -- MMA, commit, fences ---------------------------------------------------------------

// D (TMEM) = A * B^T (+ D when `accumulate` is non-zero), A and B from shared memory
// through descriptors, shape and types from `idesc`. Issued by one thread; runs
// asynchronously until a commit reports it.
__device__ __forceinline__ void mma_ss(uint32_t d_tmem, uint64_t a, uint64_t b, uint32_t idesc,
                                       uint32_t accumulate) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %4, 0;\n"
      " tcgen05.mma.cta_group::1.kind::f16 [%0], %1, %2, %3, p;\n}\n"
      :: "r"(d_tmem), "l"(a), "l"(b), "r"(idesc), "r"(accumulate) : "memory");
}

// D (TMEM) = A * B^T (+ D), A from Tensor Memory at `a_tmem` (row r in lane r, K along
// the columns, two 16-bit elements per 32-bit column, the lower K in the low half: the
// layout CuTe's tmem_frg gives a 16-bit A of an M = 128 MMA under its tmem_ptr's word
// addressing), B from shared memory through its descriptor. A must be K-major: idesc's
// transpose-A is 0.
__device__ __forceinline__ void mma_ts(uint32_t d_tmem, uint32_t a_tmem, uint64_t b,
                                       uint32_t idesc, uint32_t accumulate) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %4, 0;\n"
      " tcgen05.mma.cta_group::1.kind::f16 [%0], [%1], %2, %3, p;\n}\n"
      :: "r"(d_tmem), "r"(a_tmem), "l"(b), "r"(idesc), "r"(accumulate) : "memory");
}

// The CTA-pair MMA (cta_group::2, issued by the pair's leader only): D rows [0, M/2)
// in the leader's Tensor Memory, [M/2, M) in the peer's at the same address; A's rows
// likewise from each CTA's shared memory at the same offset, and B's N rows half from
// each. The descriptors are the leader's; the hardware reads the peer's copy.
__device__ __forceinline__ void mma_ss_pair(uint32_t d_tmem, uint64_t a, uint64_t b,
                                            uint32_t idesc, uint32_t accumulate) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %4, 0;\n"
      " tcgen05.mma.cta_group::2.kind::f16 [%0], %1, %2, %3, p;\n}\n"
      :: "r"(d_tmem), "l"(a), "l"(b), "r"(idesc), "r"(accumulate) : "memory");
}

// One arrival on the mbarrier at `mbar_offset` in every CTA of `cta_mask` (the pair:
// 0b11) once the pair's tcgen05 operations issued so far have completed.
__device__ __forceinline__ void commit_pair(uint32_t mbar_offset, uint16_t cta_mask) {
  asm volatile(
      "tcgen05.commit.cta_group::2.mbarrier::arrive::one.shared::cluster.multicast::cluster.b64"
      " [%0], %1;"
      :: "r"(smem_addr(mbar_offset)), "h"(cta_mask) : "memory");
}

// One arrival on the mbarrier at `mbar_offset` once every tcgen05 operation this
// thread issued so far has completed (their shared-memory reads included).
__device__ __forceinline__ void commit(uint32_t mbar_offset) {
  asm volatile(
      "tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [%0];"
      :: "r"(smem_addr(mbar_offset)) : "memory");
}

// Orders this thread's earlier tcgen05 operations before a following thread sync
// (barrier or mbarrier arrival).
__device__ __forceinline__ void fence_before_thread_sync() {
  asm volatile("tcgen05.fence::before_thread_sync;" ::: "memory");
}

// Orders this thread's later tcgen05 operations after a preceding thread sync.
__device__ __forceinline__ void fence_after_thread_sync() {
  asm volatile("tcgen05.fence::after_thread_sync;" ::: "memory");
}

// -- Waiting on an mbarrier phase without knowing its parity ---------------------------

// Arrives on the mbarrier and returns the token of the phase arrived on.
__device__ __forceinline__ uint64_t arrive_token(uint32_t mbar_offset) {
  uint64_t token;
  asm volatile("mbarrier.arrive.shared::cta.b64 %0, [%1];"
               : "=l"(token) : "r"(smem_addr(mbar_offset)) : "memory");
  return token;
}

// Waits until the phase `token` came from has completed.
__device__ __forceinline__ void wait_token(uint32_t mbar_offset, uint64_t token) {
  uint32_t done;
  do {
    asm volatile("{\n .reg .pred p;\n"
                 " mbarrier.try_wait.shared::cta.b64 p, [%1], %2;\n"
                 " selp.u32 %0, 1, 0, p;\n}"
                 : "=r"(done) : "r"(smem_addr(mbar_offset)), "l"(token) : "memory");
  } while (!done);
}

// -- TMEM -> registers ------------------------------------------------------------------

// tcgen05.ld.32x32b.x64 into operands %0..%63 from the address in %64.
#define PL_TCGEN05_LD_X64                                                                   \
  "tcgen05.ld.sync.aligned.32x32b.x64.b32 {"                                                \
  "%0, %1, %2, %3, %4, %5, %6, %7,"                                                         \
  "%8, %9, %10, %11, %12, %13, %14, %15,"                                                   \
  "%16, %17, %18, %19, %20, %21, %22, %23,"                                                 \
  "%24, %25, %26, %27, %28, %29, %30, %31,"                                                 \
  "%32, %33, %34, %35, %36, %37, %38, %39,"                                                 \
  "%40, %41, %42, %43, %44, %45, %46, %47,"                                                 \
  "%48, %49, %50, %51, %52, %53, %54, %55,"                                                 \
  "%56, %57, %58, %59, %60, %61, %62, %63"                                                  \
  "}, [%64];\n"

#define PL_TCGEN05_D8(d, i)                                                                 \
  "=f"(d[i + 0]), "=f"(d[i + 1]), "=f"(d[i + 2]), "=f"(d[i + 3]), "=f"(d[i + 4]),           \
      "=f"(d[i + 5]), "=f"(d[i + 6]), "=f"(d[i + 7])

// tcgen05.ld.32x32b.x64 (PTX ISA, "Matrix fragments for shape .32x32b"): thread t of a
// warp reads lane (taddr's lane) + t, 64 consecutive columns from taddr's column:
// register i is column i. After an M = 128 MMA (row r in lane r) that is one row of D
// per thread, which is the layout "tmem_f32_m128_rows" contracts name. Loads and
// waits in one statement, like load_fragment.
__device__ __forceinline__ void load_row_x64(uint32_t taddr, float (&d)[64]) {
  asm volatile(
      PL_TCGEN05_LD_X64
      "tcgen05.wait::ld.sync.aligned;\n"
      : PL_TCGEN05_D8(d, 0), PL_TCGEN05_D8(d, 8), PL_TCGEN05_D8(d, 16), PL_TCGEN05_D8(d, 24),
        PL_TCGEN05_D8(d, 32), PL_TCGEN05_D8(d, 40), PL_TCGEN05_D8(d, 48), PL_TCGEN05_D8(d, 56)
      : "r"(taddr) : "memory");
}

// The load of load_row_x64 alone, so that several are in flight before one wait
// (wait_loaded, below, before any use of d).
__device__ __forceinline__ void start_load_row_x64(uint32_t taddr, float (&d)[64]) {
  asm volatile(
      PL_TCGEN05_LD_X64
      : PL_TCGEN05_D8(d, 0), PL_TCGEN05_D8(d, 8), PL_TCGEN05_D8(d, 16), PL_TCGEN05_D8(d, 24),
        PL_TCGEN05_D8(d, 32), PL_TCGEN05_D8(d, 40), PL_TCGEN05_D8(d, 48), PL_TCGEN05_D8(d, 56)
      : "r"(taddr) : "memory");
}

// start_load_row_x64 at half the width: columns (taddr's column) .. + 31 of the lane.
__device__ __forceinline__ void start_load_row_x32(uint32_t taddr, float (&d)[32]) {
  asm volatile(
      "tcgen05.ld.sync.aligned.32x32b.x32.b32 {"
      "%0, %1, %2, %3, %4, %5, %6, %7,"
      "%8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23,"
      "%24, %25, %26, %27, %28, %29, %30, %31"
      "}, [%32];\n"
      : PL_TCGEN05_D8(d, 0), PL_TCGEN05_D8(d, 8), PL_TCGEN05_D8(d, 16), PL_TCGEN05_D8(d, 24)
      : "r"(taddr) : "memory");
}

// After loads that do not wait (start_load_row_x64, start_load_row_x32, or CuTe's SM100_TMEM_LOAD atoms,
// which issue the bare tcgen05.ld): tcgen05.wait::ld, then every loaded register passed
// through an empty statement that claims to rewrite it. Volatile statements keep their
// order, so no use of v can be scheduled before the wait (a plain wait orders memory,
// not registers).
template <uint32_t N>
__device__ __forceinline__ void wait_loaded(float (&v)[N]) {
  static_assert(N % 8 == 0, "wait for whole groups of 8 registers");
  asm volatile("tcgen05.wait::ld.sync.aligned;" ::: "memory");
#pragma unroll
  for (uint32_t i = 0; i < N; i += 8) {
    asm volatile("" : "+f"(v[i + 0]), "+f"(v[i + 1]), "+f"(v[i + 2]), "+f"(v[i + 3]),
                      "+f"(v[i + 4]), "+f"(v[i + 5]), "+f"(v[i + 6]), "+f"(v[i + 7]));
  }
}

// -- registers -> TMEM ------------------------------------------------------------------

#define PL_TCGEN05_S8(v, i)                                                                 \
  "r"(v[i + 0]), "r"(v[i + 1]), "r"(v[i + 2]), "r"(v[i + 3]), "r"(v[i + 4]), "r"(v[i + 5]),  \
      "r"(v[i + 6]), "r"(v[i + 7])

// tcgen05.st.32x32b.x32, the mirror of load_row_x64 at half the width: thread t of a warp
// writes v[i] to column (taddr's column) + i of lane (taddr's lane) + t. Asynchronous:
// wait_store() before anything else may read those columns.
__device__ __forceinline__ void store_row_x32(uint32_t taddr, const uint32_t (&v)[32]) {
  asm volatile(
      "tcgen05.st.sync.aligned.32x32b.x32.b32 [%0], {"
      "%1, %2, %3, %4, %5, %6, %7, %8,"
      "%9, %10, %11, %12, %13, %14, %15, %16,"
      "%17, %18, %19, %20, %21, %22, %23, %24,"
      "%25, %26, %27, %28, %29, %30, %31, %32"
      "};"
      :: "r"(taddr), PL_TCGEN05_S8(v, 0), PL_TCGEN05_S8(v, 8), PL_TCGEN05_S8(v, 16),
         PL_TCGEN05_S8(v, 24) : "memory");
}

// store_row_x32 at half the width: columns (taddr's column) .. + 15 of the lane.
__device__ __forceinline__ void store_row_x16(uint32_t taddr, const uint32_t (&v)[16]) {
  asm volatile(
      "tcgen05.st.sync.aligned.32x32b.x16.b32 [%0], {"
      "%1, %2, %3, %4, %5, %6, %7, %8,"
      "%9, %10, %11, %12, %13, %14, %15, %16"
      "};"
      :: "r"(taddr), PL_TCGEN05_S8(v, 0), PL_TCGEN05_S8(v, 8) : "memory");
}

// Waits until this thread's tcgen05.st have written Tensor Memory.
__device__ __forceinline__ void wait_store() {
  asm volatile("tcgen05.wait::st.sync.aligned;" ::: "memory");
}

// The first lane warp `warp` of a warpgroup-aligned role reaches (its sub-partition).
__device__ __forceinline__ uint32_t subpartition_lanes(uint32_t base, uint32_t warp) {
  return tmem_addr(base, (warp % kSubpartitions) * kSubpartitionLanes, 0);
}

// The row of an M-row cta_group::1 accumulator that thread `thread` of a warpgroup reads
// with tcgen05.ld.32x32b (lane thread % 32 of warp thread / 32's sub-partition), and
// whether it reads one. M = 128: row r is lane r. M = 64 (PTX ISA, data-path layout F):
// lanes 0-15 of each sub-partition hold 16 rows, warp w's rows 16 w .. 16 w + 15, and
// lanes 16-31 hold none.
template <uint32_t M>
struct AccumulatorRow {
  static_assert(M == kM || M == kFullM, "cta_group::1 accumulators have 64 or 128 rows");
  static constexpr uint32_t kRowsPerSubpartition = M / kSubpartitions;

  uint32_t row;
  bool held;

  __device__ __forceinline__ explicit AccumulatorRow(uint32_t thread)
      : row(thread / kSubpartitionLanes * kRowsPerSubpartition + thread % kSubpartitionLanes),
        held(thread % kSubpartitionLanes < kRowsPerSubpartition) {}
};

#undef PL_TCGEN05_LD_X64
#undef PL_TCGEN05_D8
#undef PL_TCGEN05_S8

}  // namespace pl::tcgen05
