// cu_seqlens_documents: document b is rows [cu_seqlens[b], cu_seqlens[b + 1]).
#include "pl_cu_seqlens_documents.h"

// Offset b, clamped to [floor, rows].
__device__ __forceinline__ int32_t offset(const pl_args_cu_seqlens_documents& args, uint32_t b,
                                          int32_t floor, uint32_t rows) {
  return min(max(__ldcg(args.cu_seqlens + b), floor), int32_t(rows));
}

extern "C" __device__ uint32_t pl_cu_seqlens_documents_documents_count(
    const pl_place_cu_seqlens_documents&, const pl_args_cu_seqlens_documents& args,
    const pl::KernelInfo&) {
  return args.batch;
}

extern "C" __device__ int32_t pl_cu_seqlens_documents_documents_first(
    const pl_place_cu_seqlens_documents&, const pl_args_cu_seqlens_documents& args,
    const pl::KernelInfo&, uint32_t rows) {
  return offset(args, 0, 0, rows);
}

extern "C" __device__ int32_t pl_cu_seqlens_documents_documents_end(
    const pl_place_cu_seqlens_documents&, const pl_args_cu_seqlens_documents& args,
    const pl::KernelInfo&, uint32_t document, int32_t begin, uint32_t rows) {
  return offset(args, document + 1, begin, rows);
}
