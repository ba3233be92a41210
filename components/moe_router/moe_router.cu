// moe_router: logits on the tensor cores, softmax and top-k in registers.
//
// The CTA routes kBlockTokens tokens at a time (one m16 tile per warp) against all E
// <= max_experts experts (kNTiles n8 tiles), walking H in chunks of kChunkK columns.
// Each chunk of the block's X rows and of Wr's rows lands in one of kStages shared-
// memory stages by cp.async (16-byte pieces; pieces past T, E or H are filled with
// zeros), so the CTA keeps kStages - 1 chunks in flight while its warps multiply the
// current one. A stage row is 128 bytes, its pieces swizzled (piece ^ row % 8) so the
// eight rows an ldmatrix phase reads fall in distinct banks. In the mma accumulator,
// row r of the m tile lives in the four lanes of quad r % 8 (lane 4 g + t holds rows g
// and g + 8, columns 8 j + 2 t and 8 j + 2 t + 1 of n tile j), so a row's softmax and
// top-k reduce over a quad with two shuffles per step.
#include <cuda_bf16.h>

#include "pl_moe_router.h"

using Params = pl_params_moe_router;

constexpr uint32_t kMmaM = 16, kMmaN = 8, kMmaK = 16;   // mma.sync m16n8k16
constexpr uint32_t kNTiles = Params::max_experts / kMmaN;
constexpr uint32_t kThreads = Params::warps * pl::kWarpThreads;
constexpr uint32_t kBlockTokens = Params::warps * kMmaM;   // tokens a CTA routes at a time
constexpr uint32_t kStages = Params::stages;
constexpr uint32_t kPieceBytes = pl::cp_async::kPieceBytes;   // one ldmatrix row
constexpr uint32_t kPieceElems = kPieceBytes / sizeof(__nv_bfloat16);
constexpr uint32_t kRowBytes = 128;                     // a stage row: kChunkK columns
constexpr uint32_t kPieces = kRowBytes / kPieceBytes;
constexpr uint32_t kChunkK = kRowBytes / sizeof(__nv_bfloat16);
constexpr uint32_t kPairRows = 2 * kMmaN;               // experts one ldmatrix.x4 covers
constexpr uint32_t kStageBytes = (kBlockTokens + Params::max_experts) * kRowBytes;
constexpr uint32_t kQuad = 4;                           // lanes that share a row
constexpr uint32_t kHalves = 2;                         // rows g and g + 8 of a lane
constexpr uint32_t kHalfRows = kMmaM / kHalves;
constexpr uint32_t kPairs = kNTiles;                    // column pairs a lane holds per row
constexpr float kTaken = -1.0f;                         // below any probability
static_assert(Params::max_experts % kPairRows == 0,
              "experts load in pairs of n8 tiles: make max_experts a multiple of 16");
static_assert(kStages >= 2, "a stage in flight beside the one in use: stages >= 2");

// Byte offset of 16-byte piece `piece` of stage row `row` (the swizzle above).
__device__ __forceinline__ uint32_t swizzled(uint32_t row, uint32_t piece) {
  return row * kRowBytes + ((piece ^ (row % kPieces)) * kPieceBytes);
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// `count` rows of `m` ([rows, cols] row-major) from row `first`, columns [k, k +
// kChunkK), into the stage rows at `stage`, every thread of the role a share.
__device__ __forceinline__ void load_rows(uint32_t stage, const __nv_bfloat16* m, uint32_t rows,
                                          uint32_t cols, uint32_t first, uint32_t count,
                                          uint32_t k, uint32_t thread) {
  for (uint32_t i = thread; i < count * kPieces; i += kThreads) {
    const uint32_t row = i / kPieces, piece = i % kPieces;
    const uint32_t r = first + row, col = k + piece * kPieceElems;
    const bool inside = r < rows && col < cols;   // H % 8 == 0: a piece is in or out whole
    const __nv_bfloat16* src = inside ? m + size_t(r) * cols + col : m;
    pl::cp_async::copy16(stage + swizzled(row, piece), src, inside ? kPieceBytes : 0);
  }
}

// Chunk `chunk` of the block's X rows and of Wr into `stage`: one cp.async group.
__device__ __forceinline__ void load_chunk(uint32_t stage, const pl_args_moe_router& args,
                                           uint32_t first, uint32_t chunk, uint32_t thread) {
  const uint32_t k = chunk * kChunkK;
  const uint32_t expert_rows = (args.experts + kPairRows - 1) / kPairRows * kPairRows;
  load_rows(stage, args.x, args.tokens, args.hidden, first, kBlockTokens, k, thread);
  load_rows(stage + kBlockTokens * kRowBytes, args.weight, args.experts, args.hidden, 0,
            expert_rows, k, thread);
}

// acc[j] += this warp's m tile of the stage's X rows times n tile j of its Wr rows,
// over the stage's kChunkK columns. ldmatrix.x4 lane l addresses: for A, row l % 16 and
// k piece l / 16 (a0..a3: rows g / g + 8, k low / high); for B, expert 8 (l / 16) + l % 8
// and k piece (l / 8) % 2 (b0, b1 of n tile 2p, then of 2p + 1).
__device__ __forceinline__ void multiply_chunk(float (&acc)[kNTiles][4], uint32_t stage,
                                               uint32_t warp, uint32_t experts) {
  const uint32_t l = pl::lane();
  const uint32_t a_row = warp * kMmaM + l % kMmaM;
  const uint32_t b_row = kBlockTokens + (l / kPairRows) * kMmaN + l % kMmaN;
#pragma unroll
  for (uint32_t kk = 0; kk < kChunkK / kMmaK; ++kk) {
    const uint32_t piece = kk * (kMmaK / kPieceElems);
    uint32_t a[4];
    ldmatrix_x4(a, stage + swizzled(a_row, piece + l / kMmaM));
#pragma unroll
    for (uint32_t p = 0; p < kNTiles / 2; ++p) {
      if (p * kPairRows >= experts) break;
      uint32_t b[4];
      ldmatrix_x4(b, stage + swizzled(b_row + p * kPairRows, piece + (l / kMmaN) % 2));
      mma_bf16(acc[2 * p], a, b[0], b[1]);
      mma_bf16(acc[2 * p + 1], a, b[2], b[3]);   // zeros past E: its columns are masked
    }
  }
}

// logits[j]: the accumulators of n tile j for this warp's 16 tokens of the block at
// `first`, the chunks streamed through the kStages stages.
__device__ __forceinline__ void logits(float (&acc)[kNTiles][4], const pl_args_moe_router& args,
                                       uint32_t stages, uint32_t first, uint32_t thread,
                                       uint32_t warp, uint32_t barrier) {
  const uint32_t chunks = (args.hidden + kChunkK - 1) / kChunkK;
#pragma unroll
  for (uint32_t s = 0; s + 1 < kStages; ++s) {   // one group per stage, even if empty
    if (s < chunks) load_chunk(stages + s * kStageBytes, args, first, s, thread);
    pl::cp_async::commit();
  }
  for (uint32_t c = 0; c < chunks; ++c) {
    pl::cp_async::wait<kStages - 2>();           // this thread's pieces of chunk c landed
    pl::named_sync(barrier, kThreads);           // everyone's; and chunk c - 1 is done
    const uint32_t next = c + kStages - 1;       // into the stage chunk c - 1 used
    if (next < chunks) load_chunk(stages + next % kStages * kStageBytes, args, first, next, thread);
    pl::cp_async::commit();
    multiply_chunk(acc, stages + c % kStages * kStageBytes, warp, args.experts);
  }
  pl::named_sync(barrier, kThreads);             // the stages are free for the next block
}

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(~0u, v, 1));
  return fmaxf(v, __shfl_xor_sync(~0u, v, 2));
}

__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(~0u, v, 1);
  return v + __shfl_xor_sync(~0u, v, 2);
}

// The better of two (probability, expert) candidates: higher probability, then the
// lower expert id.
__device__ __forceinline__ void keep_better(float& p, uint32_t& e, float other_p,
                                            uint32_t other_e) {
  if (other_p > p || (other_p == p && other_e < e)) {
    p = other_p;
    e = other_e;
  }
}

// One row (token) held by a quad: `v` is this lane's kPairs column pairs of logits.
// Turns them into probabilities, writes probs, picks the top k and writes them.
__device__ __forceinline__ void route_row(float2 (&v)[kPairs], const pl_args_moe_router& args,
                                          uint32_t token) {
  const uint32_t t = pl::lane() % kQuad;
  float most = -INFINITY;
#pragma unroll
  for (uint32_t j = 0; j < kPairs; ++j) {
    const uint32_t col = j * kMmaN + 2 * t;
    if (col >= args.experts) v[j].x = -INFINITY;
    if (col + 1 >= args.experts) v[j].y = -INFINITY;
    most = fmaxf(most, fmaxf(v[j].x, v[j].y));
  }
  most = quad_max(most);
  float sum = 0.0f;
#pragma unroll
  for (uint32_t j = 0; j < kPairs; ++j) {
    v[j] = make_float2(__expf(v[j].x - most), __expf(v[j].y - most));
    sum += v[j].x + v[j].y;
  }
  const float scale = 1.0f / quad_sum(sum);
  const bool real = token < args.tokens;
#pragma unroll
  for (uint32_t j = 0; j < kPairs; ++j) {
    const uint32_t col = j * kMmaN + 2 * t;
    v[j] = make_float2(col < args.experts ? v[j].x * scale : kTaken,
                       col + 1 < args.experts ? v[j].y * scale : kTaken);
    float* row = args.probs + size_t(token) * args.experts;
    if (real && col < args.experts) row[col] = v[j].x;
    if (real && col + 1 < args.experts) row[col + 1] = v[j].y;
  }
  float chosen[Params::max_top_k];
  uint32_t ids[Params::max_top_k];
  float total = 0.0f;
#pragma unroll
  for (uint32_t r = 0; r < Params::max_top_k; ++r) {
    if (r >= args.top_k) break;
    float p = kTaken;
    uint32_t e = ~0u;
#pragma unroll
    for (uint32_t j = 0; j < kPairs; ++j) {
      keep_better(p, e, v[j].x, j * kMmaN + 2 * t);
      keep_better(p, e, v[j].y, j * kMmaN + 2 * t + 1);
    }
#pragma unroll
    for (uint32_t step = 1; step < kQuad; step *= 2) {
      keep_better(p, e, __shfl_xor_sync(~0u, p, step), __shfl_xor_sync(~0u, e, step));
    }
#pragma unroll
    for (uint32_t j = 0; j < kPairs; ++j) {   // the owner strikes it out
      if (j * kMmaN + 2 * t == e) v[j].x = kTaken;
      if (j * kMmaN + 2 * t + 1 == e) v[j].y = kTaken;
    }
    chosen[r] = p;
    ids[r] = e;
    total += p;
  }
  if (!real || t != 0) return;
  const float norm = args.renormalize ? 1.0f / total : 1.0f;
#pragma unroll
  for (uint32_t r = 0; r < Params::max_top_k; ++r) {
    if (r >= args.top_k) break;
    args.topk_ids[size_t(token) * args.top_k + r] = int32_t(ids[r]);
    args.topk_w[size_t(token) * args.top_k + r] = chosen[r] * norm;
  }
}

// Every CTA's perspective, once per launch: its blocks of kBlockTokens tokens.
extern "C" __device__ void pl_moe_router_route(const pl_place_moe_router& at,
                                               const pl_args_moe_router& args,
                                               const pl::KernelInfo&, const pl::WorkTile&,
                                               pl_state_moe_router_route&) {
  const uint32_t thread = pl::thread_in_role(at.role.route);
  const uint32_t warp = pl::warp_in_role(at.role.route);
  const uint32_t g = pl::lane() / kQuad;
  const uint32_t stages = pl::smem_addr(at.smem.stages);
  for (uint32_t first = blockIdx.x * kBlockTokens; first < args.tokens;
       first += gridDim.x * kBlockTokens) {
    float acc[kNTiles][4] = {};
    logits(acc, args, stages, first, thread, warp, at.bar.staged);
#pragma unroll
    for (uint32_t half = 0; half < kHalves; ++half) {
      float2 v[kPairs];
#pragma unroll
      for (uint32_t j = 0; j < kPairs; ++j) {
        v[j] = make_float2(acc[j][2 * half], acc[j][2 * half + 1]);
      }
      route_row(v, args, first + warp * kMmaM + half * kHalfRows + g);
    }
  }
}
