// row_reduce: one consumer warpgroup summing rows of row-major tiles. Thread t of the
// role owns row t of every tile and accumulates its eight column groups into the acc
// register port, which an epilogue in the same warps reads next.
#include <type_traits>

#include "pl_row_reduce.h"

using Params = pl_params_row_reduce;
using Element = Params::dtype;

constexpr uint32_t kRows = Params::rows;
constexpr uint32_t kCols = Params::cols;
constexpr uint32_t kGroups = 8;  // the acc port's layout, row_per_thread_8
constexpr uint32_t kGroupCols = kCols / kGroups;
constexpr uint32_t kChunkBytes = 16;  // one 128-bit shared-memory load
constexpr uint32_t kChunkElems = kChunkBytes / sizeof(Element);
constexpr uint32_t kGroupChunks = kGroupCols / kChunkElems;
constexpr uint32_t kRowChunks = kGroups * kGroupChunks;

static_assert(kRows % pl::kWarpThreads == 0,
              "one thread per row and whole warps: make rows a multiple of 32");
static_assert(kCols % kGroups == 0,
              "acc splits a row into 8 column groups: make cols a multiple of 8");
static_assert(std::is_same_v<Element, float> || std::is_same_v<Element, __nv_bfloat16>,
              "row_reduce reads f32 or bf16 tiles: set dtype to one of them");
static_assert(kGroupCols % kChunkElems == 0,
              "a column group must be whole 16-byte chunks: make cols a multiple of "
              "8 * 16 / sizeof(dtype) (64 for bf16, 32 for f32)");

// kChunkElems consecutive elements of one row, read with one 128-bit load.
using Chunk = uint4;
constexpr uint32_t kChunkWords = sizeof(Chunk) / sizeof(uint32_t);
constexpr uint32_t kBf16Shift = 16;  // a bf16 is the high half of the f32 it widens to
constexpr uint32_t kHighHalf = 0xffff0000u;

// The sum of the elements packed in one 32-bit word, in f32.
__device__ __forceinline__ float word_sum(uint32_t word) {
  if constexpr (std::is_same_v<Element, float>) {
    return __uint_as_float(word);
  } else {
    return __uint_as_float(word << kBf16Shift) + __uint_as_float(word & kHighHalf);
  }
}

__device__ __forceinline__ float chunk_sum(const Chunk& c) {
  const uint32_t words[kChunkWords] = {c.x, c.y, c.z, c.w};
  float sum = 0.0f;
#pragma unroll
  for (uint32_t w = 0; w < kChunkWords; ++w) sum += word_sum(words[w]);
  return sum;
}

// This thread's row of the stage the pipeline state points at.
__device__ __forceinline__ const Chunk* stage_row(const pl::PipePort& port,
                                                  const pl::PipeState& s, uint32_t row) {
  return pl::smem_ptr<const Chunk>(pl::stage_offset(port, s)) + row * kRowChunks;
}

// Consumer's perspective: per tile, wait until it is full, sum this thread's row into
// its column groups, and release the stage (every thread arrives: arrivals = rows).
extern "C" __device__ void pl_row_reduce_reduce(const pl_place_row_reduce& at,
                                                const pl_args_row_reduce& args,
                                                const pl::KernelInfo&, const pl::WorkTile&,
                                                pl_state_row_reduce_reduce& st,
                                                float (&acc)[kGroups]) {
  const uint32_t row = pl::thread_in_role(at.role.reduce);
  // The tile is not swizzled: with 128-byte rows every row starts in bank 0. Thread t
  // visits column group (i + t) mod 8 at step i, which spreads the eight threads of one
  // 128-bit load phase over the banks (conflict-free for 64 bf16 columns).
  // rotated[i] keeps register indices compile-time.
  const uint32_t rotation = row % kGroups;
  float rotated[kGroups] = {};  // (kGroups): rotated[i] sums group (i + rotation) % kGroups
  for (uint32_t k = 0; k < args.k_tiles; ++k) {
    pl::consumer_wait(at.port.x, st.x);
    const Chunk* chunks = stage_row(at.port.x, st.x, row);
#pragma unroll
    for (uint32_t i = 0; i < kGroups; ++i) {
      const uint32_t group = (i + rotation) % kGroups;
#pragma unroll
      for (uint32_t c = 0; c < kGroupChunks; ++c) {
        rotated[i] += chunk_sum(chunks[group * kGroupChunks + c]);
      }
    }
    // The producer's TMA (async proxy) overwrites the stage next: order the reads first.
    pl::fence_proxy_async_smem();
    pl::consumer_release(at.port.x, st.x);
    st.x.advance(at.port.x);
  }
  // Undo the rotation with selects, so acc and rotated stay in registers.
#pragma unroll
  for (uint32_t j = 0; j < kGroups; ++j) {
    float sum = 0.0f;
#pragma unroll
    for (uint32_t i = 0; i < kGroups; ++i) {
      sum = (i + rotation) % kGroups == j ? rotated[i] : sum;
    }
    acc[j] = sum;
  }
}
