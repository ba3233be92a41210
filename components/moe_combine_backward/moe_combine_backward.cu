// moe_combine_backward: d_rows[slot] = p dy[t], dp = <dy[t], rows[slot]>; padding
// rows zero. One warp per token, 16-byte vectors, fixed reduction order.
#include "pl_moe_combine_backward.h"

using Params = pl_params_moe_combine_backward;

constexpr uint32_t kVector = pl::vec::kBf16x8;
constexpr uint32_t kInFlight = pl::vec::kVectorsInFlight;   // per lane, per operand

// A vector of dy and the same vector of the choice's row.
struct VectorPair {
  uint4 dy, row;
};

// One choice's row: d_row = p dy, and the lane's share of <dy, row> in column order,
// kInFlight of the lane's vectors loaded before they are used (dy's again for each
// choice: L1 hits).
__device__ __forceinline__ float choice_backward(const uint4* dy, const uint4* row, uint4* d_row,
                                                 float p, uint32_t vectors) {
  float dot = 0.0f;
  pl::vec::batched<kInFlight>(
      pl::lane(), vectors, pl::kWarpThreads,
      // rows were written earlier in this launch: an L2 load, never the non-coherent
      // read-only path.
      [&](uint32_t v) { return VectorPair{__ldg(dy + v), __ldcg(row + v)}; },
      [&](uint32_t v, const VectorPair& x) {
        float g[kVector], y[kVector];
        pl::vec::unpack(x.dy, g);
        pl::vec::unpack(x.row, y);
#pragma unroll
        for (uint32_t e = 0; e < kVector; ++e) dot += g[e] * y[e];
        d_row[v] = pl::vec::pack(g, p);
      });
  return dot;
}

// One token's choices: each choice's row gradient, and its weight's gradient. Lane j
// holds choice j's row and weight (pl::vec::lane_choice): read once, not per choice.
__device__ __forceinline__ void token_backward(const pl_args_moe_combine_backward& args,
                                               uint32_t t, uint32_t vectors) {
  const uint4* dy = reinterpret_cast<const uint4*>(args.dy + size_t(t) * args.cols);
  const size_t first = size_t(t) * args.top_k;
  // slot_of was written earlier in this launch: L2 loads (lane_choice), never __ldg
  const pl::vec::Choice mine =
      pl::vec::lane_choice(args.slot_of + first, args.weights + first, args.top_k);
  for (uint32_t j = 0; j < args.top_k; ++j) {
    const pl::vec::Choice c = pl::vec::choice(mine, j);
    if (c.slot < 0) {
      if (pl::lane() == 0) args.dp[first + j] = 0.0f;
      continue;
    }
    const size_t offset = size_t(c.slot) * args.cols;
    const float dot = choice_backward(dy, reinterpret_cast<const uint4*>(args.rows + offset),
                                      reinterpret_cast<uint4*>(args.d_rows + offset), c.weight,
                                      vectors);
    const float sum = pl::warp_sum(dot);
    if (pl::lane() == 0) args.dp[first + j] = sum;
  }
}

// Rows [first 32, first 32 + 32) that hold no token (padding) zeroed by the warp: one
// load of token_of per lane, then the padding rows one after another.
__device__ __forceinline__ void zero_padding(const pl_args_moe_combine_backward& args,
                                             uint32_t group, uint32_t vectors) {
  const uint32_t r = group * pl::kWarpThreads + pl::lane();
  const bool padding = r < args.total_rows && __ldcg(args.token_of + r) < 0;
  for (uint32_t rows = __ballot_sync(~0u, padding); rows != 0; rows &= rows - 1) {
    const uint32_t row = group * pl::kWarpThreads + __ffs(rows) - 1;
    uint4* out = reinterpret_cast<uint4*>(args.d_rows + size_t(row) * args.cols);
    for (uint32_t v = pl::lane(); v < vectors; v += pl::kWarpThreads) out[v] = uint4{};
  }
}

// Every CTA's perspective, once per launch: its tokens, then its padding rows.
extern "C" __device__ void pl_moe_combine_backward_backward(
    const pl_place_moe_combine_backward& at, const pl_args_moe_combine_backward& args,
    const pl::KernelInfo&, const pl::WorkTile&, pl_state_moe_combine_backward_backward&) {
  const uint32_t warp = pl::warp_in_role(at.role.backward);
  const uint32_t vectors = args.cols / kVector;
  const uint32_t first = blockIdx.x * Params::warps + warp;
  const uint32_t stride = gridDim.x * Params::warps;
  for (uint32_t t = first; t < args.tokens; t += stride) token_backward(args, t, vectors);
  const uint32_t groups = (args.total_rows + pl::kWarpThreads - 1) / pl::kWarpThreads;
  for (uint32_t g = first; g < groups; g += stride) zero_padding(args, g, vectors);
}
