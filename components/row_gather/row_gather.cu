// row_gather: dst[r] = src[index[r]], one warp per row, 16-byte vectors; a row with
// a negative index (a padding row) is written with zeros.
#include "pl_row_gather.h"

using Params = pl_params_row_gather;

constexpr uint32_t kVector = 8;               // bf16 per 16-byte load and store

// Every CTA's perspective, once per launch: its rows, warp by warp.
extern "C" __device__ void pl_row_gather_copy(const pl_place_row_gather& at,
                                              const pl_args_row_gather& args,
                                              const pl::KernelInfo&, const pl::WorkTile&,
                                              pl_state_row_gather_copy&) {
  const uint32_t warp = pl::warp_in_role(at.role.copy);
  const uint32_t vectors = args.cols / kVector;
  for (uint32_t r = blockIdx.x * Params::warps + warp; r < args.rows;
       r += gridDim.x * Params::warps) {
    const int32_t from = args.index[r];
    uint4* out = reinterpret_cast<uint4*>(args.dst + size_t(r) * args.cols);
    if (from < 0) {
      for (uint32_t v = pl::lane(); v < vectors; v += pl::kWarpThreads) out[v] = uint4{};
      continue;
    }
    const uint4* in = reinterpret_cast<const uint4*>(args.src + size_t(from) * args.cols);
    for (uint32_t v = pl::lane(); v < vectors; v += pl::kWarpThreads) out[v] = __ldg(in + v);
  }
}
