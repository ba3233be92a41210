// Plain types of the placement ABI. Layout-stable: the glue emits aggregate
// initialisers in this field order.
#pragma once

#include <cstdint>

namespace pl {

// A TMA descriptor as the driver encodes it (CUtensorMap), opaque to device code.
// Kernel parameters hold it by value; components get a pointer to it.
// A word param (the generated params struct holds words as C strings), compared at
// compile time: `if constexpr (pl::same_word(Params::a_major, "mn"))`.
constexpr bool same_word(const char* a, const char* b) {
  while (*a != '\0' && *a == *b) {
    ++a;
    ++b;
  }
  return *a == *b;
}

// An operand's majorness param: "k" (K contiguous) or "mn" (M or N contiguous).
constexpr bool mn_major(const char* major) { return same_word(major, "mn"); }
constexpr bool known_major(const char* major) {
  return same_word(major, "k") || same_word(major, "mn");
}

struct alignas(64) TensorMap {
  uint64_t opaque[16];
};

// One smem_pipeline port as placed: a ring of `stages` buffers of `stage_bytes`
// each, with a `full` and an `empty` mbarrier per stage.
struct PipePort {
  uint32_t buffer;       // shared-memory offset of stage 0
  uint32_t stage_bytes;  // distance between stages
  uint32_t full;         // shared-memory offset of the full mbarrier array
  uint32_t empty;        // shared-memory offset of the empty mbarrier array
  uint32_t stages;
};

// One tmem port as placed: `stages` accumulator buffers in Tensor Memory, each
// `stage_columns` columns wide (all 128 lanes), with a `full` mbarrier per buffer (one
// arrival: the MMA issuer's tcgen05.commit) and an `empty` one (the readers').
struct TmemPort {
  uint32_t column;         // first column of buffer 0, from the kernel's TMEM base
  uint32_t stage_columns;  // distance between buffers
  uint32_t full;           // shared-memory offset of the full mbarrier array
  uint32_t empty;          // shared-memory offset of the empty mbarrier array
  uint32_t stages;
};

// A register hand-off needs no placement: the glue owns the array.

// A global-memory hand-off between CTAs: slots in the kernel's workspace, plus
// one release/acquire counter per slot.
struct GlobalPort {
  uint64_t slot_offset;  // byte offset of slot 0 in the workspace
  uint64_t slot_bytes;
  uint64_t counter_offset;  // byte offset of the uint32 counters in the workspace
  uint32_t slots;
};

// The unit of work every looping role of one kernel handles. A scheduler component
// produces one per work item into the kernel's work ring (the last one invalid: the end
// marker); without a scheduler the glue makes one per CTA from blockIdx. Trip counts
// travel with the work: a role that walks K iterates k_tiles() steps starting at
// k_begin, so one bind (the scheduler's) sets them all.
//
// Five record types share this layout (pipelink/work.py names them for the checker):
//   gemm_tile     rows of tile m_block are [m_block * tile_m, +tile_m); the tensor's
//                 edge bounds them (m_offset = 0, m_end = kRowsUnbounded);
//   grouped_tile  problem `group` owns rows [m_offset, m_end) of row-packed A and C;
//                 tile m_block covers m_offset + [m_block * tile_m, +tile_m), and rows
//                 from m_end on belong to the next problem: loads may read them, stores
//                 must not write them;
//   split_tile    a gemm_tile whose k-tiles may be split in k_splits pieces (split-K):
//                 piece k_split covers [k_begin, k_end), and the pieces' fp32 partial
//                 accumulators meet in the kernel's workspace (pipelink/splitk.cuh) at
//                 byte offsets the scheduler gives: `partials` (piece 1's; pieces 2,
//                 3, ... follow at the tile's accumulator size) and `flag` (piece 1's,
//                 one uint64 per piece). Piece 0 adds the others and stores the tile,
//                 so it has no slot. k_splits <= 1: a whole tile.
//   kgrouped_tile problem `group` reduces k-tiles [k_begin, k_end) of operands packed
//                 along K (A [K, M], B [K, N]: weight gradients over MoE experts);
//                 m_block and n_block index A's and B's columns with no problem offset,
//                 and the output tile is rows m_offset + [m_block * tile_m, +tile_m) of
//                 C [G*M, N], stopping at m_end (m_offset = group * M).
//   attn_tile     attention: query tile m_block of head n_block of sequence `group`,
//                 whose tokens are rows [m_offset, m_end) of Q, K, V and O (each viewed
//                 as [rows, heads, head_dim]); the tile sees key tiles [k_begin, k_end),
//                 counted from m_offset. O's tile is rows m_offset + [m_block * tile_m,
//                 +tile_m) by columns n_block * head_dim of O [rows, heads * head_dim].
struct alignas(16) WorkTile {  // 48 bytes: three 16-byte shared loads
  int32_t m_block;
  int32_t n_block;
  int32_t group;     // problem index of grouped work; 0 otherwise
  int32_t k_begin;   // first k-tile of this work item
  int32_t k_end;     // one past its last k-tile
  int32_t valid;     // 0: the end marker, no more work
  int32_t m_offset;  // first row of the work's problem (grouped work); 0 otherwise
  int32_t m_end;     // one past the problem's last row; kRowsUnbounded otherwise
  int32_t k_split;   // which piece of a split tile; 0 otherwise
  int32_t k_splits;  // pieces the tile's k-tiles are split in; 0 or 1: not split
  uint32_t partials; // workspace byte offset of piece 1's partial accumulators
  uint32_t flag;     // workspace byte offset of piece 1's flag (uint64 per piece)
  __device__ bool is_valid() const { return valid != 0; }
  __device__ bool is_split() const { return k_splits > 1; }
  __device__ uint32_t k_tiles() const { return k_end > k_begin ? uint32_t(k_end - k_begin) : 0; }
  __device__ int32_t first_row(uint32_t tile_m) const {
    return m_offset + m_block * int32_t(tile_m);
  }
};

constexpr int32_t kRowsUnbounded = 0x7fffffff;  // m_end of a gemm_tile: no problem boundary

// The placed work ring: `stages` records of sizeof(WorkTile) bytes from `records`,
// with a full and an empty mbarrier per stage (see pipelink/work.cuh).
struct WorkRing {
  uint32_t records;  // shared-memory offset of record 0
  uint32_t full;     // shared-memory offset of the full mbarrier array
  uint32_t empty;    // shared-memory offset of the empty mbarrier array
  uint32_t stages;
};

// Where a role's warps start: every warp index a component uses is relative to it.
struct RolePlace {
  uint32_t warp_base;
  uint32_t warps;
};

// Kernel-wide facts the glue passes to every role (its own warps are in RolePlace).
struct KernelInfo {
  void* workspace;       // global workspace for global hand-offs (may be null)
  uint32_t tmem_base;    // Tensor Memory address the glue allocated (sm_100a), else 0;
                         // a component's columns are tmem_base + at.tmem.<alloc>
  uint64_t launch;       // in a kernel with a workspace: nonzero and unique to each
                         // launch the runtime makes (a captured launch replays its own),
                         // so flags set to it need no zeroing before a launch
  const void* params;    // the kernel's parameter block: the glue's function forwarders
                         // read a provider's runtime arguments from it
};

}  // namespace pl
