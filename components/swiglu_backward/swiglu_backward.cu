// swiglu_backward: da = (d_gate, d_up) from a = (gate, up) and dh, per 8-column block.
#include <cuda_bf16.h>

#include "pl_swiglu_backward.h"

using Params = pl_params_swiglu_backward;

constexpr uint32_t kBlock = 8;               // gate and up alternate in blocks of 8 columns
constexpr uint32_t kThreads = Params::warps * pl::kWarpThreads;

__device__ __forceinline__ void unpack(const uint4& v, float (&f)[kBlock]) {
  const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (uint32_t i = 0; i < kBlock / 2; ++i) {
    const float2 p = __bfloat1622float2(pairs[i]);
    f[2 * i] = p.x;
    f[2 * i + 1] = p.y;
  }
}

__device__ __forceinline__ uint4 pack(const float (&f)[kBlock]) {
  uint4 v;
  __nv_bfloat162* pairs = reinterpret_cast<__nv_bfloat162*>(&v);
#pragma unroll
  for (uint32_t i = 0; i < kBlock / 2; ++i) {
    pairs[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
  }
  return v;
}

// The gradients of one block of h = silu(gate) * up, in place: gate becomes d_gate
// and up d_up (three blocks of fp32 live, not five: the role runs in 64 registers).
__device__ __forceinline__ void block_backward(float (&gate)[kBlock], float (&up)[kBlock],
                                               const float (&dh)[kBlock]) {
#pragma unroll
  for (uint32_t i = 0; i < kBlock; ++i) {
    const float g = gate[i];
    const float sig = 1.0f / (1.0f + __expf(-g));
    gate[i] = dh[i] * up[i] * sig * (1.0f + g * (1.0f - sig));
    up[i] = dh[i] * g * sig;
  }
}

// Every CTA's perspective, once per launch: its blocks, thread by thread.
extern "C" __device__ void pl_swiglu_backward_elementwise(
    const pl_place_swiglu_backward& at, const pl_args_swiglu_backward& args,
    const pl::KernelInfo&, const pl::WorkTile&, pl_state_swiglu_backward_elementwise&) {
  const uint32_t blocks_per_row = args.cols / kBlock;
  const size_t blocks = size_t(args.rows) * blocks_per_row;
  const uint4* a = reinterpret_cast<const uint4*>(args.a);      // (gate, up) vector pairs
  const uint4* dh = reinterpret_cast<const uint4*>(args.dh);
  uint4* da = reinterpret_cast<uint4*>(args.da);
  for (size_t b = size_t(blockIdx.x) * kThreads + pl::thread_in_role(at.role.elementwise);
       b < blocks; b += size_t(gridDim.x) * kThreads) {
    float gate[kBlock], up[kBlock], grad[kBlock];
    // a and dh were written earlier in this launch: L2 loads.
    unpack(__ldcg(a + 2 * b), gate);
    unpack(__ldcg(a + 2 * b + 1), up);
    unpack(__ldcg(dh + b), grad);
    block_backward(gate, up, grad);
    da[2 * b] = pack(gate);
    da[2 * b + 1] = pack(up);
  }
}
