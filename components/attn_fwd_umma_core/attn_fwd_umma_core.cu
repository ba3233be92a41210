// attn_fwd_umma_core: attention forward on Blackwell. The MMA warp issues S = Q K^T and
// O += P V with tcgen05.mma into Tensor Memory; the softmax warpgroup (one query row per
// thread) turns each S into P in Tensor Memory and keeps O's scale right.
//
// Order of the MMA warp per record of n key tiles (global index g over all records):
//   S_0, S_1, PV_0, S_2, PV_1, ..., S_{n-1}, PV_{n-2}, PV_{n-1}
// so S_g is issued after PV_{g-2}. That order is what makes two S and two P buffers
// enough without further barriers:
// - S_g overwrites buffer g % 2, which the softmax read for tile g - 2: it did so before
//   its p_full arrival for g - 2, which the MMA warp waited for before issuing PV_{g-2}.
// - The softmax writes P_g into P buffer g % 2 once s_full reports S_g, and a commit
//   reports every earlier MMA of its thread, PV_{g-2} (the last reader of that buffer)
//   among them. (MMAs into different accumulators are not ordered among themselves;
//   only commits order them here.)
// - O: PV_g waits for p_full of g, which the softmax arrives at only after PV_{g-1} is
//   done (o_done) and O is rescaled; the first PV of a record overwrites O, and the
//   softmax read the last record's O before that p_full.
#include <type_traits>

#include "pl_attn_fwd_umma_core.h"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM100_ALL)
#error "attn_fwd_umma_core issues tcgen05.mma, which only sm_100a has: build it for sm_100a"
#endif

using Params = pl_params_attn_fwd_umma_core;
using Element = Params::dtype;

constexpr uint32_t kTileM = Params::tile_m;
constexpr uint32_t kTileN = Params::tile_n;
constexpr uint32_t kHeadDim = Params::head_dim;
constexpr uint32_t kScoreBuffers = 2;                            // S and P: see the order above
constexpr uint32_t kPair = pl::tcgen05::kPerColumn16;            // bf16 per TMEM column
constexpr uint32_t kPColumns = kTileN / kPair;                   // bf16 pairs per P row
constexpr uint32_t kQKSteps = kHeadDim / pl::tcgen05::kK;        // MMAs per S
constexpr uint32_t kPVSteps = kTileN / pl::tcgen05::kK;          // MMAs per P V
constexpr uint32_t kPStepColumns = pl::tcgen05::kK / kPair;      // P columns per PV MMA
constexpr uint32_t kRowChunk = pl::epi::kTmemLoadColumns;        // floats per tcgen05.ld
constexpr uint32_t kStoreWidth = 32;                             // columns per tcgen05.st
constexpr float kScale = pl::attn::rsqrt_constexpr(float(kHeadDim));
constexpr float kNegInf = -__builtin_huge_valf();
// O keeps its scale until a row's max grows by more than this (log2 units): P stays
// below 2^8, and most key tiles skip the pass over O.
constexpr float kRescaleLog2 = 8.0f;
using OperandV = pl::tcgen05::Sw128Operand<true, kTileN>;        // V: MN-major, K = keys
constexpr uint32_t kIdescScores = pl::tcgen05::idesc_bf16_f32<kTileM, kTileN>();
constexpr uint32_t kIdescOutput = pl::tcgen05::idesc_bf16_f32<kTileM, kHeadDim, false, true>();

static_assert(std::is_same_v<Element, __nv_bfloat16>, "this core multiplies bf16");
static_assert(kTileM == pl::tcgen05::kFullM,
              "query row r is Tensor Memory lane r of an M = 128 MMA: tile_m = 128");
static_assert(kTileN % kRowChunk == 0 && kTileN <= pl::tcgen05::kMaxN,
              "S is read 64 columns at a time and is one MMA wide: tile_n = 64, 128 or 256");
static_assert(kHeadDim % kRowChunk == 0 && kHeadDim <= pl::tcgen05::kMaxN,
              "O is read 64 columns at a time and is one MMA wide: head_dim = 64, 128 or 256");

// ---- The MMA warp -----------------------------------------------------------------------

// S_j = Q K_j^T into the next S buffer; hands the K stage back and reports S once read.
__device__ __forceinline__ void issue_scores(const pl_place_attn_fwd_umma_core& at,
                                             const pl::KernelInfo& k, uint32_t q_stage,
                                             pl_state_attn_fwd_umma_core_mma& st) {
  pl::consumer_wait(at.port.k, st.k);
  pl::tcgen05::fence_after_thread_sync();
  if (pl::elect_one_sync()) {
    const uint32_t k_stage = pl::stage_offset(at.port.k, st.k);
    const uint32_t d = k.tmem_base + at.tmem.s + st.s.stage * kTileN;
#pragma unroll
    for (uint32_t step = 0; step < kQKSteps; ++step) {
      pl::tcgen05::mma_ss(d, pl::tcgen05::desc_boxed_kmajor(q_stage, kTileM, step),
                          pl::tcgen05::desc_boxed_kmajor(k_stage, kTileN, step), kIdescScores,
                          step > 0);
    }
    pl::tcgen05::commit(pl::empty_barrier(at.port.k, st.k));
    pl::tcgen05::commit(pl::own_barrier(at.mbar.s_full, st.s));
  }
  __syncwarp();
  st.k.advance(at.port.k);
  st.s.advance(pl::OwnRing{kScoreBuffers});
}

// O (+)= P V once the softmax has written P (and rescaled O); hands the V stage back and
// reports the P V done. `accumulate` is 0 for a record's first key tile.
__device__ __forceinline__ void issue_output(const pl_place_attn_fwd_umma_core& at,
                                             const pl::KernelInfo& k, bool accumulate,
                                             pl_state_attn_fwd_umma_core_mma& st) {
  pl::consumer_wait(at.port.v, st.v);
  pl::mbar::wait(pl::own_barrier(at.mbar.p_full, st.p), st.p.phase);
  pl::tcgen05::fence_after_thread_sync();
  if (pl::elect_one_sync()) {
    const uint64_t desc_v = OperandV::desc(pl::stage_offset(at.port.v, st.v));
    const uint32_t p = k.tmem_base + at.tmem.p + st.p.stage * kPColumns;
    const uint32_t d = k.tmem_base + at.tmem.o;
#pragma unroll
    for (uint32_t step = 0; step < kPVSteps; ++step) {
      pl::tcgen05::mma_ts(d, p + step * kPStepColumns,
                          pl::tcgen05::desc_advance(desc_v, step * OperandV::kKStepBytes),
                          kIdescOutput, accumulate || step > 0);
    }
    pl::tcgen05::commit(pl::empty_barrier(at.port.v, st.v));
    pl::tcgen05::commit(at.mbar.o_done);
  }
  __syncwarp();
  st.v.advance(at.port.v);
  st.p.advance(pl::OwnRing{kScoreBuffers});
}

// The MMA warp's perspective, per record: tile j's QK^T goes out before tile j - 1's
// P V, so the tensor cores work while the softmax of tile j - 1 finishes.
extern "C" __device__ void pl_attn_fwd_umma_core_mma(const pl_place_attn_fwd_umma_core& at,
                                                     const pl_args_attn_fwd_umma_core&,
                                                     const pl::KernelInfo& k,
                                                     const pl::WorkTile& tile,
                                                     pl_state_attn_fwd_umma_core_mma& st) {
  const uint32_t tiles = tile.k_tiles();
  pl::consumer_wait(at.port.q, st.q);
  const uint32_t q_stage = pl::stage_offset(at.port.q, st.q);
  for (uint32_t j = 0; j < tiles; ++j) {
    issue_scores(at, k, q_stage, st);
    if (j > 0) issue_output(at, k, j > 1, st);
  }
  // Q is read by the scores only (a record with no key tile hands it back at once).
  if (pl::elect_one_sync()) pl::tcgen05::commit(pl::empty_barrier(at.port.q, st.q));
  __syncwarp();
  st.q.advance(at.port.q);
  if (tiles > 0) issue_output(at, k, tiles > 1, st);
}

// ---- The softmax warpgroup --------------------------------------------------------------

// The running softmax state of this thread's row. `max` is what P is taken against (in
// S's units: see logit_unit), which lags the row's true max by less than kRescaleLog2.
struct RowSoftmax {
  float max = kNegInf;
  float sum = 0.0f;
};

// The factor from S as modify_scores leaves it to natural-log logits: with the identity
// score modifier S stays unscaled and the scale rides on the exponent's FFMA.
__device__ __forceinline__ float logit_unit(const pl::KernelInfo& k) {
  return pl_attn_fwd_umma_core_score_identity(k) ? kScale : 1.0f;
}

// `kColumns` floats of this thread's row from Tensor Memory at `taddr`, into v: every
// 64-column load in flight, then one wait.
template <uint32_t kColumns>
__device__ __forceinline__ void load_row(uint32_t taddr, float (&v)[kColumns]) {
#pragma unroll
  for (uint32_t c = 0; c < kColumns; c += kRowChunk) {
    pl::tcgen05::start_load_row_x64(taddr + c, *reinterpret_cast<float (*)[kRowChunk]>(v + c));
  }
  pl::tcgen05::wait_loaded(v);
}

// Applies the score modifier (to the scaled S) and masks, as attn_fwd_core does: per
// element on a tile that reaches past the sequence's last key, or that the blocks
// function does not call full and the mask calls partial.
__device__ __forceinline__ void modify_scores(float (&s)[kTileN], const pl::KernelInfo& k,
                                              const pl::WorkTile& tile, int32_t q,
                                              pl::attn::KvTile kv_tile, int32_t kv_len) {
  const int32_t q_tile = tile.m_block * int32_t(kTileM);
  const int32_t kv_first = kv_tile.index * int32_t(kTileN);
  const bool identity = pl_attn_fwd_umma_core_score_identity(k);
  const bool partial =
      kv_first + int32_t(kTileN) > kv_len ||
      (!kv_tile.full && pl_attn_fwd_umma_core_mask_partial(k, q_tile, q_tile + int32_t(kTileM),
                                                           kv_first, kv_first + int32_t(kTileN)));
  if (identity && !partial) return;
#pragma unroll
  for (uint32_t i = 0; i < kTileN; ++i) {
    const int32_t kv = kv_first + int32_t(i);
    if (!identity) {
      s[i] = pl_attn_fwd_umma_core_score_score(k, s[i] * kScale, tile.group, tile.n_block, q,
                                               kv);
    }
    if (partial && (kv >= kv_len || !pl_attn_fwd_umma_core_mask_keep(k, q, kv))) s[i] = kNegInf;
  }
}

// Online softmax over the row: leaves P = 2^(S to_log2 - max to_log2) in s and returns
// what O must be multiplied by (1: nothing to do).
__device__ __forceinline__ float softmax_row(float (&s)[kTileN], RowSoftmax& sm, float unit) {
  const float to_log2 = unit * pl::attn::kLog2e;
  float row_max = kNegInf;
#pragma unroll
  for (uint32_t i = 0; i < kTileN; ++i) row_max = fmaxf(row_max, s[i]);
  float rescale = 1.0f;
  if (row_max > sm.max && (sm.max == kNegInf || (row_max - sm.max) * to_log2 > kRescaleLog2)) {
    rescale = pl::attn::exp2_approx((sm.max - row_max) * to_log2);   // 0 from -inf
    sm.sum *= rescale;
    sm.max = row_max;
  }
  // A row that has seen no key yet keeps max -inf: exponentiate against 0, so its P is
  // 0, never NaN.
  const float base = sm.max == kNegInf ? 0.0f : sm.max * to_log2;
#pragma unroll
  for (uint32_t i = 0; i < kTileN; ++i) {
    s[i] = pl::attn::exp2_approx(fmaf(s[i], to_log2, -base));
    sm.sum += s[i];
  }
  return rescale;
}

// P as bf16 pairs (the lower key in the low half) into this thread's lane of a P buffer.
__device__ __forceinline__ void store_probabilities(uint32_t taddr, const float (&p)[kTileN]) {
#pragma unroll
  for (uint32_t c = 0; c < kTileN; c += kPair * kStoreWidth) {
    uint32_t packed[kStoreWidth];
#pragma unroll
    for (uint32_t i = 0; i < kStoreWidth; ++i) {
      packed[i] = pl::epi::pack_bf16x2(p[c + kPair * i], p[c + kPair * i + 1]);
    }
    pl::tcgen05::store_row_x32(taddr + c / kPair, packed);
  }
}

// O's row times `factor`, in place in Tensor Memory.
__device__ __forceinline__ void rescale_output(uint32_t taddr, float factor) {
#pragma unroll
  for (uint32_t c = 0; c < kHeadDim; c += kRowChunk) {
    float v[kRowChunk];
    pl::tcgen05::load_row_x64(taddr + c, v);
#pragma unroll
    for (uint32_t half = 0; half < kRowChunk; half += kStoreWidth) {
      uint32_t scaled[kStoreWidth];
#pragma unroll
      for (uint32_t i = 0; i < kStoreWidth; ++i) scaled[i] = __float_as_uint(v[half + i] * factor);
      pl::tcgen05::store_row_x32(taddr + c + half, scaled);
    }
  }
}

// O / sum into o, and the row's log-sum-exp to lse (pl::attn::lse_index; rows past the
// sequence are not written).
__device__ __forceinline__ void finish_row(float (&o)[kHeadDim], const RowSoftmax& sm,
                                           const pl_args_attn_fwd_umma_core& args,
                                           const pl::WorkTile& tile, int32_t q, int32_t kv_len,
                                           float unit) {
  const float inverse = sm.sum > 0.0f ? __fdividef(1.0f, sm.sum) : 0.0f;
#pragma unroll
  for (uint32_t i = 0; i < kHeadDim; ++i) o[i] *= inverse;
  if (q < kv_len) {
    args.lse[pl::attn::lse_index(size_t(tile.m_offset), size_t(tile.n_block), args.lse_rows,
                                 args.lse_heads, uint32_t(q))] =
        sm.sum > 0.0f ? sm.max * unit + __logf(sm.sum) : kNegInf;
  }
}

// The softmax warpgroup's perspective, per record: per key tile, S's row in, P out, O's
// scale kept; then O's row out through the register port.
extern "C" __device__ void pl_attn_fwd_umma_core_softmax(const pl_place_attn_fwd_umma_core& at,
                                                         const pl_args_attn_fwd_umma_core& args,
                                                         const pl::KernelInfo& k,
                                                         const pl::WorkTile& tile,
                                                         pl_state_attn_fwd_umma_core_softmax& st,
                                                         float (&o)[kHeadDim]) {
  const uint32_t row = pl::thread_in_role(at.role.softmax);
  const uint32_t lanes = pl::tcgen05::subpartition_lanes(k.tmem_base,
                                                         pl::warp_in_role(at.role.softmax));
  const int32_t q = tile.m_block * int32_t(kTileM) + int32_t(row);
  const int32_t kv_len = tile.m_end - tile.m_offset;
  const float unit = logit_unit(k);
  RowSoftmax sm;
  for (int32_t step = tile.k_begin; step < tile.k_end; ++step) {
    // Asked before the wait: a block-sparse layout answers from global memory.
    const pl::attn::KvTile kv_tile = pl_attn_fwd_umma_core_blocks_kv_tile(k, tile, step);
    pl::mbar::wait(pl::own_barrier(at.mbar.s_full, st.s), st.s.phase);
    pl::tcgen05::fence_after_thread_sync();
    float s[kTileN];
    load_row(lanes + at.tmem.s + st.s.stage * kTileN, s);
    modify_scores(s, k, tile, q, kv_tile, kv_len);
    const float rescale = softmax_row(s, sm, unit);
    store_probabilities(lanes + at.tmem.p + st.s.stage * kPColumns, s);
    if (step > tile.k_begin) {   // the previous P V must be done before O is touched
      pl::mbar::wait(at.mbar.o_done, st.o.phase);
      st.o.advance(pl::OwnRing{1});
      pl::tcgen05::fence_after_thread_sync();
      if (__any_sync(pl::kFullWarpMask, rescale != 1.0f)) {   // whole warps load and store
        rescale_output(lanes + at.tmem.o, rescale);
      }
    }
    pl::tcgen05::wait_store();
    pl::tcgen05::fence_before_thread_sync();
    pl::mbar::arrive(pl::own_barrier(at.mbar.p_full, st.s));
    st.s.advance(pl::OwnRing{kScoreBuffers});
  }
  if (tile.k_tiles() > 0) {   // the last P V
    pl::mbar::wait(at.mbar.o_done, st.o.phase);
    st.o.advance(pl::OwnRing{1});
    pl::tcgen05::fence_after_thread_sync();
    load_row(lanes + at.tmem.o, o);
  } else {
#pragma unroll
    for (uint32_t i = 0; i < kHeadDim; ++i) o[i] = 0.0f;
  }
  finish_row(o, sm, args, tile, q, kv_len, unit);
}
