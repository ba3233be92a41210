// document_mask: query q sees key kv of its own document (and, causal, kv <= q), the
// documents named by a non-decreasing id per token.
#include "pl_document_mask.h"

using Params = pl_params_document_mask;

constexpr bool kCausal = Params::causal != 0;

// The id of the document position p belongs to; a position past the last token (a
// tile's rows beyond the sequence) reads the last token's.
__device__ __forceinline__ int32_t document_of(const pl_args_document_mask& args, int32_t p) {
  return __ldg(args.doc_ids + min(uint32_t(p), args.tokens - 1));
}

// The first position whose id is not below `id` (ids never decrease): where document
// `id` starts, found in log2(tokens) reads.
__device__ __forceinline__ int32_t first_at_least(const pl_args_document_mask& args,
                                                  int32_t id) {
  uint32_t lo = 0, hi = args.tokens;
  while (lo < hi) {
    const uint32_t mid = (lo + hi) / 2;
    if (__ldg(args.doc_ids + mid) < id) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return int32_t(lo);
}

__device__ __forceinline__ int32_t document_start(const pl_args_document_mask& args, int32_t p) {
  return first_at_least(args, document_of(args, p));
}

__device__ __forceinline__ int32_t document_end(const pl_args_document_mask& args, int32_t p) {
  return first_at_least(args, document_of(args, p) + 1);
}

// A query tile's keys: from its first query's document start to its last query (causal)
// or its last query's document end.
extern "C" __device__ pl::attn::Span pl_document_mask_mask_kv_range(
    const pl_place_document_mask&, const pl_args_document_mask& args, const pl::KernelInfo&,
    int32_t q_begin, int32_t q_end, int32_t kv_len) {
  if (q_begin >= q_end) return pl::attn::Span{0, 0};
  const int32_t last = kCausal ? q_end : document_end(args, q_end - 1);
  return pl::attn::Span{document_start(args, q_begin), min(last, kv_len)};
}

// A key tile's queries: from its first key (causal) or that key's document start to its
// last key's document end.
extern "C" __device__ pl::attn::Span pl_document_mask_mask_q_range(
    const pl_place_document_mask&, const pl_args_document_mask& args, const pl::KernelInfo&,
    int32_t kv_begin, int32_t kv_end, int32_t q_len) {
  if (kv_begin >= kv_end) return pl::attn::Span{0, 0};
  const int32_t first = kCausal ? kv_begin : document_start(args, kv_begin);
  return pl::attn::Span{first, min(document_end(args, kv_end - 1), q_len)};
}

// Every element is seen when the block lies in one document (the ids at its first and
// last position agree: they never decrease) and, causal, its last key is at or before
// its first query.
extern "C" __device__ bool pl_document_mask_mask_partial(const pl_place_document_mask&,
                                                         const pl_args_document_mask& args,
                                                         const pl::KernelInfo&,
                                                         int32_t q_begin, int32_t q_end,
                                                         int32_t kv_begin, int32_t kv_end) {
  if (kCausal && kv_end - 1 > q_begin) return true;
  return document_of(args, min(q_begin, kv_begin)) !=
         document_of(args, max(q_end, kv_end) - 1);
}

// The cores ask only about keys inside the sequence (kv < kv_len), so a key reads its id
// unclamped; a query may lie past the last token.
extern "C" __device__ bool pl_document_mask_mask_keep(const pl_place_document_mask&,
                                                      const pl_args_document_mask& args,
                                                      const pl::KernelInfo&, int32_t q,
                                                      int32_t kv) {
  return (!kCausal || kv <= q) && document_of(args, q) == __ldg(args.doc_ids + kv);
}
