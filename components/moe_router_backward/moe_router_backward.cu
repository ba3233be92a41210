// moe_router_backward: dlogits from dp through the renormalised top-k and the softmax.
// Lane l holds experts l and l + 32 of its warp's token.
#include <cuda_bf16.h>

#include "pl_moe_router_backward.h"

using Params = pl_params_moe_router_backward;

constexpr uint32_t kMaxExperts = Params::max_experts;
constexpr uint32_t kMaxTopK = Params::max_top_k;
constexpr uint32_t kExpertsPerLane = kMaxExperts / pl::kWarpThreads;

static_assert(kMaxExperts % pl::kWarpThreads == 0, "max_experts is whole warps of experts");

// One token: every lane computes the chosen experts' ds (k is small), then its own
// experts' dlogits.
__device__ __forceinline__ void token_backward(const pl_args_moe_router_backward& args,
                                               uint32_t t) {
  const uint32_t k = min(args.top_k, kMaxTopK);
  const uint32_t experts = min(args.experts, kMaxExperts);
  const float* probs = args.probs + size_t(t) * args.experts;
  // Fully unrolled over max_top_k (guarded by k), so ds and id stay in registers.
  float ds[kMaxTopK];
  int32_t id[kMaxTopK];
  float weighted = 0.0f, chosen = 0.0f;      // sum_i p_i dp_i, and S = sum_i s_i
#pragma unroll
  for (uint32_t j = 0; j < kMaxTopK; ++j) {
    id[j] = -1;
    ds[j] = 0.0f;
    if (j < k) {
      id[j] = args.topk_ids[t * args.top_k + j];
      ds[j] = __ldcg(args.dp + t * args.top_k + j);    // an earlier phase wrote it
      weighted += args.topk_w[t * args.top_k + j] * ds[j];
      chosen += uint32_t(id[j]) < experts ? probs[id[j]] : 0.0f;
    }
  }
  if (args.renormalize != 0) {
#pragma unroll
    for (uint32_t j = 0; j < kMaxTopK; ++j) ds[j] = (ds[j] - weighted) / chosen;
  }
  float mine[kExpertsPerLane], dot = 0.0f;   // this lane's experts' ds; sum probs * ds
#pragma unroll
  for (uint32_t i = 0; i < kExpertsPerLane; ++i) {
    const uint32_t e = pl::lane() + i * pl::kWarpThreads;
    mine[i] = 0.0f;
#pragma unroll
    for (uint32_t j = 0; j < kMaxTopK; ++j) mine[i] += id[j] == int32_t(e) ? ds[j] : 0.0f;
    if (e < experts) dot += probs[e] * mine[i];
  }
  dot = pl::warp_sum(dot);
  __nv_bfloat16* out = args.dlogits + size_t(t) * args.experts;
#pragma unroll
  for (uint32_t i = 0; i < kExpertsPerLane; ++i) {
    const uint32_t e = pl::lane() + i * pl::kWarpThreads;
    if (e < experts) out[e] = __float2bfloat16_rn(probs[e] * (mine[i] - dot));
  }
}

// Every CTA's perspective, once per launch: its tokens, warp by warp.
extern "C" __device__ void pl_moe_router_backward_backward(
    const pl_place_moe_router_backward& at, const pl_args_moe_router_backward& args,
    const pl::KernelInfo&, const pl::WorkTile&, pl_state_moe_router_backward_backward&) {
  const uint32_t warp = pl::warp_in_role(at.role.backward);
  for (uint32_t t = blockIdx.x * Params::warps + warp; t < args.tokens;
       t += gridDim.x * Params::warps) {
    token_backward(args, t);
  }
}
