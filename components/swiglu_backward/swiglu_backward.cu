// swiglu_backward: da = (d_gate, d_up) from a = (gate, up) and dh, per 8-column block.
#include "pl_swiglu_backward.h"

using Params = pl_params_swiglu_backward;

constexpr uint32_t kBlock = pl::vec::kBf16x8;  // gate and up alternate in blocks of 8 columns
constexpr uint32_t kThreads = Params::warps * pl::kWarpThreads;

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
    pl::vec::unpack(__ldcg(a + 2 * b), gate);
    pl::vec::unpack(__ldcg(a + 2 * b + 1), up);
    pl::vec::unpack(__ldcg(dh + b), grad);
    block_backward(gate, up, grad);
    da[2 * b] = pl::vec::pack(gate);
    da[2 * b + 1] = pl::vec::pack(up);
  }
}
