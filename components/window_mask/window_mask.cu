// window_mask: query q sees keys [q - left, q + right].
#include "pl_window_mask.h"

using Params = pl_params_window_mask;

constexpr int32_t kLeft = Params::left;
constexpr int32_t kRight = Params::right;

static_assert(kLeft >= 0 && kRight >= 0,
              "the window reaches left and right of the query: set left, right >= 0");

extern "C" __device__ pl::attn::Span pl_window_mask_mask_kv_range(
    const pl_place_window_mask&, const pl_args_window_mask&, const pl::KernelInfo&,
    int32_t q_begin, int32_t q_end, int32_t kv_len) {
  return pl::attn::Span{max(q_begin - kLeft, 0), min(q_end + kRight, kv_len)};
}

// Read the other way, q - left <= kv <= q + right: the keys [kv_begin, kv_end) are
// seen by the queries [kv_begin - right, kv_end - 1 + left].
extern "C" __device__ pl::attn::Span pl_window_mask_mask_q_range(
    const pl_place_window_mask&, const pl_args_window_mask&, const pl::KernelInfo&,
    int32_t kv_begin, int32_t kv_end, int32_t q_len) {
  return pl::attn::Span{max(kv_begin - kRight, 0), min(kv_end + kLeft, q_len)};
}

extern "C" __device__ bool pl_window_mask_mask_partial(const pl_place_window_mask&,
                                                       const pl_args_window_mask&,
                                                       const pl::KernelInfo&, int32_t q_begin,
                                                       int32_t q_end, int32_t kv_begin,
                                                       int32_t kv_end) {
  return kv_end - 1 > q_begin + kRight || kv_begin < q_end - 1 - kLeft;
}

extern "C" __device__ bool pl_window_mask_mask_keep(const pl_place_window_mask&,
                                                    const pl_args_window_mask&,
                                                    const pl::KernelInfo&, int32_t q,
                                                    int32_t kv) {
  return kv >= q - kLeft && kv <= q + kRight;
}
