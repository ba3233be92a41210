// moe_router: logits on the tensor cores, softmax and top-k in registers.
//
// A warp takes kTokens tokens (kMTiles m16 tiles) and all E <= max_experts experts
// (kNTiles n8 tiles) and walks H in k16 steps: per step one Wr fragment per n tile,
// shared by the m tiles. In the mma accumulator, row r of an m tile lives in the four
// lanes of quad r % 8 (lane 4 g + t holds rows g and g + 8, columns 8 j + 2 t and
// 8 j + 2 t + 1 of n tile j), so a row's softmax and top-k reduce over a quad with
// two shuffles per step.
#include <cuda_bf16.h>

#include "pl_moe_router.h"

using Params = pl_params_moe_router;

constexpr uint32_t kMmaM = 16, kMmaN = 8, kMmaK = 16;   // mma.sync m16n8k16
constexpr uint32_t kMTiles = 2;                         // m tiles a warp holds
constexpr uint32_t kTokens = kMTiles * kMmaM;           // tokens a warp routes at a time
constexpr uint32_t kNTiles = Params::max_experts / kMmaN;
constexpr uint32_t kQuad = 4;                           // lanes that share a row
constexpr uint32_t kHalves = 2;                         // rows g and g + 8 of a lane
constexpr uint32_t kHalfRows = kMmaM / kHalves;
constexpr uint32_t kPairs = kNTiles;                    // column pairs a lane holds per row
constexpr float kTaken = -1.0f;                         // below any probability
static_assert(Params::max_experts % kMmaN == 0, "experts come in n8 tiles");

// Two bf16 of `row` at columns [col, col + 2) as one register, 0 past the edge (H is
// a multiple of 8, so a pair is in or out whole).
__device__ __forceinline__ uint32_t pair_at(const __nv_bfloat16* m, uint32_t rows, uint32_t cols,
                                            uint32_t row, uint32_t col) {
  if (row >= rows || col >= cols) return 0;
  return __ldg(reinterpret_cast<const uint32_t*>(m + size_t(row) * cols + col));
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// logits[m][j]: the accumulators of m tile m, n tile j, for tokens [first, +kTokens).
__device__ __forceinline__ void logits(float (&acc)[kMTiles][kNTiles][4],
                                       const pl_args_moe_router& args, uint32_t first) {
  const uint32_t g = pl::lane() / kQuad, t = pl::lane() % kQuad;
  for (uint32_t k = 0; k < args.hidden; k += kMmaK) {
    uint32_t a[kMTiles][4];
#pragma unroll
    for (uint32_t m = 0; m < kMTiles; ++m) {
      const uint32_t row = first + m * kMmaM + g;
      a[m][0] = pair_at(args.x, args.tokens, args.hidden, row, k + 2 * t);
      a[m][1] = pair_at(args.x, args.tokens, args.hidden, row + kHalfRows, k + 2 * t);
      a[m][2] = pair_at(args.x, args.tokens, args.hidden, row, k + 2 * t + kMmaK / 2);
      a[m][3] = pair_at(args.x, args.tokens, args.hidden, row + kHalfRows,
                        k + 2 * t + kMmaK / 2);
    }
#pragma unroll
    for (uint32_t j = 0; j < kNTiles; ++j) {
      if (j * kMmaN >= args.experts) break;
      const uint32_t expert = j * kMmaN + g;
      const uint32_t b0 = pair_at(args.weight, args.experts, args.hidden, expert, k + 2 * t);
      const uint32_t b1 = pair_at(args.weight, args.experts, args.hidden, expert,
                                  k + 2 * t + kMmaK / 2);
#pragma unroll
      for (uint32_t m = 0; m < kMTiles; ++m) mma_bf16(acc[m][j], a[m], b0, b1);
    }
  }
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

// Every CTA's perspective, once per launch: its token blocks, warp by warp.
extern "C" __device__ void pl_moe_router_route(const pl_place_moe_router& at,
                                               const pl_args_moe_router& args,
                                               const pl::KernelInfo&, const pl::WorkTile&,
                                               pl_state_moe_router_route&) {
  const uint32_t warp = pl::warp_in_role(at.role.route);
  const uint32_t g = pl::lane() / kQuad;
  for (uint32_t first = (blockIdx.x * Params::warps + warp) * kTokens; first < args.tokens;
       first += gridDim.x * Params::warps * kTokens) {
    float acc[kMTiles][kNTiles][4] = {};
    logits(acc, args, first);
#pragma unroll
    for (uint32_t m = 0; m < kMTiles; ++m) {
#pragma unroll
      for (uint32_t half = 0; half < kHalves; ++half) {
        float2 v[kPairs];
#pragma unroll
        for (uint32_t j = 0; j < kPairs; ++j) {
          v[j] = make_float2(acc[m][j][2 * half], acc[m][j][2 * half + 1]);
        }
        route_row(v, args, first + m * kMmaM + half * kHalfRows + g);
      }
    }
  }
}
