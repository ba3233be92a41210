// zigzag_mask: one step of ring attention over zigzag shards (two chunks per rank), the
// queries' rank attending an earlier or a later rank's K and V.
#include "pl_zigzag_mask.h"

using Args = pl_args_zigzag_mask;

constexpr uint32_t kRelation = pl_params_zigzag_mask::relation;
constexpr uint32_t kEarlier = 1;   // an earlier rank's: its first chunk, for every query
constexpr uint32_t kLater = 2;     // a later rank's: all of it, for the second chunk's queries

static_assert(kRelation == kEarlier || kRelation == kLater,
              "relation is 1 (an earlier rank's K/V) or 2 (a later rank's); the rank's own "
              "is causal_mask");

extern "C" __device__ pl::attn::Span pl_zigzag_mask_mask_kv_range(
    const pl_place_zigzag_mask&, const Args& args, const pl::KernelInfo&, int32_t,
    int32_t q_end, int32_t kv_len) {
  const int32_t half = int32_t(args.half);
  if constexpr (kRelation == kEarlier) return pl::attn::Span{0, min(half, kv_len)};
  return pl::attn::Span{0, q_end > half ? kv_len : 0};
}

extern "C" __device__ pl::attn::Span pl_zigzag_mask_mask_q_range(
    const pl_place_zigzag_mask&, const Args& args, const pl::KernelInfo&, int32_t kv_begin,
    int32_t, int32_t q_len) {
  const int32_t half = int32_t(args.half);
  if constexpr (kRelation == kEarlier) return pl::attn::Span{0, kv_begin < half ? q_len : 0};
  return pl::attn::Span{min(half, q_len), q_len};
}

extern "C" __device__ bool pl_zigzag_mask_mask_partial(const pl_place_zigzag_mask&,
                                                       const Args& args,
                                                       const pl::KernelInfo&, int32_t q_begin,
                                                       int32_t, int32_t, int32_t kv_end) {
  if constexpr (kRelation == kEarlier) return kv_end > int32_t(args.half);
  return q_begin < int32_t(args.half);
}

extern "C" __device__ bool pl_zigzag_mask_mask_keep(const pl_place_zigzag_mask&,
                                                    const Args& args, const pl::KernelInfo&,
                                                    int32_t q, int32_t kv) {
  if constexpr (kRelation == kEarlier) return kv < int32_t(args.half);
  return q >= int32_t(args.half);
}
