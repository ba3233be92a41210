// softcap_score: s -> cap * tanh(s / cap).
#include "pl_softcap_score.h"

constexpr float kCap = float(pl_params_softcap_score::cap);

static_assert(pl_params_softcap_score::cap > 0, "the soft cap is positive: set cap >= 1");

extern "C" __device__ float pl_softcap_score_score_score(const pl_place_softcap_score&,
                                                         const pl_args_softcap_score&,
                                                         const pl::KernelInfo&, float s,
                                                         int32_t, int32_t, int32_t, int32_t) {
  return kCap * tanhf(s * (1.0f / kCap));
}

// d/ds cap tanh(s / cap) = 1 - tanh^2(s / cap), from the score the forward pass made.
extern "C" __device__ float pl_softcap_score_score_grad(const pl_place_softcap_score&,
                                                        const pl_args_softcap_score&,
                                                        const pl::KernelInfo&, float score,
                                                        int32_t, int32_t, int32_t, int32_t) {
  const float t = score * (1.0f / kCap);
  return fmaxf(fmaf(-t, t, 1.0f), 0.0f);   // 0, not -inf, at a masked element's -inf
}

extern "C" __device__ bool pl_softcap_score_score_identity(const pl_place_softcap_score&,
                                                           const pl_args_softcap_score&,
                                                           const pl::KernelInfo&) {
  return false;
}
