// id_documents: a document is a run of rows of one id (ids never decrease).
#include "pl_id_documents.h"

// No count but the rows': the cursor stops at the document that begins at the last row.
constexpr uint32_t kUnbounded = ~0u;

extern "C" __device__ uint32_t pl_id_documents_documents_count(const pl_place_id_documents&,
                                                               const pl_args_id_documents&,
                                                               const pl::KernelInfo&) {
  return kUnbounded;
}

extern "C" __device__ int32_t pl_id_documents_documents_first(const pl_place_id_documents&,
                                                              const pl_args_id_documents&,
                                                              const pl::KernelInfo&,
                                                              uint32_t) {
  return 0;
}

// The first row after `begin` whose id is not begin's: gallop (rows begin + 1, + 2, + 4,
// ... until one differs) then bisect the last stride, so a document of L rows costs
// about 2 log2(L) reads wherever it lies. Read through L2, as offsets are.
extern "C" __device__ int32_t pl_id_documents_documents_end(const pl_place_id_documents&,
                                                            const pl_args_id_documents& args,
                                                            const pl::KernelInfo&, uint32_t,
                                                            int32_t begin, uint32_t rows) {
  if (uint32_t(begin) >= rows) return begin;
  const int32_t id = __ldcg(args.doc_ids + begin);
  const auto same = [&](uint32_t row) { return __ldcg(args.doc_ids + row) == id; };
  uint32_t known = uint32_t(begin);     // a row of the document
  uint32_t stride = 1;
  uint32_t probe = known + stride;
  while (probe < rows && same(probe)) {
    known = probe;
    stride *= 2;
    probe = known + min(stride, rows - known);
  }
  uint32_t lo = known + 1;              // the end lies in [lo, hi]
  uint32_t hi = min(probe, rows);
  while (lo < hi) {
    const uint32_t mid = lo + (hi - lo) / 2;
    if (same(mid)) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return int32_t(lo);
}
