// no_mask: every query sees every key of its sequence.
#include "pl_no_mask.h"

extern "C" __device__ pl::attn::Span pl_no_mask_mask_kv_range(const pl_place_no_mask&,
                                                              const pl_args_no_mask&,
                                                              const pl::KernelInfo&, int32_t,
                                                              int32_t, int32_t kv_len) {
  return pl::attn::Span{0, kv_len};
}

extern "C" __device__ pl::attn::Span pl_no_mask_mask_q_range(const pl_place_no_mask&,
                                                             const pl_args_no_mask&,
                                                             const pl::KernelInfo&, int32_t,
                                                             int32_t, int32_t q_len) {
  return pl::attn::Span{0, q_len};
}

extern "C" __device__ bool pl_no_mask_mask_partial(const pl_place_no_mask&,
                                                   const pl_args_no_mask&,
                                                   const pl::KernelInfo&, int32_t, int32_t,
                                                   int32_t, int32_t) {
  return false;
}

extern "C" __device__ bool pl_no_mask_mask_keep(const pl_place_no_mask&, const pl_args_no_mask&,
                                                const pl::KernelInfo&, int32_t, int32_t) {
  return true;
}
