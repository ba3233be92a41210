// swiglu_backward: da = (d_gate, d_up) from a = (gate, up) and dh, per 8-column block.
#include "pl_swiglu_backward.h"

using Params = pl_params_swiglu_backward;

constexpr uint32_t kBlock = pl::vec::kBf16x8;  // gate and up alternate in blocks of 8 columns
constexpr uint32_t kThreads = Params::warps * pl::kWarpThreads;
constexpr uint32_t kBlocksInFlight = 2;   // per thread: 6 x 16-byte loads outstanding

// The gradients of one block of h = silu(gate) * up, in place: gate becomes d_gate
// and up d_up (three blocks of fp32 live, not five).
__device__ __forceinline__ void block_backward(float (&gate)[kBlock], float (&up)[kBlock],
                                               const float (&dh)[kBlock]) {
#pragma unroll
  for (uint32_t i = 0; i < kBlock; ++i) {
    const float g = gate[i];
    // The fast reciprocal: IEEE division calls a slow-path subroutine that needs
    // registers this role does not budget for (1 / inf is still 0).
    const float sig = __fdividef(1.0f, 1.0f + __expf(-g));
    gate[i] = dh[i] * up[i] * sig * (1.0f + g * (1.0f - sig));
    up[i] = dh[i] * g * sig;
  }
}

// One block's operands: gate and up of a, and dh.
struct BlockIn {
  uint4 gate, up, dh;
};

// Every CTA's perspective, once per launch: its blocks, thread by thread, kBlocksInFlight
// blocks' loads in flight before any is used (a memory-bound pass).
extern "C" __device__ void pl_swiglu_backward_elementwise(
    const pl_place_swiglu_backward& at, const pl_args_swiglu_backward& args,
    const pl::KernelInfo&, const pl::WorkTile&, pl_state_swiglu_backward_elementwise&) {
  const uint32_t blocks_per_row = args.cols / kBlock;
  const size_t blocks = size_t(args.rows) * blocks_per_row;
  const uint4* a = reinterpret_cast<const uint4*>(args.a);      // (gate, up) vector pairs
  const uint4* dh = reinterpret_cast<const uint4*>(args.dh);
  uint4* da = reinterpret_cast<uint4*>(args.da);
  const size_t first = size_t(blockIdx.x) * kThreads + pl::thread_in_role(at.role.elementwise);
  pl::vec::batched<kBlocksInFlight>(
      first, blocks, size_t(gridDim.x) * kThreads,
      // a and dh were written earlier in this launch: L2 loads.
      [&](size_t b) { return BlockIn{__ldcg(a + 2 * b), __ldcg(a + 2 * b + 1), __ldcg(dh + b)}; },
      [&](size_t b, const BlockIn& in) {
        float gate[kBlock], up[kBlock], grad[kBlock];
        pl::vec::unpack(in.gate, gate);
        pl::vec::unpack(in.up, up);
        pl::vec::unpack(in.dh, grad);
        block_backward(gate, up, grad);
        da[2 * b] = pl::vec::pack(gate);
        da[2 * b + 1] = pl::vec::pack(up);
      });
}
