// attn_bwd_prep: an attention backward's per-query statistics (base-2 LSE and delta =
// rowsum(dO o O), pl::attn::stats_index), and dQ's fp32 accumulator and turn counters
// zeroed.
#include "pl_attn_bwd_prep.h"

using Params = pl_params_attn_bwd_prep;

constexpr uint32_t kHeadDim = Params::head_dim;
constexpr uint32_t kThreads = Params::warps * pl::kWarpThreads;
constexpr uint32_t kVectors = kHeadDim / pl::vec::kBf16x8;     // threads per (row, head)
constexpr uint32_t kFloat4s = pl::vec::kBf16x8 / 4;            // dQ float4 per thread
constexpr float kInf = __builtin_huge_valf();
// Vectors of O and dO whose loads a thread issues at once (eight: 64 KiB a CTA of 8
// warps, ~8 MiB over a 132-CTA grid; four, half that, left the pass at about half of
// DRAM speed beside its stores of dQ's zeros).
constexpr uint32_t kBatch = Params::batch;

static_assert(kHeadDim % pl::vec::kBf16x8 == 0 && pl::kWarpThreads % kVectors == 0,
              "a row's 16-byte vectors share one warp: head_dim = 8, 16, ..., 256");

// The (row, head) of a vector's row of O.
struct RowHead {
  uint32_t row;
  uint32_t head;
};

__device__ __forceinline__ RowHead row_head(const pl_args_attn_bwd_prep& args, size_t vector) {
  const uint32_t pair = uint32_t(vector / kVectors);   // row * heads + head (32-bit division)
  return RowHead{pair / args.heads, pair % args.heads};
}

// The forward's (natural) LSE of one (row, head).
__device__ __forceinline__ float load_lse(const pl_args_attn_bwd_prep& args, RowHead at) {
  const uint32_t start = at.row / args.seq * args.seq;    // the sequence's first row
  return args.lse[pl::attn::lse_index(start, at.head, args.lse_rows, args.lse_heads,
                                      at.row - start)];
}

// Writes one (row, head)'s statistics: its LSE in base 2 and its delta.
__device__ __forceinline__ void write_stats(const pl_args_attn_bwd_prep& args, RowHead at,
                                            float lse, float delta) {
  args.stats[pl::attn::stats_index(at.head, pl::attn::kLseRow, args.rows, int32_t(at.row))] =
      lse == -kInf ? kInf : lse * pl::attn::kLog2e;
  args.stats[pl::attn::stats_index(at.head, pl::attn::kDeltaRow, args.rows, int32_t(at.row))] =
      delta;
}

// Every CTA's perspective, once per launch: warp-aligned strides, so every lane of a
// warp runs every iteration and the row sums can shuffle. Each thread issues the loads
// of kBatch vectors, a grid's threads apart, before it uses the first: one vector's 32
// bytes a thread left the phase at about 70% of DRAM speed. A row's LSE is loaded with
// them: loaded just before its statistics are stored, its latency held the warp up once
// per vector.
extern "C" __device__ void pl_attn_bwd_prep_elementwise(const pl_place_attn_bwd_prep& at,
                                                        const pl_args_attn_bwd_prep& args,
                                                        const pl::KernelInfo&,
                                                        const pl::WorkTile&,
                                                        pl_state_attn_bwd_prep_elementwise&) {
  const size_t total = size_t(args.rows) * args.heads * kVectors;
  const uint4* o = reinterpret_cast<const uint4*>(args.o);
  const uint4* d_o = reinterpret_cast<const uint4*>(args.d_o);
  float4* dq = reinterpret_cast<float4*>(args.dq_accum);
  const size_t stride = size_t(gridDim.x) * kThreads;
  const size_t first = size_t(blockIdx.x) * kThreads + pl::thread_in_role(at.role.elementwise);
  for (size_t i = first; i < args.turns; i += stride) args.dq_turns[i] = 0;
  for (size_t batch = first; batch - pl::lane() < total; batch += kBatch * stride) {
    uint4 o_vec[kBatch], d_o_vec[kBatch];
    float lse[kBatch];
#pragma unroll
    for (uint32_t b = 0; b < kBatch; ++b) {
      const size_t i = batch + b * stride;
      if (i < total) o_vec[b] = o[i], d_o_vec[b] = d_o[i];
      if (i < total && i % kVectors == 0) lse[b] = load_lse(args, row_head(args, i));
    }
#pragma unroll
    for (uint32_t b = 0; b < kBatch; ++b) {
      const size_t i = batch + b * stride;
      const bool valid = i < total;
      float sum = 0.0f;
      if (valid) {
        float a[pl::vec::kBf16x8], c[pl::vec::kBf16x8];
        pl::vec::unpack(o_vec[b], a);
        pl::vec::unpack(d_o_vec[b], c);
#pragma unroll
        for (uint32_t e = 0; e < pl::vec::kBf16x8; ++e) sum = fmaf(a[e], c[e], sum);
#pragma unroll
        for (uint32_t f = 0; f < kFloat4s; ++f) dq[kFloat4s * i + f] = make_float4(0, 0, 0, 0);
      }
#pragma unroll
      for (uint32_t offset = kVectors / 2; offset > 0; offset /= 2) {
        sum += __shfl_xor_sync(0xffffffffu, sum, offset);
      }
      if (valid && i % kVectors == 0) write_stats(args, row_head(args, i), lse[b], sum);
    }
  }
}
