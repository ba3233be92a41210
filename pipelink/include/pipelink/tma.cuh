// TMA (cp.async.bulk.tensor) helpers. Tensor maps arrive as __grid_constant__
// kernel parameters; components receive a pointer to theirs in their args.
#pragma once

#include <cstdint>

#include "pipelink/smem.cuh"

namespace pl::tma {

// The most elements a TMA box spans in one dimension (the tensor map's boxDim limit).
constexpr uint32_t kMaxBoxRows = 256;

__device__ __forceinline__ void prefetch_descriptor(const void* map) {
  asm volatile("prefetch.tensormap [%0];" :: "l"(map) : "memory");
}

// A contiguous copy of `bytes` (a multiple of 16, from a 16-byte-aligned address) into
// shared memory, completing on an mbarrier (complete_tx): no tensor map.
__device__ __forceinline__ void load_bulk(uint32_t dst_offset, const void* src, uint32_t bytes,
                                          uint32_t mbar_offset) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
      :: "r"(smem_addr(dst_offset)), "l"(src), "r"(bytes), "r"(smem_addr(mbar_offset))
      : "memory");
}

// 2-D tile load into shared memory completing on an mbarrier (complete_tx).
__device__ __forceinline__ void load_2d(uint32_t dst_offset, const void* map,
                                        uint32_t mbar_offset, int32_t c0, int32_t c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4}], [%2];"
      :: "r"(smem_addr(dst_offset)), "l"(map), "r"(smem_addr(mbar_offset)),
         "r"(c0), "r"(c1) : "memory");
}

// 3-D tile load (c2 is the outermost coordinate, e.g. a batch or group index).
__device__ __forceinline__ void load_3d(uint32_t dst_offset, const void* map,
                                        uint32_t mbar_offset, int32_t c0, int32_t c1,
                                        int32_t c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5}], [%2];"
      :: "r"(smem_addr(dst_offset)), "l"(map), "r"(smem_addr(mbar_offset)),
         "r"(c0), "r"(c1), "r"(c2) : "memory");
}

// 2-D tile load multicast to every CTA of `cta_mask` in the cluster: the tile lands at
// `dst_offset` in each, and its bytes complete on each one's mbarrier at `mbar_offset`.
__device__ __forceinline__ void load_2d_multicast(uint32_t dst_offset, const void* map,
                                                  uint32_t mbar_offset, int32_t c0, int32_t c1,
                                                  uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%3, %4}], [%2], %5;"
      :: "r"(smem_addr(dst_offset)), "l"(map), "r"(smem_addr(mbar_offset)), "r"(c0), "r"(c1),
         "h"(cta_mask) : "memory");
}

// A 3-D tile brought into L2 only (no shared memory, no mbarrier): a later load of the
// same box then comes from L2.
__device__ __forceinline__ void prefetch_3d(const void* map, int32_t c0, int32_t c1, int32_t c2) {
  asm volatile("cp.async.bulk.prefetch.tensor.3d.L2.global.tile [%0, {%1, %2, %3}];"
               :: "l"(map), "r"(c0), "r"(c1), "r"(c2) : "memory");
}

// The CTA-pair forms (sm_100a, a 2-CTA MMA's operands): each CTA of the pair loads its
// own part into its own shared memory, and the bytes complete on the mbarrier at
// `mbar_addr`, a shared::cluster address (the pair's leader's barrier, see
// pl::cluster::peer_addr), which alone expects both CTAs' bytes.
__device__ __forceinline__ void load_2d_pair(uint32_t dst_offset, const void* map,
                                             uint32_t mbar_addr, int32_t c0, int32_t c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.cta_group::2.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4}], [%2];"
      :: "r"(smem_addr(dst_offset)), "l"(map), "r"(mbar_addr), "r"(c0), "r"(c1) : "memory");
}

__device__ __forceinline__ void load_3d_pair(uint32_t dst_offset, const void* map,
                                             uint32_t mbar_addr, int32_t c0, int32_t c1,
                                             int32_t c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.cta_group::2.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5}], [%2];"
      :: "r"(smem_addr(dst_offset)), "l"(map), "r"(mbar_addr), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

// 2-D tile store from shared memory; out-of-bounds rows/columns are clipped.
__device__ __forceinline__ void store_2d(const void* map, uint32_t src_offset,
                                         int32_t c0, int32_t c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];"
               :: "l"(map), "r"(smem_addr(src_offset)), "r"(c0), "r"(c1) : "memory");
}

// 4-D tile store from shared memory ({c0, c1, c2, c3} innermost first); out-of-bounds
// elements are clipped.
__device__ __forceinline__ void store_4d(const void* map, uint32_t src_offset, int32_t c0,
                                         int32_t c1, int32_t c2, int32_t c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];"
      :: "l"(map), "r"(smem_addr(src_offset)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

// 3-D tile reduction into global memory: adds the fp32 tile in shared memory to the
// box at {c0, c1, c2} (innermost first), elementwise, in the L2; out-of-bounds elements
// are clipped. Completes as a store does (store_commit, store_wait_read, store_wait).
__device__ __forceinline__ void reduce_add_3d(const void* map, uint32_t src_offset, int32_t c0,
                                              int32_t c1, int32_t c2) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group"
      " [%0, {%2, %3, %4}], [%1];"
      :: "l"(map), "r"(smem_addr(src_offset)), "r"(c0), "r"(c1), "r"(c2) : "memory");
}

// Orders global memory between the generic proxy and TMA (the async proxy): TMA writes
// a thread waited for, before its release; an acquire, before TMA reads or reductions.
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;" ::: "memory");
}

__device__ __forceinline__ void store_commit() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// Waits until at most N committed store groups still read shared memory.
template <int N>
__device__ __forceinline__ void store_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" :: "n"(N) : "memory");
}

template <int N>
__device__ __forceinline__ void store_wait() {
  asm volatile("cp.async.bulk.wait_group %0;" :: "n"(N) : "memory");
}

// One GEMM operand stage of (kRows, kTileK) elements, 128-byte swizzled, whose
// first M (or N) index is `mn` and first K index `k`, of problem `group` (a 2-D map
// ignores it). K-major: one box (kTileK, kRows). MN-major: kRows / 64 boxes of
// (64, kTileK) side by side, the canonical MN-major layout an MMA descriptor walks with
// its leading offset (one box apart).
template <class Element, bool kMnMajor, uint32_t kRows, uint32_t kTileK, bool kGrouped>
__device__ __forceinline__ void load_operand(uint32_t stage, const void* map, uint32_t full,
                                             int32_t mn, int32_t k, int32_t group) {
  constexpr uint32_t kSwizzleBytes = 128;
  constexpr uint32_t kBlockColumns = kSwizzleBytes / sizeof(Element);   // one swizzled row
  constexpr uint32_t kBlockBytes = kTileK * kSwizzleBytes;
  static_assert(!kMnMajor || kRows % kBlockColumns == 0,
                "an MN-major tile is whole 64-wide boxes: make its rows a multiple of 128 / sizeof(dtype)");
  if constexpr (kMnMajor) {
#pragma unroll
    for (uint32_t b = 0; b < kRows / kBlockColumns; ++b) {
      const int32_t col = mn + int32_t(b * kBlockColumns);
      if constexpr (kGrouped) {
        load_3d(stage + b * kBlockBytes, map, full, col, k, group);
      } else {
        load_2d(stage + b * kBlockBytes, map, full, col, k);
      }
    }
  } else if constexpr (kGrouped) {
    load_3d(stage, map, full, k, mn, group);
  } else {
    load_2d(stage, map, full, k, mn);
  }
}

}  // namespace pl::tma
