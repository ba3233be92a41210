// moe_token_grad: dx[t] = sum_j d_rows[slot_of[t, j]] + sum_e dlogits[t, e] wr[e].
#include "pl_moe_token_grad.h"

using Params = pl_params_moe_token_grad;

constexpr uint32_t kVector = pl::vec::kBf16x8;
constexpr uint32_t kMaxExperts = Params::max_experts;

// One token's gradient, vector by vector across the warp.
__device__ __forceinline__ void token_grad(const pl_args_moe_token_grad& args, uint32_t t,
                                           uint32_t vectors, uint32_t experts) {
  const __nv_bfloat16* dl = args.dlogits + size_t(t) * args.experts;
  for (uint32_t v = pl::lane(); v < vectors; v += pl::kWarpThreads) {
    float acc[kVector] = {};
    for (uint32_t j = 0; j < args.top_k; ++j) {
      const int32_t row = args.slot_of[t * args.top_k + j];
      if (row < 0) continue;
      // d_rows and dlogits were written earlier in this launch: L2 loads.
      const uint4* in = reinterpret_cast<const uint4*>(args.d_rows + size_t(row) * args.cols);
      pl::vec::add_scaled(acc, 1.0f, __ldcg(in + v));
    }
    for (uint32_t e = 0; e < experts; ++e) {
      const float g = __bfloat162float(__ldcg(dl + e));
      const uint4* w = reinterpret_cast<const uint4*>(args.wr + size_t(e) * args.cols);
      pl::vec::add_scaled(acc, g, __ldg(w + v));
    }
    reinterpret_cast<uint4*>(args.dx + size_t(t) * args.cols)[v] = pl::vec::pack(acc);
  }
}

// Every CTA's perspective, once per launch: its tokens, warp by warp.
extern "C" __device__ void pl_moe_token_grad_scatter(const pl_place_moe_token_grad& at,
                                                     const pl_args_moe_token_grad& args,
                                                     const pl::KernelInfo&, const pl::WorkTile&,
                                                     pl_state_moe_token_grad_scatter&) {
  const uint32_t warp = pl::warp_in_role(at.role.scatter);
  const uint32_t vectors = args.cols / kVector;
  const uint32_t experts = min(args.experts, kMaxExperts);
  for (uint32_t t = blockIdx.x * Params::warps + warp; t < args.tokens;
       t += gridDim.x * Params::warps) {
    token_grad(args, t, vectors, experts);
  }
}
