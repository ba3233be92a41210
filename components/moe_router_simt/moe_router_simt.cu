// moe_router_simt: moe_router's contract, one warp per token and no tensor cores.
//
// Lane l reads x[t, 8 l + 256 i ...] as 16-byte vectors and keeps one fp32 partial
// logit per expert; a butterfly over the warp then leaves every full logit in every
// lane, so the softmax and the top-k run in each lane alike and lane 0 writes the
// choice. Register arrays are indexed by unrolled constants only (no local memory):
// every loop over experts runs to max_experts and skips the ones past E.
#include <cuda_bf16.h>

#include "pl_moe_router_simt.h"

using Params = pl_params_moe_router_simt;

constexpr uint32_t kExperts = Params::max_experts;
constexpr uint32_t kTopK = Params::max_top_k;
constexpr uint32_t kVec = pl::vec::kBf16x8;               // bf16 per 16-byte load
constexpr uint32_t kWarpSpan = pl::kWarpThreads * kVec;   // H columns a warp reads per step
constexpr float kTaken = -1.0f;                           // below any probability

// logit[e] = <x_t, Wr_e> for e < E, summed over the warp into every lane.
__device__ __forceinline__ void logits(float (&logit)[kExperts], const pl_args_moe_router_simt& args,
                                       uint32_t token) {
  const __nv_bfloat16* x = args.x + size_t(token) * args.hidden;
#pragma unroll
  for (uint32_t e = 0; e < kExperts; ++e) logit[e] = 0.0f;
  for (uint32_t h = pl::lane() * kVec; h < args.hidden; h += kWarpSpan) {
    float xs[kVec];
    pl::vec::unpack(__ldg(reinterpret_cast<const uint4*>(x + h)), xs);
#pragma unroll
    for (uint32_t e = 0; e < kExperts; ++e) {
      if (e >= args.experts) break;
      float w[kVec];
      pl::vec::unpack(__ldg(reinterpret_cast<const uint4*>(args.weight +
                                                           size_t(e) * args.hidden + h)), w);
#pragma unroll
      for (uint32_t i = 0; i < kVec; ++i) logit[e] = fmaf(xs[i], w[i], logit[e]);
    }
  }
#pragma unroll
  for (uint32_t e = 0; e < kExperts; ++e) {
    if (e >= args.experts) break;
    logit[e] = pl::warp_sum(logit[e]);
  }
}

// logit -> probability in place (every lane alike); lane e % 32 writes probs[t, e].
__device__ __forceinline__ void softmax(float (&p)[kExperts], const pl_args_moe_router_simt& args,
                                        uint32_t token) {
  float most = -INFINITY;
#pragma unroll
  for (uint32_t e = 0; e < kExperts; ++e) {
    if (e < args.experts) most = fmaxf(most, p[e]);
  }
  float sum = 0.0f;
#pragma unroll
  for (uint32_t e = 0; e < kExperts; ++e) {
    p[e] = e < args.experts ? __expf(p[e] - most) : 0.0f;
    sum += p[e];
  }
  const float scale = 1.0f / sum;
  float* row = args.probs + size_t(token) * args.experts;
#pragma unroll
  for (uint32_t e = 0; e < kExperts; ++e) {
    p[e] = e < args.experts ? p[e] * scale : kTaken;
    if (e < args.experts && e % pl::kWarpThreads == pl::lane()) row[e] = p[e];
  }
}

// The k best experts, best first, equal probabilities to the lower id; lane 0 writes
// them with their weights (renormalised over the k when asked).
__device__ __forceinline__ void top_k(float (&p)[kExperts], const pl_args_moe_router_simt& args,
                                      uint32_t token) {
  float chosen[kTopK];
  uint32_t ids[kTopK];
  float total = 0.0f;
#pragma unroll
  for (uint32_t r = 0; r < kTopK; ++r) {
    if (r >= args.top_k) break;
    float best = kTaken;
    uint32_t id = 0;
#pragma unroll
    for (uint32_t e = 0; e < kExperts; ++e) {
      if (p[e] > best) {          // strict: the first (lowest) id keeps a tie
        best = p[e];
        id = e;
      }
    }
#pragma unroll
    for (uint32_t e = 0; e < kExperts; ++e) {
      if (e == id) p[e] = kTaken;
    }
    chosen[r] = best;
    ids[r] = id;
    total += best;
  }
  if (pl::lane() != 0) return;
  const float norm = args.renormalize ? 1.0f / total : 1.0f;
#pragma unroll
  for (uint32_t r = 0; r < kTopK; ++r) {
    if (r >= args.top_k) break;
    args.topk_ids[size_t(token) * args.top_k + r] = int32_t(ids[r]);
    args.topk_w[size_t(token) * args.top_k + r] = chosen[r] * norm;
  }
}

// Every warp of every CTA takes tokens in turn.
extern "C" __device__ void pl_moe_router_simt_route(const pl_place_moe_router_simt& at,
                                                    const pl_args_moe_router_simt& args,
                                                    const pl::KernelInfo&, const pl::WorkTile&,
                                                    pl_state_moe_router_simt_route&) {
  const uint32_t warps = gridDim.x * Params::warps;
  for (uint32_t token = blockIdx.x * Params::warps + pl::warp_in_role(at.role.route);
       token < args.tokens; token += warps) {
    float p[kExperts];
    logits(p, args, token);
    softmax(p, args, token);
    top_k(p, args, token);
  }
}
