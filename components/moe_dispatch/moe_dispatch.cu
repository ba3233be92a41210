// moe_dispatch: an MoE layer's routing table, by a counting sort over every CTA.
//
// The choices are cut into one contiguous slice per CTA, and each CTA
//   tallies: every choice's expert, all slices (an L2-resident read of T k ids), split
//            into the choices before its slice and the rest, per warp in shared memory
//            (integer adds, so the tallies do not depend on their order);
//   starts:  expert e's segment begins after the padded segments of the experts before
//            it; this CTA's first row of e follows the choices of e in earlier slices;
//   places:  thread t counts, per expert, the choices in its contiguous share of the
//            slice, expert e's column is scanned over the threads (thread e does it),
//            and each thread hands out its rows in order.
// No CTA waits for another. Rows come out expert-major, token order within an expert:
// the same bytes every run, whatever the grid. With align > 1 every expert's segment
// is padded to a multiple of align rows; padding rows, and the rows past the last
// segment, get token -1 (row_gather writes them zero), written by all CTAs in turn.
#include "pl_moe_dispatch.h"

using Params = pl_params_moe_dispatch;

constexpr uint32_t kMaxExperts = Params::max_experts;
constexpr uint32_t kWarps = Params::warps;
constexpr uint32_t kThreads = kWarps * pl::kWarpThreads;   // the role's threads
constexpr uint32_t kBatch = 8;                             // ids a thread loads at once
constexpr uint32_t kBefore = 0, kRest = 1;                 // the tallies of a warp
constexpr uint32_t kTallies = 2;
constexpr int32_t kNoRow = -1;                             // an id outside [0, E)

// The role's shared memory, in words (the contract's `table` is its size).
struct Table {
  uint32_t* tally;       // [kWarps][kTallies][kMaxExperts]: choices per expert, before / rest
  uint32_t* counts;      // [kThreads][kMaxExperts]: a thread's share, then its first row
  uint32_t* first_row;   // [kMaxExperts]: this CTA's first row of each expert
  uint32_t* pad_of;      // [kMaxExperts + 1]: each segment's first padding row
  uint32_t* end_of;      // [kMaxExperts]: each segment's padded end

  __device__ __forceinline__ explicit Table(uint32_t offset)
      : tally(pl::smem_ptr<uint32_t>(offset)),
        counts(tally + kWarps * kTallies * kMaxExperts),
        first_row(counts + kThreads * kMaxExperts),
        pad_of(first_row + kMaxExperts),
        end_of(pad_of + kMaxExperts + 1) {}
};

// Every choice's expert, tallied by this warp: kBefore for choices below `first`.
__device__ __forceinline__ void tally_all(const Table& s, const pl_args_moe_dispatch& args,
                                          uint32_t experts, uint32_t first, uint32_t thread) {
  uint32_t* mine = s.tally + thread / pl::kWarpThreads * kTallies * kMaxExperts;
  pl::vec::batched<kBatch>(
      thread, args.choices, kThreads,
      [&](uint32_t i) { return uint32_t(__ldcg(args.topk_ids + i)); },
      [&](uint32_t i, uint32_t e) {
        if (e < experts) atomicAdd(mine + (i < first ? kBefore : kRest) * kMaxExperts + e, 1u);
      });
}

// Each expert's segment (padded to align) and this CTA's first row in it; CTA 0
// publishes the ends.
__device__ __forceinline__ void segment_starts(const Table& s, const pl_args_moe_dispatch& args,
                                               uint32_t experts, uint32_t thread,
                                               uint32_t barrier) {
  uint32_t* before = s.first_row;                // reused: before, then the first row
  uint32_t* total = s.pad_of;                    // reused: the total, then the padding
  if (thread < experts) {
    uint32_t b = 0, r = 0;
    for (uint32_t w = 0; w < kWarps; ++w) {
      b += s.tally[(w * kTallies + kBefore) * kMaxExperts + thread];
      r += s.tally[(w * kTallies + kRest) * kMaxExperts + thread];
    }
    before[thread] = b;
    total[thread] = b + r;
  }
  pl::named_sync(barrier, kThreads);
  if (thread != 0) return;
  const uint32_t align = max(args.align, 1u);
  uint32_t start = 0;
  for (uint32_t e = 0; e < experts; ++e) {
    const uint32_t count = total[e];
    s.first_row[e] = start + before[e];
    s.pad_of[e] = start + count;
    start = (start + count + align - 1) / align * align;
    s.end_of[e] = start;
    if (blockIdx.x == 0) args.ends[e] = int32_t(start);
  }
  s.pad_of[experts] = start;                     // rows past the last segment
}

// Padding rows, and the capacity past the last segment (choices + E (align - 1) rows
// in all), point at no token: every thread of every CTA takes its share.
__device__ __forceinline__ void mark_padding(const Table& s, const pl_args_moe_dispatch& args,
                                             uint32_t experts, uint32_t thread) {
  const uint32_t capacity = args.choices + experts * (max(args.align, 1u) - 1);
  const uint32_t stride = gridDim.x * kThreads;
  for (uint32_t e = 0; e <= experts; ++e) {
    const uint32_t end = e < experts ? s.end_of[e] : capacity;
    for (uint32_t row = s.pad_of[e] + blockIdx.x * kThreads + thread; row < end; row += stride) {
      args.token_of[row] = kNoRow;
    }
  }
}

// This thread's share of the CTA's slice of the choices: [first, last).
struct Share {
  uint32_t slice_first;   // the CTA's first choice
  uint32_t first, last;

  __device__ __forceinline__ Share(uint32_t choices, uint32_t thread) {
    const uint32_t slice = (choices + gridDim.x - 1) / gridDim.x;
    slice_first = min(blockIdx.x * slice, choices);
    const uint32_t slice_last = min(slice_first + slice, choices);
    const uint32_t share = (slice_last - slice_first + kThreads - 1) / kThreads;
    first = min(slice_first + thread * share, slice_last);
    last = min(first + share, slice_last);
  }
};

// counts[e]: this thread's choices of expert e in its share.
__device__ __forceinline__ void count_share(uint32_t* counts, const pl_args_moe_dispatch& args,
                                            uint32_t experts, const Share& mine) {
  for (uint32_t i = mine.first; i < mine.last; ++i) {
    const uint32_t e = uint32_t(__ldcg(args.topk_ids + i));
    if (e < experts) ++counts[e];
  }
}

// Expert `e`'s column of the threads' counts, scanned in thread order from this CTA's
// first row of e: each thread's first row of e.
__device__ __forceinline__ void scan_column(const Table& s, uint32_t e) {
  uint32_t row = s.first_row[e];
  for (uint32_t u = 0; u < kThreads; ++u) {
    const uint32_t c = s.counts[u * kMaxExperts + e];
    s.counts[u * kMaxExperts + e] = row;
    row += c;
  }
}

// This thread's share, in order: each choice's row, and the row's token.
__device__ __forceinline__ void place_share(uint32_t* next_row, const pl_args_moe_dispatch& args,
                                            uint32_t experts, const Share& mine) {
  for (uint32_t i = mine.first; i < mine.last; ++i) {
    const uint32_t e = uint32_t(__ldcg(args.topk_ids + i));
    if (e >= experts) {
      args.slot_of[i] = kNoRow;
      continue;
    }
    const uint32_t row = next_row[e]++;
    args.slot_of[i] = int32_t(row);
    args.token_of[row] = int32_t(i / args.top_k);
  }
}

// The sorting CTAs' perspective, once per launch.
extern "C" __device__ void pl_moe_dispatch_sort(const pl_place_moe_dispatch& at,
                                                const pl_args_moe_dispatch& args,
                                                const pl::KernelInfo&, const pl::WorkTile&,
                                                pl_state_moe_dispatch_sort&) {
  const Table s{at.smem.table};
  const uint32_t t = pl::thread_in_role(at.role.sort);
  const uint32_t experts = min(args.experts, kMaxExperts);
  const Share mine{args.choices, t};
  uint32_t* counts = s.counts + t * kMaxExperts;

  for (uint32_t i = t; i < kWarps * kTallies * kMaxExperts; i += kThreads) s.tally[i] = 0;
  for (uint32_t e = 0; e < experts; ++e) counts[e] = 0;
  pl::named_sync(at.bar.counted, kThreads);
  tally_all(s, args, experts, mine.slice_first, t);
  count_share(counts, args, experts, mine);
  pl::named_sync(at.bar.counted, kThreads);
  segment_starts(s, args, experts, t, at.bar.counted);
  pl::named_sync(at.bar.counted, kThreads);
  if (t < experts) scan_column(s, t);
  pl::named_sync(at.bar.counted, kThreads);
  mark_padding(s, args, experts, t);
  place_share(counts, args, experts, mine);
}
