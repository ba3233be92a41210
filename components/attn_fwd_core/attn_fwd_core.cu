// attn_fwd_core: the consumer warpgroups of an FA3-class attention forward. Warpgroup
// g owns query rows [64g, 64g + 64) of each tile; per key tile it computes
// S = Q K^T (smem x smem wgmma), applies the linked score modifier and mask, updates
// the online softmax in registers, and accumulates O += P V with P as the register
// operand of the wgmma.
#include "pl_attn_fwd_core.h"
#include "pipelink/wgmma.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "attn_fwd_core issues wgmma, which only sm_90a has: build it for sm_90a"
#endif

using Params = pl_params_attn_fwd_core;
using Element = Params::dtype;

constexpr uint32_t kTileM = Params::tile_m;
constexpr uint32_t kTileN = Params::tile_n;
constexpr uint32_t kHeadDim = Params::head_dim;
constexpr uint32_t kRows = pl::wgmma::kM;                       // query rows per warpgroup
constexpr uint32_t kScores = kRows * kTileN / pl::kWarpgroupThreads;   // S floats per thread
constexpr uint32_t kOutputs = kRows * kHeadDim / pl::kWarpgroupThreads;
constexpr uint32_t kQKSteps = kHeadDim / pl::wgmma::kK;          // wgmma per S
constexpr uint32_t kPVSteps = kTileN / pl::wgmma::kK;            // wgmma per P V
constexpr uint32_t kAccumulate = 1;
constexpr float kScale = pl::attn::rsqrt_constexpr(float(kHeadDim));  // softmax scale
constexpr float kNegInf = -__builtin_huge_valf();
constexpr uint32_t kWarpgroups = kTileM / kRows;
constexpr uint32_t kMaxWarpgroups = 3;          // one turn barrier each: turn_a, _b, _c
constexpr uint32_t kTurnThreads = 2 * pl::kWarpgroupThreads;   // one waits, one hands over
constexpr bool kTakeTurns = kWarpgroups > 1 && Params::turns != 0;
using OperandV = pl::wgmma::Sw128Operand<true, kTileN>;         // V: MN-major, K = keys

static_assert(std::is_same_v<Element, __nv_bfloat16>, "this core multiplies bf16");
static_assert(kTileM % kRows == 0 && kWarpgroups >= 1 && kWarpgroups <= kMaxWarpgroups,
              "each warpgroup owns 64 query rows: tile_m = 64, 128 or 192");
static_assert(kTileN == 64 || kTileN == 128, "S is one m64nN wgmma: tile_n = 64 or 128");
static_assert(kHeadDim == 64 || kHeadDim == 128, "head_dim is 64 or 128");
static_assert(kWarpgroups < kMaxWarpgroups || kHeadDim == 64,
              "three consumer warpgroups get 160 registers each beside the producer, too "
              "few for O at head_dim 128: tile_m 192 needs head_dim 64 (else tile_m 128)");

using pl::attn::Fragment;

// The running softmax state of this thread's two rows (max in S's units: see logit_unit).
struct Softmax {
  float max[2] = {kNegInf, kNegInf};
  float sum[2] = {0.0f, 0.0f};     // this thread's part; the quad adds up at the end
};

// Issues S = Q K^T for this warpgroup's rows as one committed batch (not retired).
__device__ __forceinline__ void issue_scores(float (&s)[kScores], uint32_t q_stage,
                                             uint32_t k_stage, uint32_t warpgroup) {
  pl::wgmma::fence_operands(s);
  pl::wgmma::fence();
#pragma unroll
  for (uint32_t step = 0; step < kQKSteps; ++step) {
    pl::wgmma::mma_bf16_ss<kTileN>(
        s, pl::wgmma::desc_boxed_kmajor(q_stage, kTileM, warpgroup * kRows, step),
        pl::wgmma::desc_boxed_kmajor(k_stage, kTileN, 0, step), step > 0);
  }
  pl::wgmma::commit();
}

// The factor from S as modify_scores leaves it to natural-log logits: with the identity
// score modifier S stays unscaled and the softmax scale rides on the exponent's FFMA
// (the link's LTO folds score_identity() into a constant, so one path remains).
__device__ __forceinline__ float logit_unit(const pl::KernelInfo& k) {
  return pl_attn_fwd_core_score_identity(k) ? kScale : 1.0f;
}

// Applies the score modifier (to the scaled S) and masks: per element on a tile that
// reaches past the sequence's last key, or that the blocks function does not call full
// and the mask calls partial. With the identity modifier a tile that is not partial is
// left as it is (no pass over S at all).
__device__ __forceinline__ void modify_scores(float (&s)[kScores], const pl::KernelInfo& k,
                                              const pl::WorkTile& tile, Fragment f,
                                              int32_t q_first, pl::attn::KvTile kv_tile,
                                              int32_t kv_len) {
  const int32_t q_tile = tile.m_block * int32_t(kTileM);
  const int32_t kv_first = kv_tile.index * int32_t(kTileN);
  const bool identity = pl_attn_fwd_core_score_identity(k);
  const bool partial = kv_first + int32_t(kTileN) > kv_len ||
                       (!kv_tile.full &&
                        pl_attn_fwd_core_mask_partial(k, q_tile, q_tile + int32_t(kTileM),
                                                      kv_first, kv_first + int32_t(kTileN)));
  if (identity) {              // S stays as it is; the mask only on a partial tile
    if (!partial) return;
#pragma unroll
    for (uint32_t i = 0; i < kScores; ++i) {
      const int32_t q = q_first + f.row(Fragment::row_half(i));
      const int32_t kv = kv_first + f.col0 + Fragment::column(i);
      if (kv >= kv_len || !pl_attn_fwd_core_mask_keep(k, q, kv)) s[i] = kNegInf;
    }
    return;
  }
#pragma unroll
  for (uint32_t i = 0; i < kScores; ++i) {
    const int32_t q = q_first + f.row(Fragment::row_half(i));
    const int32_t kv = kv_first + f.col0 + Fragment::column(i);
    s[i] = pl_attn_fwd_core_score_score(k, s[i] * kScale, tile.group, tile.n_block, q, kv);
    if (partial && (kv >= kv_len || !pl_attn_fwd_core_mask_keep(k, q, kv))) s[i] = kNegInf;
  }
}

// Online softmax: folds S (logits times 1 / unit) into the running max and sum and
// leaves P = exp(S - max) in S; returns in `rescale` what O's rows must be multiplied by
// (O is still being accumulated by the previous tile's P V, so the caller applies it
// once that retires).
__device__ __forceinline__ void softmax_tile(float (&s)[kScores], Softmax& sm, float unit,
                                             float (&rescale)[2]) {
  const float to_log2 = unit * pl::attn::kLog2e;
  float tile_max[2] = {kNegInf, kNegInf};
#pragma unroll
  for (uint32_t i = 0; i < kScores; ++i) {
    tile_max[Fragment::row_half(i)] = fmaxf(tile_max[Fragment::row_half(i)], s[i]);
  }
  float base[2];
#pragma unroll
  for (uint32_t r = 0; r < 2; ++r) {
    const float max = fmaxf(sm.max[r], pl::attn::quad_max(tile_max[r]));
    // A row that has seen no key yet keeps max -inf: exponentiate against 0 instead,
    // so its P and its rescale are 0, never NaN.
    base[r] = max == kNegInf ? 0.0f : max * to_log2;
    rescale[r] = pl::attn::exp2_approx(sm.max[r] * to_log2 - base[r]);
    sm.max[r] = max;
    sm.sum[r] *= rescale[r];
  }
#pragma unroll
  for (uint32_t i = 0; i < kScores; ++i) {
    const uint32_t r = Fragment::row_half(i);
    s[i] = pl::attn::exp2_approx(fmaf(s[i], to_log2, -base[r]));
    sm.sum[r] += s[i];
  }
}

__device__ __forceinline__ void rescale_output(float (&o)[kOutputs], const float (&rescale)[2]) {
#pragma unroll
  for (uint32_t i = 0; i < kOutputs; ++i) o[i] *= rescale[Fragment::row_half(i)];
}

// Issues O += P V as one committed batch (not retired: P's registers stay live until
// the caller's fence_fragments after the wait).
__device__ __forceinline__ void issue_output(float (&o)[kOutputs], uint32_t (&p)[kPVSteps][4],
                                             uint32_t v_stage) {
  const uint64_t desc_v = OperandV::desc(v_stage);
  pl::wgmma::fence_fragments(p);
  pl::wgmma::fence_operands(o);
  pl::wgmma::fence();
#pragma unroll
  for (uint32_t step = 0; step < kPVSteps; ++step) {
    pl::wgmma::mma_bf16_rs<kHeadDim, true>(
        o, p[step], pl::wgmma::desc_advance(desc_v, step * OperandV::kKStepBytes), kAccumulate);
  }
  pl::wgmma::commit();
}

// The warpgroups take turns at issuing their GEMMs (one turn: a key tile's QK^T and
// the previous tile's P V), so one warpgroup's softmax runs while another's wgmma keep
// the tensor cores busy. The turn goes round a ring: warpgroup g waits on barrier
// turn[g] and hands the turn to warpgroup g + 1 (the last to warpgroup 0) on its
// barrier. Each barrier joins two warpgroups, one arriving and one waiting, and one
// turn is ever in flight, so no barrier sees a second arrival before its wait. Per
// tile the last turn comes back to warpgroup 0, which takes it and then releases
// warpgroup 1 from the tile, which releases warpgroup 2: so no arrival of the next
// tile can meet one of this tile's syncs, whatever runs between tiles.
struct Turns {
  uint32_t mine;
  uint32_t next;
  uint32_t warpgroup;
  __device__ void wait() const {
    if constexpr (kTakeTurns) pl::named_sync(mine, kTurnThreads);
  }
  __device__ void pass() const {
    if constexpr (kTakeTurns) pl::named_arrive(next, kTurnThreads);
  }
  __device__ void open_tile() const {   // warpgroup 0 takes the first turn
    if (kTakeTurns && warpgroup == kWarpgroups - 1) pl::named_arrive(next, kTurnThreads);
  }
  __device__ void close_tile() const {
    if constexpr (kTakeTurns) {
      // Two branches, each with its sync: one sync before the branch made ptxas lay out
      // the whole loop's registers anew (the two-warpgroup SASS stays as it was).
      if (warpgroup < kWarpgroups - 1) {
        pl::named_sync(mine, kTurnThreads);     // the turn the one before hands back
        pl::named_arrive(next, kTurnThreads);   // the next warpgroup may leave the tile
      } else {
        pl::named_sync(mine, kTurnThreads);
      }
    }
  }
};

// Warpgroup g's barrier and the next one's in the ring (turn_a, turn_b, turn_c).
__device__ __forceinline__ Turns turns_of(const pl_place_attn_fwd_core& at, uint32_t warpgroup) {
  constexpr bool three = kWarpgroups == kMaxWarpgroups;
  const uint32_t mine = warpgroup == 0 ? at.bar.turn_a
                        : !three || warpgroup == 1 ? at.bar.turn_b : at.bar.turn_c;
  const uint32_t next = warpgroup == 0 ? at.bar.turn_b
                        : three && warpgroup == 1 ? at.bar.turn_c : at.bar.turn_a;
  return Turns{mine, next, warpgroup};
}

// O / sum, and the row's log-sum-exp to lse (pl::attn::lse_index; rows past the sequence
// are not written).
__device__ __forceinline__ void finish_rows(float (&o)[kOutputs], Softmax& sm,
                                            const pl_args_attn_fwd_core& args,
                                            const pl::WorkTile& tile, Fragment f,
                                            int32_t q_first, int32_t kv_len, float unit,
                                            bool writer) {
  float inverse[2];
#pragma unroll
  for (uint32_t r = 0; r < 2; ++r) {
    const float sum = pl::attn::quad_sum(sm.sum[r]);
    inverse[r] = sum > 0.0f ? __fdividef(1.0f, sum) : 0.0f;   // MUFU.RCP, no slow path
    const int32_t q = q_first + f.row(r);
    if (writer && q < kv_len) {
      const float lse = sum > 0.0f ? sm.max[r] * unit + __logf(sum) : kNegInf;
      args.lse[pl::attn::lse_index(size_t(tile.m_offset), size_t(tile.n_block), args.lse_rows,
                                   args.lse_heads, uint32_t(q))] = lse;
    }
  }
#pragma unroll
  for (uint32_t i = 0; i < kOutputs; ++i) o[i] *= inverse[Fragment::row_half(i)];
}

// Consumer warpgroups' perspective, per record: the key tiles software-pipelined, so
// tile j's softmax runs while tile j - 1's P V is on the tensor cores.
extern "C" __device__ void pl_attn_fwd_core_mma(const pl_place_attn_fwd_core& at,
                                                const pl_args_attn_fwd_core& args,
                                                const pl::KernelInfo& k,
                                                const pl::WorkTile& tile,
                                                pl_state_attn_fwd_core_mma& st,
                                                float (&o)[kOutputs]) {
  const uint32_t thread = pl::thread_in_role(at.role.mma);
  const uint32_t warpgroup = thread / pl::kWarpgroupThreads;
  const bool releaser = thread % pl::kWarpgroupThreads == 0;
  const Fragment f = pl::attn::fragment_of(thread % pl::kWarpgroupThreads);
  const Turns turns = turns_of(at, warpgroup);
  const int32_t kv_len = tile.m_end - tile.m_offset;
  const int32_t q_first = tile.m_block * int32_t(kTileM) + int32_t(warpgroup * kRows);
  const float unit = logit_unit(k);
  Softmax sm;
#pragma unroll
  for (uint32_t i = 0; i < kOutputs; ++i) o[i] = 0.0f;
  pl::consumer_wait(at.port.q, st.q);
  const uint32_t q_stage = pl::stage_offset(at.port.q, st.q);
  if (tile.k_tiles() > 0) {
    float s[kScores], rescale[2];
    uint32_t p[kPVSteps][4];
    turns.open_tile();
    // Each step's key tile is asked of the blocks function before the step's waits: a
    // block-sparse layout answers from global memory, and the waits hide that read.
    pl::attn::KvTile kv_tile = pl_attn_fwd_core_blocks_kv_tile(k, tile, tile.k_begin);
    // The first key tile: its scores alone.
    pl::consumer_wait(at.port.k, st.k);
    turns.wait();
    issue_scores(s, q_stage, pl::stage_offset(at.port.k, st.k), warpgroup);
    turns.pass();
    pl::wgmma::wait<0>();
    pl::wgmma::fence_operands(s);
    if (releaser) pl::consumer_release(at.port.k, st.k);
    st.k.advance(at.port.k);
    modify_scores(s, k, tile, f, q_first, kv_tile, kv_len);
    softmax_tile(s, sm, unit, rescale);
    pl::attn::pack_a_operand(s, p);
    for (int32_t step = tile.k_begin + 1; step < tile.k_end; ++step) {
      // Tile j's scores and tile j - 1's P V in flight together.
      kv_tile = pl_attn_fwd_core_blocks_kv_tile(k, tile, step);
      pl::consumer_wait(at.port.k, st.k);
      pl::consumer_wait(at.port.v, st.v);
      turns.wait();
      issue_scores(s, q_stage, pl::stage_offset(at.port.k, st.k), warpgroup);
      issue_output(o, p, pl::stage_offset(at.port.v, st.v));
      turns.pass();
      pl::wgmma::wait<1>();                 // the scores (the older batch) are in
      pl::wgmma::fence_operands(s);
      if (releaser) pl::consumer_release(at.port.k, st.k);
      st.k.advance(at.port.k);
      modify_scores(s, k, tile, f, q_first, kv_tile, kv_len);
      softmax_tile(s, sm, unit, rescale);
      pl::wgmma::wait<0>();                 // P V is in: O and P are free
      pl::wgmma::fence_operands(o);
      pl::wgmma::fence_fragments(p);
      if (releaser) pl::consumer_release(at.port.v, st.v);
      st.v.advance(at.port.v);
      rescale_output(o, rescale);
      pl::attn::pack_a_operand(s, p);
    }
    // The last tile's P V.
    pl::consumer_wait(at.port.v, st.v);
    turns.wait();
    issue_output(o, p, pl::stage_offset(at.port.v, st.v));
    turns.pass();
    pl::wgmma::wait<0>();
    pl::wgmma::fence_operands(o);
    pl::wgmma::fence_fragments(p);
    if (releaser) pl::consumer_release(at.port.v, st.v);
    st.v.advance(at.port.v);
    turns.close_tile();
  }
  if (releaser) pl::consumer_release(at.port.q, st.q);
  st.q.advance(at.port.q);
  finish_rows(o, sm, args, tile, f, q_first, kv_len, unit, f.col0 == 0);
}
