// alibi_score: s + slope_h (kv - q), slope_h = 2^(-8 (h + 1) / heads).
#include "pl_alibi_score.h"

constexpr int32_t kHeads = pl_params_alibi_score::heads;
constexpr float kSlopeExponent = -8.0f / float(kHeads);   // log2 of slope_h per head

static_assert(kHeads >= 1, "ALiBi's slopes are spread over the heads: set heads >= 1");

extern "C" __device__ float pl_alibi_score_score_score(const pl_place_alibi_score&,
                                                       const pl_args_alibi_score&,
                                                       const pl::KernelInfo&, float s, int32_t,
                                                       int32_t head, int32_t q, int32_t kv) {
  const float slope = pl::attn::exp2_approx(kSlopeExponent * float(head + 1));
  return fmaf(slope, float(kv - q), s);
}

// The bias does not depend on s.
extern "C" __device__ float pl_alibi_score_score_grad(const pl_place_alibi_score&,
                                                      const pl_args_alibi_score&,
                                                      const pl::KernelInfo&, float, int32_t,
                                                      int32_t, int32_t, int32_t) {
  return 1.0f;
}

extern "C" __device__ bool pl_alibi_score_score_identity(const pl_place_alibi_score&,
                                                         const pl_args_alibi_score&,
                                                         const pl::KernelInfo&) {
  return false;
}
