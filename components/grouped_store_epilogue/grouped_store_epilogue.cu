// grouped_store_epilogue: fp32 accumulators -> bf16 -> swizzled shared-memory staging
// -> bounded 16-byte global stores. Runs in the warps that hold the accumulators (a
// register hand-off); every thread stages its fragment and copies its share out.
#include <type_traits>

#include "pl_grouped_store_epilogue.h"
#include "pipelink/epilogue.cuh"

using Params = pl_params_grouped_store_epilogue;
using Element = Params::dtype;

using Shape = pl::epi::StagedShape<Params::tile_m, Params::tile_n, Params::store_n,
                                   Params::buffers, Element>;

constexpr uint32_t kTileM = Params::tile_m;
constexpr uint32_t kTileN = Params::tile_n;
constexpr uint32_t kStoreN = Params::store_n;               // columns per staged chunk
constexpr uint32_t kBuffers = Params::buffers;
constexpr uint32_t kThreads = Shape::kThreads;
constexpr uint32_t kAccCount = Shape::kAccCount;
constexpr uint32_t kPieceElems = pl::epi::kChunkBytes / sizeof(Element);  // one 16-byte store
constexpr uint32_t kPiecesPerRow = kStoreN / kPieceElems;
constexpr uint32_t kPiecesPerThread = kTileM * kPiecesPerRow / kThreads;

static_assert(std::is_same_v<Element, __nv_bfloat16>, "this epilogue writes bf16: set dtype: bf16");
static_assert(kBuffers >= 2, "one barrier per chunk orders staging against copying only "
                             "with two or more rotating buffers: make buffers >= 2");
static_assert(kTileM * kPiecesPerRow % kThreads == 0, "every thread copies the same share");

// One thread's 16-byte piece of a staged chunk: 8 consecutive threads cover a row, so
// a warp writes four 128-byte row segments.
struct Piece {
  uint32_t row;     // row in the tile
  uint32_t chunk;   // 16-byte chunk of the staging row (before the swizzle)
};

__device__ __forceinline__ Piece piece_of(uint32_t thread, uint32_t i) {
  const uint32_t p = thread + i * kThreads;
  return Piece{p / kPiecesPerRow, p % kPiecesPerRow};
}

// Copies piece `pc` of a staged chunk to C[row][col..], or the part of it inside C.
__device__ __forceinline__ void store_piece(const pl_args_grouped_store_epilogue& args,
                                            uint32_t staged, int32_t row, int32_t col,
                                            bool whole_pieces) {
  const uint4 v = *pl::smem_ptr<const uint4>(staged);
  Element* dst = args.c + size_t(row) * args.cols + col;
  if (whole_pieces && col + int32_t(kPieceElems) <= int32_t(args.cols)) {
    *reinterpret_cast<uint4*>(dst) = v;
    return;
  }
  const Element* e = reinterpret_cast<const Element*>(&v);   // a ragged last piece
#pragma unroll
  for (uint32_t j = 0; j < kPieceElems; ++j) {
    if (col + int32_t(j) < int32_t(args.cols)) dst[j] = e[j];
  }
}

// Epilogue's perspective, per tile: stage a chunk, wait for the whole role, copy it
// out within the bounds. Rotating buffers make that one barrier per chunk enough: a
// thread stages chunk c only after passing chunk c-1's barrier, which every thread
// reached after copying chunk c-2, the last user of this buffer.
extern "C" __device__ void pl_grouped_store_epilogue_store(
    const pl_place_grouped_store_epilogue& at, const pl_args_grouped_store_epilogue& args,
    const pl::KernelInfo&, const pl::WorkTile& tile, pl_state_grouped_store_epilogue_store&,
    float (&acc)[kAccCount]) {
  const uint32_t thread = pl::thread_in_role(at.role.store);
  const uint32_t first_row = pl::epi::warp_row(thread);
  const int32_t row0 = tile.first_row(kTileM);
  const int32_t row_end = min(tile.m_end, int32_t(args.rows));   // this problem's rows
  const int32_t col0 = tile.n_block * int32_t(kTileN);
  const bool whole_pieces = args.cols % kPieceElems == 0;        // 16-byte aligned rows
#pragma unroll
  for (uint32_t c = 0; c < Shape::kChunks; ++c) {
    const uint32_t buffer = at.smem.staging + (c % kBuffers) * Shape::kStagingBytes;
    pl::epi::stage_chunk_bf16<Shape::kBlocksPerChunk>(buffer, first_row, c, acc);
    pl::named_sync(at.bar.staged, kThreads);
#pragma unroll
    for (uint32_t i = 0; i < kPiecesPerThread; ++i) {
      const Piece pc = piece_of(thread, i);
      const int32_t row = row0 + int32_t(pc.row);
      const int32_t col = col0 + int32_t(c * kStoreN + pc.chunk * kPieceElems);
      if (row < row_end && col < int32_t(args.cols)) {
        store_piece(args, buffer + pl::epi::sw128_offset(pc.row, pc.chunk), row, col,
                    whole_pieces);
      }
    }
  }
}
