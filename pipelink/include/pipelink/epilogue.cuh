// Epilogue building blocks: the fp32 accumulator fragment a wgmma mainloop hands
// over in registers, bf16 staging of it in a 128-byte-swizzled shared-memory tile
// (stmatrix, bank-conflict free), and the staged TMA store protocol.
//
// Register layout "wgmma_f32_m64nN_wg_rows" (the name contracts use for it): a role
// of W warpgroups holds a (64 W) x N fp32 tile; warpgroup g owns rows [64g, 64g+64);
// thread t of that warpgroup holds N/2 floats, float i at
//   row = 64 g + 16 (t / 32) + (t % 32) / 4 + 8 ((i / 2) % 2)
//   col =  8 (i / 4) + 2 (t % 4) + i % 2
// So per 8-column block j a thread holds floats 4j, 4j+1 (row r, columns c, c+1) and
// 4j+2, 4j+3 (row r+8, the same columns): exactly the wgmma .m64nNk16 fp32 D
// fragment, and, per 8x8 block, the fragment stmatrix stores.
//
// Arch-neutral from sm_90 on (stmatrix, TMA stores, async-proxy fence).
#pragma once

#include <cstdint>
#include <cuda_bf16.h>

#include "pipelink/named_barrier.cuh"
#include "pipelink/smem.cuh"
#include "pipelink/tma.cuh"
#include "pipelink/types.cuh"
#include "pipelink/warp.cuh"

namespace pl::epi {

constexpr uint32_t kRowsPerWarpgroup = 64;
constexpr uint32_t kRowsPerWarp = 16;
constexpr uint32_t kBlockCols = 8;           // columns of one 8x8 block
constexpr uint32_t kFloatsPerBlock = 4;      // a thread's share of one 8-column block
constexpr uint32_t kHalfRows = 8;            // float 4j+2 sits this many rows below 4j

// A 128-byte-swizzled staging tile (what TMA's SWIZZLE_128B expects): rows of 128
// bytes; 16-byte chunk c of row r sits at chunk c ^ (r % 8).
constexpr uint32_t kSwizzleRowBytes = 128;
constexpr uint32_t kChunkBytes = 16;
constexpr uint32_t kSwizzleRows = 8;
constexpr uint32_t kSwizzleAtomBytes = kSwizzleRowBytes * kSwizzleRows;  // tile alignment

// stmatrix .x4 stores four 8x8 blocks per warp: lanes 8m..8m+7 address the rows of
// block m.
constexpr uint32_t kStmatrixRows = 8;

// First of the 16 tile rows held by the warp of `thread_in_role` (4 warps x 16 rows
// per warpgroup, warpgroups in row order).
__device__ __forceinline__ uint32_t warp_row(uint32_t thread_in_role) {
  return thread_in_role / kWarpThreads * kRowsPerWarp;
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);   // lo -> lower address
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Half `which` (0: lo, 1: hi) of a pack_bf16x2 pair, as a float (exact).
__device__ __forceinline__ float unpack_bf16(uint32_t pair, uint32_t which) {
  constexpr uint32_t kBf16Bits = 16;
  return __uint_as_float(which == 0 ? pair << kBf16Bits : pair & ~((1u << kBf16Bits) - 1u));
}

// silu(x) = x * sigmoid(x) = 0.5 x (1 + tanh(x / 2)): one MUFU op per element.
__device__ __forceinline__ float silu(float x) {
  const float half_x = 0.5f * x;
  float t;
  asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(half_x));
  return half_x + half_x * t;
}

// The SwiGLU of one output element: silu(gate) * up, in fp32 (the store epilogues'
// shared math, whatever layout the accumulators come in).
__device__ __forceinline__ float swiglu(float gate, float up) { return silu(gate) * up; }

// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), the
// constants of Hendrycks and Gimpel's formula (PyTorch's approximate="tanh").
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

// gelu_tanh(x) in fp32 with one MUFU op: 0.5 x + 0.5 x tanh(inner).
__device__ __forceinline__ float gelu_tanh(float x) {
  const float inner = x * (kSqrt2OverPi + kSqrt2OverPi * kGeluCubic * x * x);
  float t;
  asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(inner));
  const float half_x = 0.5f * x;
  return half_x + half_x * t;
}

// A bias entry `offset` columns past `bias`, or 0 where that column is `cols_left` or
// beyond (the bias has one entry per output column; TMA clips those columns of Y).
// `offset` is a compile-time constant once unrolled: one load with an immediate each.
__device__ __forceinline__ float bias_at(const __nv_bfloat16* bias, int32_t cols_left,
                                         uint32_t offset) {
  return int32_t(offset) < cols_left ? __bfloat162float(__ldg(bias + offset)) : 0.0f;
}

__device__ __forceinline__ uint32_t sw128_offset(uint32_t row, uint32_t chunk) {
  return row * kSwizzleRowBytes + ((chunk ^ (row % kSwizzleRows)) * kChunkBytes);
}

// A staging tile's layout, as the TMA store that reads it is told (its tensormap's
// swizzle): SWIZZLE 128, rows of 128 bytes swizzled (sw128_offset); SWIZZLE 0, plain
// rows of ROW_BYTES, for chunks narrower than 64 bf16 columns (a 168-column tile is three
// of 56). Eight consecutive rows then put a 16-byte piece in eight different bank groups
// only when a row is an odd number of 16-byte pieces: stmatrix stays conflict free.
template <uint32_t SWIZZLE, uint32_t ROW_BYTES>
struct Staging {
  static_assert(SWIZZLE == kSwizzleRowBytes || SWIZZLE == 0,
                "staging tiles are 128-byte swizzled or not swizzled: set swizzle to 128 or 0");
  static_assert(SWIZZLE == 0 || ROW_BYTES == kSwizzleRowBytes,
                "a swizzled staging row is one 128-byte swizzle row: set store_n = 128 / "
                "sizeof(dtype), or swizzle: 0");
  static_assert(SWIZZLE != 0 || (ROW_BYTES % kChunkBytes == 0 && ROW_BYTES / kChunkBytes % 2 == 1),
                "an unswizzled staging row is an odd number of 16-byte pieces (bank-conflict "
                "free stmatrix): make store_n 8 times an odd number");

  __device__ static uint32_t offset(uint32_t row, uint32_t chunk) {
    if constexpr (SWIZZLE == 0) {
      return row * ROW_BYTES + chunk * kChunkBytes;
    } else {
      return sw128_offset(row, chunk);
    }
  }
};
using Sw128Staging = Staging<kSwizzleRowBytes, kSwizzleRowBytes>;

__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1,
                                            uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};"
               :: "r"(addr), "r"(r0), "r"(r1), "r"(r2), "r"(r3) : "memory");
}

__device__ __forceinline__ void stmatrix_x2(uint32_t addr, uint32_t r0, uint32_t r1) {
  asm volatile("stmatrix.sync.aligned.m8n8.x2.shared.b16 [%0], {%1, %2};"
               :: "r"(addr), "r"(r0), "r"(r1) : "memory");
}

// Warp-collective: stores blocks `block` and `block + 1` (8-column blocks within a
// staging row) of this warp's 16 rows, from `first_row` on, into the staging tile at
// shared-memory offset `tile`, laid out as STAGING says.
// packed = this thread's bf16 pair of {block b, upper 8 rows; block b, lower 8 rows;
// block b+1, upper 8 rows; block b+1, lower 8 rows}: floats 4b..4b+3, 4b+4..4b+7 of
// the fragment, packed in order.
template <class STAGING = Sw128Staging>
__device__ __forceinline__ void stage_block_pair(uint32_t tile, uint32_t first_row,
                                                 uint32_t block, const uint32_t (&packed)[4]) {
  const uint32_t which = lane() / kStmatrixRows;              // 8x8 block this lane addresses
  const uint32_t row = first_row + (which % 2) * kHalfRows + lane() % kStmatrixRows;
  const uint32_t chunk = block + which / 2;                   // one 8-column block = 16 bytes
  stmatrix_x4(smem_addr(tile + STAGING::offset(row, chunk)), packed[0], packed[1], packed[2],
              packed[3]);
}

// stage_block_pair for block `block` alone (the last of a chunk with an odd number of
// blocks): lanes 0-15 address its upper and lower 8 rows, packed = {upper, lower}.
template <class STAGING>
__device__ __forceinline__ void stage_block(uint32_t tile, uint32_t first_row, uint32_t block,
                                            const uint32_t (&packed)[2]) {
  const uint32_t which = lane() / kStmatrixRows % 2;
  const uint32_t row = first_row + which * kHalfRows + lane() % kStmatrixRows;
  stmatrix_x2(smem_addr(tile + STAGING::offset(row, block)), packed[0], packed[1]);
}

// What a bf16 epilogue staging a (TILE_M x TILE_N) fragment STORE_N columns at a time,
// over BUFFERS rotating staging tiles, derives from its params, and the checks on them.
// SWIZZLE: the staging tiles' (and the TMA store's) swizzle, 128 or 0 (Staging).
template <uint32_t TILE_M, uint32_t TILE_N, uint32_t STORE_N, uint32_t BUFFERS, class Element,
          uint32_t SWIZZLE = kSwizzleRowBytes>
struct StagedShape {
  static constexpr uint32_t kThreads = TILE_M / kRowsPerWarp * kWarpThreads;
  static constexpr uint32_t kAccCount = kRowsPerWarpgroup * TILE_N / kWarpgroupThreads;
  static constexpr uint32_t kChunks = TILE_N / STORE_N;            // staged chunks per tile
  static constexpr uint32_t kBlocksPerChunk = STORE_N / kBlockCols;
  static constexpr uint32_t kStagingBytes = TILE_M * STORE_N * sizeof(Element);
  using Staging = pl::epi::Staging<SWIZZLE, STORE_N * sizeof(Element)>;

  static_assert(sizeof(Element) == 2, "the staged epilogues write 16-bit elements (bf16)");
  static_assert(TILE_M % kRowsPerWarpgroup == 0,
                "the accumulators come in 64-row warpgroup blocks: make tile_m a multiple of 64");
  static_assert(sizeof(Staging) > 0, "instantiates Staging, whose asserts check swizzle "
                                     "against store_n");
  static_assert(TILE_N % STORE_N == 0, "tile_n must be a multiple of store_n");
  static_assert(STORE_N % kBlockCols == 0, "stmatrix stores 8-column blocks: make store_n a "
                                           "multiple of 8");
  static_assert(kChunks % BUFFERS == 0,
                "staging buffers rotate per chunk across tiles: make tile_n / store_n a "
                "multiple of buffers");
};

// Every thread rounds chunk `chunk` of its fragment (BLOCKS 8-column blocks) to bf16 and
// stages it into the tile at `buffer`, laid out as STAGING says (warp-collective): blocks
// in pairs, and an odd last one alone.
template <uint32_t BLOCKS, uint32_t ACC, class STAGING = Sw128Staging>
__device__ __forceinline__ void stage_chunk_bf16(uint32_t buffer, uint32_t first_row,
                                                 uint32_t chunk, const float (&acc)[ACC]) {
#pragma unroll
  for (uint32_t b = 0; b + 1 < BLOCKS; b += 2) {
    const uint32_t f = (chunk * BLOCKS + b) * kFloatsPerBlock;    // first float of the pair
    const uint32_t packed[4] = {pack_bf16x2(acc[f + 0], acc[f + 1]),
                                pack_bf16x2(acc[f + 2], acc[f + 3]),
                                pack_bf16x2(acc[f + 4], acc[f + 5]),
                                pack_bf16x2(acc[f + 6], acc[f + 7])};
    stage_block_pair<STAGING>(buffer, first_row, b, packed);
  }
  if constexpr (BLOCKS % 2 == 1) {
    const uint32_t f = (chunk * BLOCKS + BLOCKS - 1) * kFloatsPerBlock;
    const uint32_t packed[2] = {pack_bf16x2(acc[f + 0], acc[f + 1]),
                                pack_bf16x2(acc[f + 2], acc[f + 3])};
    stage_block<STAGING>(buffer, first_row, BLOCKS - 1, packed);
  }
}

// Layout "wgmma_f32_m64nN_wg_rows" over a GEMM whose columns interleave gate and up in
// blocks of 8 (components/swiglu_epilogue): accumulator block 2p is gate, 2p + 1 the
// matching up, so a thread holds both halves of every output it writes. Computes
// silu(gate) * up for output chunk `chunk` (BLOCKS 8-column output blocks) in fp32 and
// stages it as bf16 into the swizzled tile at `buffer`.
template <uint32_t BLOCKS, uint32_t ACC>
__device__ __forceinline__ void stage_chunk_swiglu(uint32_t buffer, uint32_t first_row,
                                                   uint32_t chunk, const float (&acc)[ACC]) {
  constexpr uint32_t kPair = 2 * kFloatsPerBlock;   // a gate block and its up block
  constexpr uint32_t kUp = kFloatsPerBlock;         // up follows its gate block
  constexpr uint32_t kLower = kFloatsPerBlock / 2;  // floats of the row 8 below
  const auto pair = [&](uint32_t f) {
    return pack_bf16x2(swiglu(acc[f], acc[f + kUp]), swiglu(acc[f + 1], acc[f + kUp + 1]));
  };
#pragma unroll
  for (uint32_t b = 0; b < BLOCKS; b += 2) {
    const uint32_t f = (chunk * BLOCKS + b) * kPair;  // gate of output block b
    const uint32_t g = f + kPair;                     // ... and of block b + 1
    const uint32_t packed[4] = {pair(f), pair(f + kLower), pair(g), pair(g + kLower)};
    stage_block_pair(buffer, first_row, b, packed);
  }
}

// Row layout "tmem_f32_m128_rows" (an M = 128 accumulator read back from Tensor Memory
// with tcgen05.ld.32x32b): thread t of the reading warpgroup holds row t, a chunk of
// consecutive columns at a time. Rounds one STORE_N-column chunk of the thread's row to
// bf16 and writes it, 16 bytes at a time, into the swizzled staging tile at `buffer`:
// eight consecutive rows put a row's 16-byte piece in eight different bank groups, so
// a warp's stores are conflict free.
template <uint32_t STORE_N>
__device__ __forceinline__ void stage_row_bf16(uint32_t buffer, uint32_t row,
                                               const float (&v)[STORE_N]) {
  constexpr uint32_t kPerChunk = kChunkBytes / sizeof(__nv_bfloat16);   // 8 columns
  static_assert(STORE_N * sizeof(__nv_bfloat16) == kSwizzleRowBytes,
                "a staging row is one 128-byte swizzle row: set store_n = 64");
#pragma unroll
  for (uint32_t c = 0; c < STORE_N / kPerChunk; ++c) {
    const float* f = v + c * kPerChunk;
    st_shared_v4(buffer + sw128_offset(row, c), pack_bf16x2(f[0], f[1]),
                 pack_bf16x2(f[2], f[3]), pack_bf16x2(f[4], f[5]), pack_bf16x2(f[6], f[7]));
  }
}

// A bounded copy of a staged bf16 chunk (TILE_M rows x STORE_N columns, swizzled) to a
// dense row-major C: 16-byte pieces, 8 consecutive threads per row (a warp writes four
// 128-byte row segments), only rows below `row_end` and columns below `cols`: what a
// TMA store cannot bound when a tile straddles two problems of grouped work. Every
// thread of the role's THREADS copies the same share.
template <uint32_t TILE_M, uint32_t STORE_N, uint32_t THREADS>
struct BoundedCopy {
  static constexpr uint32_t kPieceElems = kChunkBytes / sizeof(__nv_bfloat16);
  static constexpr uint32_t kPiecesPerRow = STORE_N / kPieceElems;
  static constexpr uint32_t kPiecesPerThread = TILE_M * kPiecesPerRow / THREADS;
  static_assert(TILE_M * kPiecesPerRow % THREADS == 0, "every thread copies the same share");

  __nv_bfloat16* c;       // C [rows, cols]
  int32_t cols;
  int32_t row_end;        // one past the last row this tile may write
  bool whole_pieces;      // rows are 16-byte aligned (cols % 8 == 0)

  // The copy of one record's tile into C [rows, cols]: rows below both the record's
  // m_end (grouped work: the next problem's rows follow) and C's own, whole 16-byte
  // pieces where C's rows are 16-byte aligned.
  __device__ __forceinline__ static BoundedCopy within(__nv_bfloat16* c, uint32_t rows,
                                                       uint32_t cols, const WorkTile& tile) {
    return BoundedCopy{c, int32_t(cols), min(tile.m_end, int32_t(rows)),
                       cols % kPieceElems == 0};
  }

  // Copies this thread's pieces of the chunk staged at `buffer`, whose top-left element
  // is C[row0][col0].
  __device__ __forceinline__ void run(uint32_t buffer, uint32_t thread, int32_t row0,
                                      int32_t col0) const {
#pragma unroll
    for (uint32_t i = 0; i < kPiecesPerThread; ++i) {
      const uint32_t p = thread + i * THREADS;
      const uint32_t tile_row = p / kPiecesPerRow, chunk = p % kPiecesPerRow;
      const int32_t row = row0 + int32_t(tile_row);
      const int32_t col = col0 + int32_t(chunk * kPieceElems);
      if (row < row_end && col < cols) {
        piece(buffer + sw128_offset(tile_row, chunk), row, col);
      }
    }
  }

  // One piece to C[row][col..], or the part of it inside C.
  __device__ __forceinline__ void piece(uint32_t staged, int32_t row, int32_t col) const {
    const uint4 v = *smem_ptr<const uint4>(staged);
    __nv_bfloat16* dst = c + size_t(row) * cols + col;
    if (whole_pieces && col + int32_t(kPieceElems) <= cols) {
      *reinterpret_cast<uint4*>(dst) = v;
      return;
    }
    const __nv_bfloat16* e = reinterpret_cast<const __nv_bfloat16*>(&v);   // a ragged end
#pragma unroll
    for (uint32_t j = 0; j < kPieceElems; ++j) {
      if (col + int32_t(j) < cols) dst[j] = e[j];
    }
  }
};

// The staged TMA store of one tile in column chunks, with BUFFERS staging tiles in
// rotation. Every thread of the role calls begin/finish around writing a chunk; one
// thread (the issuer, always the same) issues the stores, so its bulk groups retire
// in order and "at most BUFFERS-1 pending" means the buffer about to be reused is
// free. Chunk k of every tile must use buffer k % BUFFERS (tiles hold a multiple of
// BUFFERS chunks) so the rotation continues across tiles.
template <uint32_t BUFFERS>
struct StagedStore {
  uint32_t barrier;    // placed named-barrier id
  uint32_t threads;    // threads of the role
  bool issuer;

  // Before writing a staging buffer: the store that last read it has finished reading.
  __device__ __forceinline__ void begin() const {
    if (issuer) tma::store_wait_read<BUFFERS - 1>();
    named_sync(barrier, threads);
  }

  // After every thread wrote the buffer: make the writes visible to TMA and store it.
  __device__ __forceinline__ void finish(const void* map, uint32_t buffer, int32_t col,
                                         int32_t row) const {
    fence_proxy_async_smem();
    named_sync(barrier, threads);
    if (issuer) {
      tma::store_2d(map, buffer, col, row);
      tma::store_commit();
    }
  }

  // finish() for a 4-D map: the buffer is the box at {c0, c1, c2, c3}.
  __device__ __forceinline__ void finish_4d(const void* map, uint32_t buffer, int32_t c0,
                                            int32_t c1, int32_t c2, int32_t c3) const {
    fence_proxy_async_smem();
    named_sync(barrier, threads);
    if (issuer) {
      tma::store_4d(map, buffer, c0, c1, c2, c3);
      tma::store_commit();
    }
  }

  // Once, after the last tile: the stores are complete before the block may exit.
  __device__ __forceinline__ void drain() const {
    if (issuer) tma::store_wait<0>();
  }
};

// The staging of a bounded store, BUFFERS buffers in rotation, one chunk per buffer
// turn. Staging waits at one barrier per chunk before the copy; rotating buffers make
// that enough (a thread stages chunk c only after passing chunk c - 1's barrier, which
// every thread reached after copying chunk c - 2, the last user of c's buffer). One
// buffer (a tile of one 64-column chunk: O at head dim 64) also needs every copy done
// before the next chunk, or the next tile's first, is staged over it: after_copy().
template <uint32_t BUFFERS>
struct StagingTurns {
  static_assert(BUFFERS >= 1, "stage through at least one buffer: make buffers >= 1");
  __device__ static void after_copy(uint32_t barrier, uint32_t threads) {
    if constexpr (BUFFERS == 1) named_sync(barrier, threads);
  }
};

}  // namespace pl::epi
