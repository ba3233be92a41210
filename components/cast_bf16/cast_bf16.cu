// cast_bf16: fp32 to bf16, eight elements per thread.
#include "pl_cast_bf16.h"

using Params = pl_params_cast_bf16;

constexpr uint32_t kThreads = Params::warps * pl::kWarpThreads;

// Every CTA's perspective, once per launch.
extern "C" __device__ void pl_cast_bf16_elementwise(const pl_place_cast_bf16& at,
                                                    const pl_args_cast_bf16& args,
                                                    const pl::KernelInfo&, const pl::WorkTile&,
                                                    pl_state_cast_bf16_elementwise&) {
  const size_t vectors = args.count / pl::vec::kBf16x8;
  const float4* src = reinterpret_cast<const float4*>(args.src);
  uint4* dst = reinterpret_cast<uint4*>(args.dst);
  for (size_t i = size_t(blockIdx.x) * kThreads + pl::thread_in_role(at.role.elementwise);
       i < vectors; i += size_t(gridDim.x) * kThreads) {
    const float4 lo = __ldcg(src + 2 * i), hi = __ldcg(src + 2 * i + 1);
    const float f[pl::vec::kBf16x8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    dst[i] = pl::vec::pack(f);
  }
}
