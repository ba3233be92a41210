// moe_dispatch: an MoE layer's routing table, by a counting sort in one CTA.
//
//   count: thread t counts, per expert, the choices in its contiguous share;
//   scan:  expert e's column is scanned over the threads (thread e does it), then the
//          experts' totals (thread 0): the first row of thread t's choices of e is
//          start[e] + (the choices of e in the shares before t's);
//   place: thread t walks its share again, in order, and hands out those rows.
// Rows come out expert-major, token order within an expert: the same bytes every run.
// With align > 1 every expert's segment is padded to a multiple of align rows; padding
// rows, and the rows past the last segment, get token -1 (row_gather writes them zero).
#include "pl_moe_dispatch.h"

using Params = pl_params_moe_dispatch;

constexpr uint32_t kMaxExperts = Params::max_experts;
constexpr uint32_t kThreads = Params::warps * pl::kWarpThreads;   // the role's threads
constexpr int32_t kNoRow = -1;                            // an id outside [0, E)

// The sorting CTA's perspective, once per launch.
extern "C" __device__ void pl_moe_dispatch_sort(const pl_place_moe_dispatch& at,
                                                const pl_args_moe_dispatch& args,
                                                const pl::KernelInfo&, const pl::WorkTile&,
                                                pl_state_moe_dispatch_sort&) {
  if (blockIdx.x != 0) return;                  // one CTA sorts; the others skip the phase
  const uint32_t t = pl::thread_in_role(at.role.sort);
  const uint32_t experts = min(args.experts, kMaxExperts);
  const uint32_t share = (args.choices + kThreads - 1) / kThreads;
  const uint32_t first = min(t * share, args.choices);
  const uint32_t last = min(first + share, args.choices);
  // counts[t][e]: thread t's choices of expert e (then where they start); after all
  // threads' counts, one word per expert.
  uint32_t* counts = pl::smem_ptr<uint32_t>(at.smem.counts) + t * kMaxExperts;
  for (uint32_t e = 0; e < experts; ++e) counts[e] = 0;
  for (uint32_t i = first; i < last; ++i) {
    const uint32_t e = uint32_t(args.topk_ids[i]);
    if (e < experts) ++counts[e];
  }
  pl::named_sync(at.bar.counted, kThreads);
  uint32_t* all = pl::smem_ptr<uint32_t>(at.smem.counts);
  uint32_t* total_of = all + kThreads * kMaxExperts;   // each expert's total, then start
  if (t < experts) {                            // expert t's column, exclusive
    uint32_t sum = 0;
    for (uint32_t u = 0; u < kThreads; ++u) {
      const uint32_t c = all[u * kMaxExperts + t];
      all[u * kMaxExperts + t] = sum;
      sum += c;
    }
    total_of[t] = sum;
  }
  pl::named_sync(at.bar.counted, kThreads);
  const uint32_t align = max(args.align, 1u);
  uint32_t* pad_of = total_of + kMaxExperts;          // each expert's first padding row
  if (t == 0) {                                 // experts' starts and (padded) ends, in order
    uint32_t start = 0;
    for (uint32_t e = 0; e < experts; ++e) {
      const uint32_t total = total_of[e];
      total_of[e] = start;
      pad_of[e] = start + total;
      start = (start + total + align - 1) / align * align;
      args.ends[e] = int32_t(start);
    }
    pad_of[experts] = start;                    // rows past the last segment
  }
  pl::named_sync(at.bar.counted, kThreads);
  // Padding rows, and the capacity past the last segment (choices + E (align - 1) rows
  // in all), point at no token.
  const uint32_t capacity = args.choices + experts * (align - 1);
  for (uint32_t e = 0; e <= experts; ++e) {
    const uint32_t end = e < experts ? uint32_t(args.ends[e]) : capacity;
    for (uint32_t row = pad_of[e] + t; row < end; row += kThreads) args.token_of[row] = kNoRow;
  }
  for (uint32_t i = first; i < last; ++i) {
    const uint32_t e = uint32_t(args.topk_ids[i]);
    if (e >= experts) {
      args.slot_of[i] = kNoRow;
      continue;
    }
    const uint32_t row = total_of[e] + counts[e]++;
    args.slot_of[i] = int32_t(row);
    args.token_of[row] = int32_t(i / args.top_k);
  }
}
