// moe_combine_backward: d_rows[slot] = p dy[t], dp = <dy[t], rows[slot]>; padding
// rows zero. One warp per token, 16-byte vectors, fixed reduction order.
#include "pl_moe_combine_backward.h"

using Params = pl_params_moe_combine_backward;

constexpr uint32_t kVector = pl::vec::kBf16x8;
constexpr uint32_t kInFlight = pl::vec::kVectorsInFlight;   // per lane, per operand

// A vector of dy and the same vector of each of C choices' rows.
template <uint32_t C>
struct Vectors {
  uint4 dy, row[C];
};

// C choices' rows of one token at once: d_row[c] = p[c] dy, and the lane's share of
// <dy, row[c]> in column order, kInFlight / C of the lane's vectors of each operand
// loaded before any is used.
template <uint32_t C>
__device__ __forceinline__ void choices_backward(float (&dot)[C], const uint4* dy,
                                                 const uint4* const (&row)[C],
                                                 uint4* const (&d_row)[C], const float (&p)[C],
                                                 uint32_t vectors) {
  static_assert(kInFlight % C == 0, "the loads in flight split evenly over the choices");
#pragma unroll
  for (uint32_t c = 0; c < C; ++c) dot[c] = 0.0f;
  pl::vec::batched<kInFlight / C>(
      pl::lane(), vectors, pl::kWarpThreads,
      // rows were written earlier in this launch: an L2 load, never the non-coherent
      // read-only path (dy is an input: its vectors are L1 hits after the first choice).
      [&](uint32_t v) {
        Vectors<C> x;
        x.dy = __ldg(dy + v);
#pragma unroll
        for (uint32_t c = 0; c < C; ++c) x.row[c] = __ldcg(row[c] + v);
        return x;
      },
      [&](uint32_t v, const Vectors<C>& x) {
        float g[kVector];
        pl::vec::unpack(x.dy, g);
#pragma unroll
        for (uint32_t c = 0; c < C; ++c) {
          float y[kVector];
          pl::vec::unpack(x.row[c], y);
#pragma unroll
          for (uint32_t e = 0; e < kVector; ++e) dot[c] += g[e] * y[e];
          d_row[c][v] = pl::vec::pack(g, p[c]);
        }
      });
}

// Choices j, j + 1, ... (C of them, all with a row) of token t: their rows' gradients
// and their weights' gradients.
template <uint32_t C>
__device__ __forceinline__ void choices_of_token(const pl_args_moe_combine_backward& args,
                                                 const uint4* dy, const pl::vec::Choice (&c)[C],
                                                 size_t first_choice, uint32_t vectors) {
  const uint4* rows[C];
  uint4* d_rows[C];
  float p[C], dot[C];
#pragma unroll
  for (uint32_t i = 0; i < C; ++i) {
    const size_t offset = size_t(c[i].slot) * args.cols;
    rows[i] = reinterpret_cast<const uint4*>(args.rows + offset);
    d_rows[i] = reinterpret_cast<uint4*>(args.d_rows + offset);
    p[i] = c[i].weight;
  }
  choices_backward<C>(dot, dy, rows, d_rows, p, vectors);
#pragma unroll
  for (uint32_t i = 0; i < C; ++i) {
    const float sum = pl::warp_sum(dot[i]);
    if (pl::lane() == 0) args.dp[first_choice + i] = sum;
  }
}

// One choice alone; a negative slot (no row) gets dp 0.
__device__ __forceinline__ void choice_of_token(const pl_args_moe_combine_backward& args,
                                                const uint4* dy, const pl::vec::Choice& c,
                                                size_t choice, uint32_t vectors) {
  if (c.slot < 0) {
    if (pl::lane() == 0) args.dp[choice] = 0.0f;
    return;
  }
  const pl::vec::Choice one[1] = {c};
  choices_of_token<1>(args, dy, one, choice, vectors);
}

// One token's choices, two at a time (both rows' loads in flight together). Lane j
// holds choice j's row and weight (pl::vec::lane_choice): read once, not per choice.
__device__ __forceinline__ void token_backward(const pl_args_moe_combine_backward& args,
                                               uint32_t t, uint32_t vectors) {
  const uint4* dy = reinterpret_cast<const uint4*>(args.dy + size_t(t) * args.cols);
  const size_t first = size_t(t) * args.top_k;
  // slot_of was written earlier in this launch: L2 loads (lane_choice), never __ldg
  const pl::vec::Choice mine =
      pl::vec::lane_choice(args.slot_of + first, args.weights + first, args.top_k);
  pl::vec::for_choice_pairs(
      mine, args.top_k,
      [&](uint32_t j, const pl::vec::Choice& c0, const pl::vec::Choice& c1) {
        const pl::vec::Choice two[2] = {c0, c1};
        choices_of_token<2>(args, dy, two, first + j, vectors);
      },
      [&](uint32_t j, const pl::vec::Choice& c) {
        choice_of_token(args, dy, c, first + j, vectors);
      });
}

// The warp's rows first, first + stride, ... that hold no token (padding) zeroed: lane
// i reads the token of the i-th of 32 rows at once, then the padding rows among them
// are zeroed one after another (a segment's padding rows go to different warps).
__device__ __forceinline__ void zero_padding(const pl_args_moe_combine_backward& args,
                                             uint32_t first, uint32_t stride, uint32_t vectors) {
  for (uint32_t base = first; base < args.total_rows; base += pl::kWarpThreads * stride) {
    const uint32_t r = base + pl::lane() * stride;
    const bool padding = r < args.total_rows && __ldcg(args.token_of + r) < 0;
    for (uint32_t rows = __ballot_sync(~0u, padding); rows != 0; rows &= rows - 1) {
      const uint32_t row = base + (__ffs(rows) - 1) * stride;
      uint4* out = reinterpret_cast<uint4*>(args.d_rows + size_t(row) * args.cols);
      for (uint32_t v = pl::lane(); v < vectors; v += pl::kWarpThreads) out[v] = uint4{};
    }
  }
}

// Every CTA's perspective, once per launch: its tokens, then its padding rows.
extern "C" __device__ void pl_moe_combine_backward_backward(
    const pl_place_moe_combine_backward& at, const pl_args_moe_combine_backward& args,
    const pl::KernelInfo&, const pl::WorkTile&, pl_state_moe_combine_backward_backward&) {
  const uint32_t warp = pl::warp_in_role(at.role.backward);
  const uint32_t vectors = args.cols / kVector;
  const uint32_t first = blockIdx.x * Params::warps + warp;
  const uint32_t stride = gridDim.x * Params::warps;
  for (uint32_t t = first; t < args.tokens; t += stride) token_backward(args, t, vectors);
  zero_padding(args, first, stride, vectors);
}
