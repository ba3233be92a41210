// moe_token_grad: dx[t] (+)= sum_j d_rows[slot_of[t, j]], fp32, choice order.
#include "pl_moe_token_grad.h"

using Params = pl_params_moe_token_grad;

constexpr uint32_t kVector = pl::vec::kBf16x8;

// Every CTA's perspective, once per launch: its tokens, warp by warp.
extern "C" __device__ void pl_moe_token_grad_scatter(const pl_place_moe_token_grad& at,
                                                     const pl_args_moe_token_grad& args,
                                                     const pl::KernelInfo&, const pl::WorkTile&,
                                                     pl_state_moe_token_grad_scatter&) {
  const uint32_t warp = pl::warp_in_role(at.role.scatter);
  const uint32_t vectors = args.cols / kVector;
  for (uint32_t t = blockIdx.x * Params::warps + warp; t < args.tokens;
       t += gridDim.x * Params::warps) {
    uint4* dx = reinterpret_cast<uint4*>(args.dx + size_t(t) * args.cols);
    pl::vec::weighted_row_sum(dx, args.accumulate ? dx : nullptr, args.d_rows, args.cols,
                              args.slot_of + size_t(t) * args.top_k, nullptr, args.top_k,
                              vectors);
  }
}
