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
    for (uint32_t v = pl::lane(); v < vectors; v += pl::kWarpThreads) {
      float acc[kVector] = {};
      for (uint32_t j = 0; j < args.top_k; ++j) {
        const int32_t row = args.slot_of[t * args.top_k + j];
        if (row < 0) continue;
        // rows were written earlier in this launch (another phase): an L2 load, never
        // the non-coherent read-only path.
        const uint4* in = reinterpret_cast<const uint4*>(args.rows + size_t(row) * args.cols);
        pl::vec::add_scaled(acc, args.weights[t * args.top_k + j], __ldcg(in + v));
      }
      reinterpret_cast<uint4*>(args.out + size_t(t) * args.cols)[v] = pl::vec::pack(acc);
    }
  }
}
