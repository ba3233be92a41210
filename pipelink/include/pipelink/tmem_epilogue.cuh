// The per-tile walk every Tensor Memory epilogue shares (sm_100a): wait for the MMA
// warp's accumulator buffer, read it CHUNK_N columns at a time with tcgen05.ld.32x32b
// (layout "tmem_f32_m128_rows": thread t of the warpgroup holds row t), give the buffer
// back after the last chunk, and hand each chunk to the component's own math, which
// stages it for a TMA store. Split tiles meet through the workspace chunk by chunk
// (pipelink/splitk.cuh). What differs between epilogues is only that math: the store,
// SwiGLU and bias-GELU epilogues pass a `stage(buffer, row, values, chunk)` function.
// How a chunk gets from Tensor Memory into registers is a policy too (READER below):
// PipeLink's own tcgen05.ld unless the component passes another, e.g. a CuTe TMEM copy.
#pragma once

#include <cstdint>

#include "pipelink/cluster.cuh"
#include "pipelink/epilogue.cuh"
#include "pipelink/pipeline.cuh"
#include "pipelink/splitk.cuh"
#include "pipelink/tcgen05.cuh"

namespace pl::epi {

constexpr uint32_t kTmemLoadColumns = 64;   // one tcgen05.ld.32x32b.x64
constexpr uint32_t kPairLeader = 0;         // cluster rank of a CTA pair's MMA issuer

// A READER of TmemTile: how one thread gets its accumulator row into registers, 64
// columns (one kTmemLoadColumns load) at a time. Built once per tile as
// READER{buffer, thread, warp} (buffer: the TMEM address of the accumulator buffer's
// lane 0, column 0; thread: the row; warp: the role's warp, whose sub-partition holds
// the row), then read(chunk, offset, v) fills v[i] with column chunk + offset + i of the
// row (the chunk's first column and the load's offset in it, multiples of 64) and
// returns only once the load has completed (tcgen05.wait::ld): the caller uses v, and
// releases the buffer, right after. (Two addends, not their sum: the default keeps the
// address arithmetic, and so the SASS, of the walk before readers were a policy.)
//
// TmemRows, the default: tcgen05.ld.32x32b.x64 and its wait in one statement
// (tcgen05::load_row_x64).
struct TmemRows {
  uint32_t taddr;   // lane 32 (warp % 4) of the buffer: thread t of the warp reads lane + t

  __device__ __forceinline__ TmemRows(uint32_t buffer, uint32_t /*thread*/, uint32_t warp)
      : taddr(tcgen05::subpartition_lanes(buffer, warp)) {}

  __device__ __forceinline__ void operator()(uint32_t chunk, uint32_t offset,
                                             float (&v)[kTmemLoadColumns]) const {
    tcgen05::load_row_x64(taddr + chunk + offset, v);
  }
};

// For a READER whose loads do not wait (CuTe's SM100_TMEM_LOAD atoms issue the bare
// tcgen05.ld): tcgen05::wait_loaded.
using tcgen05::wait_loaded;

// CTA_GROUP 2: the buffers are a CTA pair's (a cta_group::2 MMA); the pair's leader
// reuses one once the readers of both CTAs have released it on the leader's barrier.
// READER: how the chunks reach registers (above; TmemRows unless the component says).
template <uint32_t TILE_M, uint32_t TILE_N, uint32_t CHUNK_N, uint32_t BUFFERS,
          uint32_t STAGING_BYTES, uint32_t CTA_GROUP = 1, class READER = TmemRows>
struct TmemTile {
  static constexpr uint32_t kThreads = TILE_M;               // one accumulator row each
  static constexpr uint32_t kChunks = TILE_N / CHUNK_N;
  static constexpr uint32_t kLoads = CHUNK_N / kTmemLoadColumns;
  using Pieces = splitk::Pieces<TILE_N, kThreads>;

  static_assert(TILE_M == tcgen05::kFullM,
                "one warpgroup reads the 128 lanes of an M = 128 accumulator: tile_m is 128");
  static_assert(CHUNK_N % kTmemLoadColumns == 0 && TILE_N % CHUNK_N == 0,
                "chunks are whole 64-column loads and tile the accumulator");
  static_assert(CTA_GROUP == 1 || CTA_GROUP == 2, "cta_group is 1 or 2");
  static_assert(kChunks % BUFFERS == 0,
                "staging buffers rotate per chunk across tiles: make the chunks per tile a "
                "multiple of buffers");

  const TmemPort& port;
  PipeState& state;
  const KernelInfo& k;
  const WorkTile& tile;
  uint32_t thread;        // in the role: the accumulator row this thread reads
  uint32_t warp;          // in the (warpgroup-aligned) role: its TMEM sub-partition
  uint32_t barrier;       // the role's named barrier
  uint32_t staging;       // shared-memory offset of the BUFFERS staging tiles

  // Hands the buffer back to the MMA warp (the pair leader's, for a CTA pair's).
  __device__ __forceinline__ void release() const {
    tcgen05::fence_before_thread_sync();
    if constexpr (CTA_GROUP == 1) {
      consumer_release(port, state);
    } else {
      cluster::arrive_peer(empty_barrier(port, state), kPairLeader);
    }
  }

  // The usual `store`: the issuing thread stores chunk c of the tile whose top-left
  // element is Y[row][col] with a TMA store of STEP columns per chunk.
  template <uint32_t STEP>
  __device__ __forceinline__ auto tma_store(const void* map, int32_t col, int32_t row) const {
    const bool issuer = thread == 0;
    return [=](uint32_t buffer, uint32_t c) {
      if (!issuer) return;
      tma::store_2d(map, buffer, col + int32_t(c * STEP), row);
      tma::store_commit();
    };
  }

  // Chunk c of this thread's row; zeros for a tile with no k-tiles, whose buffer the
  // MMA warp left untouched.
  __device__ __forceinline__ void load(const READER& read, uint32_t c, bool empty,
                                       float (&v)[CHUNK_N]) const {
#pragma unroll
    for (uint32_t l = 0; l < kLoads; ++l) {
      float (&part)[kTmemLoadColumns] =
          *reinterpret_cast<float (*)[kTmemLoadColumns]>(v + l * kTmemLoadColumns);
      if (empty) {
#pragma unroll
        for (uint32_t i = 0; i < kTmemLoadColumns; ++i) part[i] = 0.0f;
      } else {
        read(c * CHUNK_N, l * kTmemLoadColumns, part);
      }
    }
  }

  // The tile: `stage(buffer, row, values, chunk)` writes one chunk of this thread's row
  // into a staging tile; once the whole role has, every thread calls `store(buffer,
  // chunk)` (tma_store below, or a copy every thread takes part in).
  template <class Stage, class Store>
  __device__ __forceinline__ void run(Stage&& stage, Store&& store) const {
    const Pieces pieces{tile, k, thread, barrier};
    const bool empty = tile.k_tiles() == 0;
    consumer_wait(port, state);
    tcgen05::fence_after_thread_sync();
    const READER read{k.tmem_base + stage_column(port, state), thread, warp};
    const StagedStore<BUFFERS> out{barrier, kThreads, thread == 0};
    if (pieces.split() && pieces.stores()) pieces.acquire();
#pragma unroll
    for (uint32_t c = 0; c < kChunks; ++c) {
      float v[CHUNK_N];
      load(read, c, empty, v);
      if (c + 1 == kChunks) release();   // the buffer is in registers: reusable
      if (!pieces.stores()) {
        pieces.store(c, v);
        continue;
      }
      if (pieces.split()) pieces.add(c, v);   // piece 0: the others' partials first
      const uint32_t buffer = staging + (c % BUFFERS) * STAGING_BYTES;
      out.begin();
      stage(buffer, thread, v, c);
      fence_proxy_async_smem();
      named_sync(barrier, kThreads);
      store(buffer, c);
    }
    if (!pieces.stores()) pieces.publish();
    state.advance(port);
  }
};

// Layout "tmem_f32_m128_rows" over a GEMM whose columns interleave gate and up in
// blocks of 8 (components/swiglu_epilogue): a thread's row chunk v of 2 STORE_N columns
// holds gate columns 16q .. 16q + 7 and up columns 16q + 8 .. 16q + 15 for outputs
// 8q .. 8q + 7. Computes silu(gate) * up in fp32 and writes the STORE_N outputs as bf16,
// one 16-byte piece per block, into row `row` of the swizzled staging tile at `buffer`.
template <uint32_t STORE_N>
__device__ __forceinline__ void stage_swiglu_row(uint32_t buffer, uint32_t row,
                                                 const float (&v)[2 * STORE_N]) {
  constexpr uint32_t kBlock = 8;                    // the interleave's block of rows
  constexpr uint32_t kPieces = STORE_N / kBlock;    // 16-byte pieces per staging row
  static_assert(kBlock * sizeof(__nv_bfloat16) == kChunkBytes,
                "one interleave block of outputs is one 16-byte staging piece");
#pragma unroll
  for (uint32_t q = 0; q < kPieces; ++q) {
    const float* gate = v + 2 * kBlock * q;
    const float* up = gate + kBlock;
    uint32_t packed[kBlock / 2];
#pragma unroll
    for (uint32_t i = 0; i < kBlock / 2; ++i) {
      packed[i] = pack_bf16x2(swiglu(gate[2 * i], up[2 * i]),
                              swiglu(gate[2 * i + 1], up[2 * i + 1]));
    }
    st_shared_v4(buffer + sw128_offset(row, q), packed[0], packed[1], packed[2], packed[3]);
  }
}

}  // namespace pl::epi
