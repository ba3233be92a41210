// moe_combine: y[t] = sum_j p[t, j] * rows[slot_of[t, j]], fp32, choice order.
#include <cuda_bf16.h>

#include "pl_moe_combine.h"

using Params = pl_params_moe_combine;

constexpr uint32_t kVector = 8;               // bf16 per 16-byte load and store

// y's eight columns of one 16-byte vector += p * the row's.
__device__ __forceinline__ void add_scaled(float (&acc)[kVector], float p, const uint4& v) {
  const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (uint32_t i = 0; i < kVector / 2; ++i) {
    const float2 f = __bfloat1622float2(pairs[i]);
    acc[2 * i] += p * f.x;
    acc[2 * i + 1] += p * f.y;
  }
}

// Every CTA's perspective, once per launch: its tokens, warp by warp.
extern "C" __device__ void pl_moe_combine_combine(const pl_place_moe_combine& at,
                                                  const pl_args_moe_combine& args,
                                                  const pl::KernelInfo&, const pl::WorkTile&,
                                                  pl_state_moe_combine_combine&) {
  const uint32_t warp = pl::warp_in_role(at.role.combine);
  const uint32_t vectors = args.cols / kVector;
  for (uint32_t t = blockIdx.x * Params::warps + warp; t < args.tokens;
       t += gridDim.x * Params::warps) {
    for (uint32_t v = pl::lane(); v < vectors; v += pl::kWarpThreads) {
      float acc[kVector] = {};
      for (uint32_t j = 0; j < args.top_k; ++j) {
        const int32_t row = args.slot_of[t * args.top_k + j];
        if (row < 0) continue;
        // rows were written earlier in this launch (another phase): an L2 load, never
        // the non-coherent read-only path.
        const uint4* in = reinterpret_cast<const uint4*>(args.rows + size_t(row) * args.cols);
        add_scaled(acc, args.weights[t * args.top_k + j], __ldcg(in + v));
      }
      uint4 packed;
      __nv_bfloat162* out = reinterpret_cast<__nv_bfloat162*>(&packed);
#pragma unroll
      for (uint32_t i = 0; i < kVector / 2; ++i) {
        out[i] = __floats2bfloat162_rn(acc[2 * i], acc[2 * i + 1]);
      }
      reinterpret_cast<uint4*>(args.out + size_t(t) * args.cols)[v] = packed;
    }
  }
}
