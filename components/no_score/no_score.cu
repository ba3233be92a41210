// no_score: the score is the scaled dot product.
#include "pl_no_score.h"

extern "C" __device__ float pl_no_score_score_score(const pl_place_no_score&,
                                                    const pl_args_no_score&,
                                                    const pl::KernelInfo&, float s, int32_t,
                                                    int32_t, int32_t, int32_t) {
  return s;
}

extern "C" __device__ float pl_no_score_score_grad(const pl_place_no_score&,
                                                   const pl_args_no_score&,
                                                   const pl::KernelInfo&, float, int32_t,
                                                   int32_t, int32_t, int32_t) {
  return 1.0f;
}

extern "C" __device__ bool pl_no_score_score_identity(const pl_place_no_score&,
                                                      const pl_args_no_score&,
                                                      const pl::KernelInfo&) {
  return true;
}
