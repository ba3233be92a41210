// Attention: the types of the attn_mask and attn_score function interfaces
// (pipelink/interfaces.py lists their functions), and the online-softmax arithmetic
// an attention core shares with its tests' expectations.
#pragma once

#include <cstdint>

#include "pipelink/epilogue.cuh"
#include "pipelink/tma.cuh"
#include "pipelink/types.cuh"

namespace pl::attn {

// A half-open range of positions (or of tiles): [begin, end); empty when begin >= end.
struct Span {
  int32_t begin;
  int32_t end;
  __device__ bool empty() const { return begin >= end; }
};

// The key tile a record's step reads, and whether it is known to be fully visible
// (full != 0: the core skips the per-element mask; 0: the mask decides, per tile and
// per element).
struct KvTile {
  int32_t index;
  int32_t full;
};

// The tiles of `tile` positions that cover span `s`.
__device__ __forceinline__ Span tiles_of(Span s, int32_t tile) {
  if (s.empty()) return Span{0, 0};
  return Span{s.begin / tile, (s.end + tile - 1) / tile};
}

// Where record r of an attention schedule goes (longest-processing-time first, L2
// aware): the (sequence, head) pairs are cut into sections of `section` pairs whose K
// and V fit in L2 together; a section's records run query tile by query tile from the
// last (under a causal mask, the costliest) to the first, its pairs inner. So the CTAs
// at work at any moment share a few heads' K and V in L2 instead of streaming one
// head each from HBM.
struct TileOrder {
  int32_t m_block;
  uint32_t pair;      // sequence * heads + head
};

__device__ __forceinline__ TileOrder lpt_order(uint32_t r, uint32_t m_tiles, uint32_t pairs,
                                               uint32_t section) {
  section = max(section, 1u);
  const uint32_t per_section = m_tiles * section;
  const uint32_t first_pair = r / per_section * section;
  const uint32_t pairs_here = min(section, pairs - first_pair);   // the last may be short
  const uint32_t local = r - first_pair * m_tiles;
  return TileOrder{int32_t(m_tiles - 1 - local / pairs_here), first_pair + local % pairs_here};
}

// Step `step` of a backward record, which walks one key tile's queries: its query
// head and query tile. The record's steps run the `group` query heads that share the
// key tile's K/V head one after another, each over the query tiles [k_begin, k_begin +
// tiles), tiles = (k_end - k_begin) / group (pl::attn::query_steps builds such a range).
struct QueryStep {
  int32_t head;
  int32_t q_tile;
};

__device__ __forceinline__ QueryStep query_step(const WorkTile& tile, int32_t step,
                                                uint32_t group) {
  const int32_t tiles = (tile.k_end - tile.k_begin) / int32_t(group);
  const int32_t local = step - tile.k_begin;
  return QueryStep{tile.n_block * int32_t(group) + local / tiles, tile.k_begin + local % tiles};
}

// The steps of a backward record in query_step's order, one after the other without its
// division per step: the next query tile of the head, or the next head's first.
struct QueryWalk {
  int32_t first_tile;
  int32_t end_tile;
  __device__ QueryStep next(QueryStep qs) const {
    return qs.q_tile + 1 < end_tile ? QueryStep{qs.head, qs.q_tile + 1}
                                    : QueryStep{qs.head + 1, first_tile};
  }
};

__device__ __forceinline__ QueryWalk query_walk(const WorkTile& tile, uint32_t group) {
  return QueryWalk{tile.k_begin, tile.k_begin + (tile.k_end - tile.k_begin) / int32_t(group)};
}

// The step range of a backward record whose query tiles are `q_tiles`, for `group`
// query heads per K/V head.
__device__ __forceinline__ Span query_steps(Span q_tiles, uint32_t group) {
  if (q_tiles.empty()) return Span{0, 0};
  return Span{q_tiles.begin, q_tiles.begin + (q_tiles.end - q_tiles.begin) * int32_t(group)};
}

// The row of a FlexAttention BlockMask tensor [MB, MH, blocks] for block `block` of
// (sequence, head): a mask built for one sequence or one head (MB or MH of 1) serves
// all of them. MB is 1 or B and MH 1 or H (the recipes' require), so a select stands in
// for the remainder, which costs the backward's register-bound loop a division.
__device__ __forceinline__ uint32_t block_mask_row(uint32_t sequence, uint32_t head,
                                                   uint32_t block, uint32_t mask_batch,
                                                   uint32_t mask_heads, uint32_t blocks) {
  const uint32_t b = mask_batch == 1 ? 0u : sequence;
  const uint32_t h = mask_heads == 1 ? 0u : head;
  return (b * mask_heads + h) * blocks + block;
}

// Where the forward keeps a query's log-sum-exp: element first_row * lse_rows + head *
// lse_heads + q for query q of the sequence that starts at row first_row of Q: [B, H, S]
// with lse_rows = H, lse_heads = S; [H, rows] (documents) with lse_rows = 1, lse_heads =
// rows. (The callers widen first_row and head as their types ask.)
__device__ __forceinline__ size_t lse_index(size_t first_row, size_t head, uint32_t lse_rows,
                                            uint32_t lse_heads, uint32_t q) {
  return first_row * lse_rows + head * lse_heads + q;
}

// Deterministic dQ in an attention backward: the dQ partial sums of one (query head,
// query tile) are added in key-tile order, counted in dq_turns [heads, turns_per_head]
// (one counter per query tile of the packed rows, a sequence's first on a counter of its
// own). The counter of step `qs` of `tile`, for query tiles of TILE_Q rows:
template <uint32_t TILE_Q>
__device__ __forceinline__ uint32_t* dq_turn(int32_t* dq_turns, uint32_t turns_per_head,
                                             const WorkTile& tile, QueryStep qs) {
  return reinterpret_cast<uint32_t*>(dq_turns) + size_t(qs.head) * turns_per_head +
         uint32_t(tile.m_offset) / TILE_Q + uint32_t(tile.group) + uint32_t(qs.q_tile);
}

// The key tiles (of `tile_n` keys) before key tile `key_tile` that add to a query tile
// whose keys are `keys` (the mask's kv_range) in a sequence of `len` tokens: the turns
// to wait for, one per key tile. (The mask's kv_range must agree with its q_range at
// tile granularity: the shipped masks do.)
__device__ __forceinline__ uint32_t key_tiles_before(Span keys, int32_t len, int32_t key_tile,
                                                     int32_t tile_n) {
  const int32_t first = tiles_of(Span{max(keys.begin, 0), min(keys.end, len)}, tile_n).begin;
  return uint32_t(max(key_tile - first, 0));
}

// The per-query statistics of an attention backward, as its prep phase writes them:
// [heads, kStatsRows, rows] fp32, row kLseRow the forward's log-sum-exp in base 2
// (log2(e) LSE; +inf where the query saw no key, so its P is 0) and row kDeltaRow
// delta = rowsum(dO o O), both indexed by the query's row of Q (sequences or documents
// back to back), so a step's statistics are two contiguous runs of tile_q floats.
constexpr uint32_t kStatsRows = 2;
constexpr uint32_t kLseRow = 0;
constexpr uint32_t kDeltaRow = 1;

__device__ __forceinline__ size_t stats_index(uint32_t head, uint32_t row_kind, uint32_t rows,
                                              int32_t row) {
  return (size_t(head) * kStatsRows + row_kind) * rows + uint32_t(row);
}

// Where this thread's accumulator elements sit in a 64-row warpgroup slice (the layout
// pipelink/epilogue.cuh names wgmma_f32_m64nN_wg_rows): a quad of threads holds one row
// pair, each thread two adjacent columns of every 8-column block; element i is at row
// row0 + kHalfRows ((i / 2) % 2), column col0 + kBlockCols (i / kFloatsPerBlock) + i % 2.
struct Fragment {
  static constexpr uint32_t kThreadsPerRow = 4;       // a quad
  static constexpr uint32_t kColumnsPerThread = 2;    // per 8-column block
  static constexpr uint32_t kRowHalves = 2;           // rows a thread holds, 8 apart
  int32_t row0;
  int32_t col0;
  __device__ static int32_t row_half(uint32_t i) {
    return int32_t((i / kColumnsPerThread) % kRowHalves);
  }
  __device__ static int32_t column(uint32_t i) {
    return int32_t(epi::kBlockCols * (i / epi::kFloatsPerBlock) + i % kColumnsPerThread);
  }
  __device__ int32_t row(uint32_t half) const {
    return row0 + int32_t(epi::kHalfRows * half);
  }
};

__device__ __forceinline__ Fragment fragment_of(uint32_t thread_in_warpgroup) {
  const uint32_t lane = thread_in_warpgroup % kWarpThreads;
  return Fragment{int32_t(epi::warp_row(thread_in_warpgroup) + lane / Fragment::kThreadsPerRow),
                  int32_t(Fragment::kColumnsPerThread * (lane % Fragment::kThreadsPerRow))};
}

// A fp32 fragment rounded to bf16 as the register A operand of the next wgmma: K step
// j is the accumulator's columns [16j, 16j + 16), packed in pairs (what
// pl::wgmma::mma_bf16_rs takes).
template <uint32_t kFloats, uint32_t kSteps>
__device__ __forceinline__ void pack_a_operand(const float (&acc)[kFloats],
                                               uint32_t (&a)[kSteps][4]) {
  constexpr uint32_t kFloatsPerStep = kFloats / kSteps;
#pragma unroll
  for (uint32_t j = 0; j < kSteps; ++j) {
#pragma unroll
    for (uint32_t r = 0; r < 4; ++r) {
      const uint32_t pair = kFloatsPerStep * j + Fragment::kColumnsPerThread * r;
      a[j][r] = epi::pack_bf16x2(acc[pair], acc[pair + 1]);
    }
  }
}

// Record r of a schedule over B sequences of `seq` tokens and `heads` heads, in
// lpt_order: its query tile and (sequence, head); valid is false past the last record.
struct DenseTile {
  int32_t m_block;
  int32_t sequence;
  int32_t head;
  bool valid;
};

__device__ __forceinline__ DenseTile dense_tile(uint32_t r, uint32_t seq, uint32_t tile_m,
                                                uint32_t batch, uint32_t heads,
                                                uint32_t section) {
  const uint32_t m_tiles = (seq + tile_m - 1) / tile_m;
  const uint32_t pairs = batch * heads;                   // (sequence, head) pairs
  if (r >= m_tiles * pairs) return DenseTile{0, 0, 0, false};
  const TileOrder at = lpt_order(r, m_tiles, pairs, section);
  return DenseTile{at.m_block, int32_t(at.pair / heads), int32_t(at.pair % heads), true};
}

// A head tile's box: one 128-byte swizzled row (the maps' SWIZZLE_128B) of bf16 columns.
constexpr uint32_t kHeadBoxBytesPerRow = 128;
constexpr int32_t kHeadBoxColumns = int32_t(kHeadBoxBytesPerRow / sizeof(__nv_bfloat16));

// A tile of kRows rows of `head` from `row` of a [rows, heads, head_dim] bf16 tensor,
// loaded by TMA as kBoxes boxes of 64 columns side by side (each kRows x 128 bytes,
// 128-byte swizzled): K-major for QK^T, MN-major (N = head_dim) for P V.
template <uint32_t kRows, uint32_t kBoxes>
__device__ __forceinline__ void load_head_tile(uint32_t stage, const void* map, uint32_t full,
                                               int32_t head, int32_t row) {
#pragma unroll
  for (uint32_t b = 0; b < kBoxes; ++b) {
    tma::load_3d(stage + b * kRows * kHeadBoxBytesPerRow, map, full,
                 int32_t(b) * kHeadBoxColumns, head, row);
  }
}

// The same tile's boxes into L2 only (pl::tma::prefetch_3d).
template <uint32_t kBoxes>
__device__ __forceinline__ void prefetch_head_tile(const void* map, int32_t head, int32_t row) {
#pragma unroll
  for (uint32_t b = 0; b < kBoxes; ++b) {
    tma::prefetch_3d(map, int32_t(b) * kHeadBoxColumns, head, row);
  }
}

// A varlen scheduler's place in its documents: the document holding its last record,
// that document's first record and its rows. Where documents lie comes from an
// attn_documents function (`end_of(b, begin)`: where document b, begun at row `begin`,
// ends; offsets or ids, clamped there to [begin, rows]). Record numbers only grow per
// block, so the cursor only moves forward: finding a record's document is O(1)
// amortised. It stops after `documents` documents or at the first that begins at the
// last row (every later one would be empty).
struct DocumentCursor {
  uint32_t document;
  uint32_t first_record;
  int32_t row_begin;
  int32_t row_end;

  template <class FirstOf, class EndOf>
  __device__ void start(uint32_t documents, FirstOf first_of, EndOf end_of) {
    const int32_t first = documents > 0 ? first_of() : 0;
    *this = DocumentCursor{0, 0, first, documents > 0 ? end_of(0u, first) : first};
  }
  // Moves to the document of record r, each document having records_of(length) of them;
  // false past the last document.
  template <class RecordsOf, class EndOf>
  __device__ bool seek(uint32_t r, uint32_t documents, int32_t rows, RecordsOf records_of,
                       EndOf end_of) {
    while (r >= first_record + records_of(row_end - row_begin)) {
      if (document + 1 >= documents || row_end >= rows) return false;
      first_record += records_of(row_end - row_begin);
      row_begin = row_end;
      row_end = end_of(++document, row_begin);
    }
    return true;
  }
};

// The record a block takes next: its own block index first, then the next unclaimed
// one from a global counter (a workspace counter the runtime zeroes before each launch),
// so a block that drew long tiles simply takes fewer: static striding over tiles of
// uneven length (causal masks) leaves some blocks working long after the rest.
__device__ __forceinline__ uint32_t next_record(uint32_t counter_offset,
                                                const pl::KernelInfo& k, uint32_t iteration) {
  if (iteration == 0) return blockIdx.x;
  auto* counter = reinterpret_cast<uint32_t*>(static_cast<unsigned char*>(k.workspace) +
                                              counter_offset);
  return gridDim.x + atomicAdd(counter, 1u);
}

constexpr float kLog2e = 1.4426950408889634f;   // softmax runs in base 2: exp(x) = 2^(x log2 e)
constexpr float kLn2 = 0.6931471805599453f;

// 1 / sqrt(x) at compile time (Newton's iteration from 1 / x, which converges for
// x >= 1): the default softmax scale of a head dimension.
constexpr float rsqrt_constexpr(float x) {
  float y = 1.0f / x;
  for (int i = 0; i < 64; ++i) y = y * (1.5f - 0.5f * x * y * y);
  return y;
}

// 2^x on the SFU (one MUFU.EX2; -inf gives 0): the exponential of online softmax.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The max and the sum over the four threads of a quad: they hold one accumulator row.
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

}  // namespace pl::attn
