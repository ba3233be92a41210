// row_gather: dst[r] = src[index[r]], one warp per row, 16-byte vectors; a row with
// a negative index (a padding row) is written with zeros.
#include "pl_row_gather.h"

using Params = pl_params_row_gather;

constexpr uint32_t kVector = pl::vec::kBf16x8;         // bf16 per 16-byte load and store
constexpr uint32_t kInFlight = pl::vec::kVectorsInFlight;  // loads per lane before its stores

// One row, bit for bit (zeros for a null source): each lane loads kInFlight vectors,
// then stores them. src may have been written earlier in this launch: L2 loads.
__device__ __forceinline__ void copy_row(uint4* out, const uint4* in, uint32_t vectors) {
  pl::vec::batched<kInFlight>(
      pl::lane(), vectors, pl::kWarpThreads,
      [&](uint32_t v) { return in != nullptr ? __ldcg(in + v) : uint4{}; },
      [&](uint32_t v, const uint4& x) { out[v] = x; });
}

// Every CTA's perspective, once per launch: its rows, warp by warp.
extern "C" __device__ void pl_row_gather_copy(const pl_place_row_gather& at,
                                              const pl_args_row_gather& args,
                                              const pl::KernelInfo&, const pl::WorkTile&,
                                              pl_state_row_gather_copy&) {
  const uint32_t warp = pl::warp_in_role(at.role.copy);
  const uint32_t vectors = args.cols / kVector;
  for (uint32_t r = blockIdx.x * Params::warps + warp; r < args.rows;
       r += gridDim.x * Params::warps) {
    const int32_t from = __ldcg(args.index + r);   // written earlier in this launch
    const uint4* in =
        reinterpret_cast<const uint4*>(args.src + size_t(max(from, 0)) * args.cols);
    copy_row(reinterpret_cast<uint4*>(args.dst + size_t(r) * args.cols),
             from < 0 ? nullptr : in, vectors);
  }
}
