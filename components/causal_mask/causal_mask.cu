// causal_mask: query q sees keys [0, q].
#include "pl_causal_mask.h"

extern "C" __device__ pl::attn::Span pl_causal_mask_mask_kv_range(
    const pl_place_causal_mask&, const pl_args_causal_mask&, const pl::KernelInfo&,
    int32_t, int32_t q_end, int32_t kv_len) {
  return pl::attn::Span{0, min(q_end, kv_len)};
}

extern "C" __device__ pl::attn::Span pl_causal_mask_mask_q_range(
    const pl_place_causal_mask&, const pl_args_causal_mask&, const pl::KernelInfo&,
    int32_t kv_begin, int32_t, int32_t q_len) {
  return pl::attn::Span{kv_begin, q_len};
}

extern "C" __device__ bool pl_causal_mask_mask_partial(const pl_place_causal_mask&,
                                                       const pl_args_causal_mask&,
                                                       const pl::KernelInfo&, int32_t q_begin,
                                                       int32_t, int32_t, int32_t kv_end) {
  return kv_end - 1 > q_begin;
}

extern "C" __device__ bool pl_causal_mask_mask_keep(const pl_place_causal_mask&,
                                                    const pl_args_causal_mask&,
                                                    const pl::KernelInfo&, int32_t q,
                                                    int32_t kv) {
  return kv <= q;
}
