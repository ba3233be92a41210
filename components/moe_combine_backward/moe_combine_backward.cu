// moe_combine_backward: d_rows[slot] = p dy[t], dp = <dy[t], rows[slot]>; padding
// rows zero. One warp per token, 16-byte vectors, fixed reduction order.
#include "pl_moe_combine_backward.h"

using Params = pl_params_moe_combine_backward;

constexpr uint32_t kVector = pl::vec::kBf16x8;

// One token's choices: each choice's row gradient, and its weight's gradient.
__device__ __forceinline__ void token_backward(const pl_args_moe_combine_backward& args,
                                               uint32_t t, uint32_t vectors) {
  const uint4* dy = reinterpret_cast<const uint4*>(args.dy + size_t(t) * args.cols);
  for (uint32_t j = 0; j < args.top_k; ++j) {
    const uint32_t choice = t * args.top_k + j;
    const int32_t row = args.slot_of[choice];
    if (row < 0) {
      if (pl::lane() == 0) args.dp[choice] = 0.0f;
      continue;
    }
    const float p = args.weights[choice];
    // rows and slot_of were written earlier in this launch: L2 loads, never the
    // non-coherent read-only path.
    const uint4* in = reinterpret_cast<const uint4*>(args.rows + size_t(row) * args.cols);
    uint4* out = reinterpret_cast<uint4*>(args.d_rows + size_t(row) * args.cols);
    float dot = 0.0f;
    for (uint32_t v = pl::lane(); v < vectors; v += pl::kWarpThreads) {
      float g[kVector], y[kVector];
      pl::vec::unpack(__ldg(dy + v), g);
      pl::vec::unpack(__ldcg(in + v), y);
#pragma unroll
      for (uint32_t i = 0; i < kVector; ++i) dot += g[i] * y[i];
      out[v] = pl::vec::pack(g, p);
    }
    dot = pl::warp_sum(dot);
    if (pl::lane() == 0) args.dp[choice] = dot;
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
  for (uint32_t r = first; r < args.total_rows; r += stride) {
    if (__ldcg(args.token_of + r) >= 0) continue;
    uint4* out = reinterpret_cast<uint4*>(args.d_rows + size_t(r) * args.cols);
    for (uint32_t v = pl::lane(); v < vectors; v += pl::kWarpThreads) out[v] = uint4{};
  }
}
