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

extern "C" __device__ bool pl_softcap_score_score_identity(const pl_place_softcap_score&,
                                                           const pl_args_softcap_score&,
                                                           const pl::KernelInfo&) {
  return false;
}
