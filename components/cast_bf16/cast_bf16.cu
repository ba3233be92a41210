// cast_bf16: fp32 to bf16, eight elements per thread.
#include "pl_cast_bf16.h"

using Params = pl_params_cast_bf16;

constexpr uint32_t kThreads = Params::warps * pl::kWarpThreads;
// Vectors whose loads a thread issues before it stores the first: with 8 warps a CTA, one
// vector's 32 bytes in flight a thread left the pass latency-bound at about half of DRAM
// speed; eight (64 KiB a CTA) cover HBM3e's latency times its bandwidth.
constexpr uint32_t kBatch = Params::batch;

// Every CTA's perspective, once per launch: batches of kBatch vectors a grid's threads
// apart, all loaded before any is stored.
extern "C" __device__ void pl_cast_bf16_elementwise(const pl_place_cast_bf16& at,
                                                    const pl_args_cast_bf16& args,
                                                    const pl::KernelInfo&, const pl::WorkTile&,
                                                    pl_state_cast_bf16_elementwise&) {
  const size_t vectors = args.count / pl::vec::kBf16x8;
  const float4* src = reinterpret_cast<const float4*>(args.src);
  uint4* dst = reinterpret_cast<uint4*>(args.dst);
  const size_t stride = size_t(gridDim.x) * kThreads;
  for (size_t batch = size_t(blockIdx.x) * kThreads + pl::thread_in_role(at.role.elementwise);
       batch < vectors; batch += kBatch * stride) {
    float f[kBatch][pl::vec::kBf16x8];
#pragma unroll
    for (uint32_t b = 0; b < kBatch; ++b) {
      const size_t i = batch + b * stride;
      if (i >= vectors) continue;
      const float4 lo = __ldcg(src + 2 * i), hi = __ldcg(src + 2 * i + 1);
      f[b][0] = lo.x, f[b][1] = lo.y, f[b][2] = lo.z, f[b][3] = lo.w;
      f[b][4] = hi.x, f[b][5] = hi.y, f[b][6] = hi.z, f[b][7] = hi.w;
    }
#pragma unroll
    for (uint32_t b = 0; b < kBatch; ++b) {
      const size_t i = batch + b * stride;
      if (i < vectors) dst[i] = pl::vec::pack(f[b]);
    }
  }
}
