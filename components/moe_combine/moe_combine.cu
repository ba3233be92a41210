// moe_combine: y[t] = sum_j p[t, j] * rows[slot_of[t, j]], fp32, choice order.
#include "pl_moe_combine.h"

using Params = pl_params_moe_combine;

constexpr uint32_t kVector = pl::vec::kBf16x8;

// Every CTA's perspective, once per launch: its tokens, warp by warp.
extern "C" __device__ void pl_moe_combine_combine(const pl_place_moe_combine& at,
                                                  const pl_args_moe_combine& args,
                                                  const pl::KernelInfo&, const pl::WorkTile&,
                                                  pl_state_moe_combine_combine&) {
  const uint32_t warp = pl::warp_in_role(at.role.combine);
  const uint32_t vectors = args.cols / kVector;
  for (uint32_t t = blockIdx.x * Params::warps + warp; t < args.tokens;
       t += gridDim.x * Params::warps) {
    const size_t choices = size_t(t) * args.top_k;
    pl::vec::weighted_row_sum(reinterpret_cast<uint4*>(args.out + size_t(t) * args.cols),
                              nullptr, args.rows, args.cols, args.slot_of + choices,
                              args.weights + choices, args.top_k, vectors);
  }
}
