// attn_bwd_umma_core: attention backward on Blackwell, key tile stationary. The MMA warp
// issues every GEMM of a query step with tcgen05.mma into Tensor Memory; the gradient
// warpgroup (one key row per thread) turns S^T and dP^T into P^T and dS^T and adds dQ
// to the fp32 accumulator in global memory. dK and dV stay in Tensor Memory for the
// whole record and leave through tmem ports.
//
// Per step the MMA warp issues S^T, dP^T (commit: s_full), waits for P^T and dS^T
// (p_full), issues dV, dK and dQ^T (commit: dq_full), then the next step's S^T. One S^T,
// dP^T, P^T, dS^T and dQ^T buffer each suffice, ordered by waits and commits alone:
// - the next S^T and dP^T overwrite what the warpgroup read before its p_full arrival,
//   which the MMA warp waited for first;
// - the warpgroup writes the next P^T and dS^T (Tensor Memory and shared memory) once
//   s_full reports the next S^T, and that commit reports every earlier MMA of its
//   thread, this step's dV, dK and dQ^T (their readers) among them;
// - the next dQ^T overwrites what the warpgroup read before its next p_full arrival.
// The PTX ISA orders tcgen05.mma only into the same accumulator; nothing here needs more.
#include <type_traits>

#include "pl_attn_bwd_umma_core.h"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM100_ALL)
#error "attn_bwd_umma_core issues tcgen05.mma, which only sm_100a has: build it for sm_100a"
#endif

using Params = pl_params_attn_bwd_umma_core;
using Element = Params::dtype;

constexpr uint32_t kTileN = Params::tile_n;                   // keys per record: TMEM lanes
constexpr uint32_t kTileQ = Params::tile_q;                   // queries per step
constexpr uint32_t kHeadDim = Params::head_dim;               // dQ^T's rows: MMA M
constexpr uint32_t kHeadSteps = kHeadDim / pl::tcgen05::kK;   // K steps of S^T and dP^T
constexpr uint32_t kQuerySteps = kTileQ / pl::tcgen05::kK;    // of dV and dK
constexpr uint32_t kKeySteps = kTileN / pl::tcgen05::kK;      // of dQ^T
constexpr uint32_t kPair = pl::tcgen05::kPerColumn16;        // bf16 per TMEM column
constexpr uint32_t kPackedStep = pl::tcgen05::kK / kPair;     // P^T / dS^T columns per MMA
constexpr uint32_t kRowHalves = 2;                            // S^T read half a row at a time
constexpr uint32_t kHalfRow = kTileQ / kRowHalves;
constexpr uint32_t kHalfPacked = kHalfRow / kPair;            // bf16 pairs per half row
constexpr uint32_t kChunkElems = pl::epi::kChunkBytes / sizeof(Element);   // 8 per 16 bytes
constexpr uint32_t kHalfChunks = kHalfRow / kChunkElems;      // 16-byte dS^T chunks per half
constexpr float kScale = pl::attn::rsqrt_constexpr(float(kHeadDim));
constexpr float kScaleLog2 = kScale * pl::attn::kLog2e;
constexpr float kInf = __builtin_huge_valf();
constexpr uint32_t kAddsPerKeyTile = 1;       // deterministic mode: one warpgroup adds dQ
constexpr uint32_t kOneStage = 1;
constexpr uint32_t kStatsBytes = pl::attn::kStatsRows * kTileQ * sizeof(float);  // one step
// Q and dO read MN-major (N = head_dim, K = the step's queries); K^T and dS read
// MN-major with K = the record's keys (M = head_dim; N = the step's queries).
using OperandQ = pl::tcgen05::Sw128Operand<true, kTileQ>;
using OperandKeys = pl::tcgen05::Sw128Operand<true, kTileN>;
constexpr uint32_t kIdescScores = pl::tcgen05::idesc_bf16_f32<kTileN, kTileQ>();
constexpr uint32_t kIdescKeyGrads = pl::tcgen05::idesc_bf16_f32<kTileN, kHeadDim, false, true>();
constexpr uint32_t kIdescQueryGrads = pl::tcgen05::idesc_bf16_f32<kHeadDim, kTileQ, true, true>();

static_assert(std::is_same_v<Element, __nv_bfloat16>, "this core multiplies bf16");
static_assert(kTileN == pl::tcgen05::kFullM,
              "key row r is Tensor Memory lane r of an M = 128 MMA: tile_n = 128");
static_assert(kHeadDim == pl::tcgen05::kFullM || kHeadDim == pl::tcgen05::kM,
              "dQ^T = K^T dS^T is an M = head_dim MMA: head_dim = 64 or 128");
static_assert(kTileQ * sizeof(Element) == pl::epi::kSwizzleRowBytes,
              "a key's dS^T is one 128-byte swizzled row of dQ's operand: tile_q = 64");
static_assert(kTileQ == pl::epi::kTmemLoadColumns, "a step's S^T row is one 64-column load");
static_assert(kHalfPacked == 16, "a half row's pairs are one tcgen05.st .x16: tile_q = 64");
static_assert(pl::attn::kStatsRows * kTileQ == kTileN,
              "one thread of the warpgroup stages each float of a step's statistics");

// ---- The MMA warp -----------------------------------------------------------------------

// S^T = K Q^T and dP^T = V dO^T (rows: the record's keys; columns: the step's queries).
__device__ __forceinline__ void issue_scores(const pl_place_attn_bwd_umma_core& at,
                                             const pl::KernelInfo& k, uint32_t k_stage,
                                             uint32_t v_stage, uint32_t q_stage,
                                             uint32_t do_stage) {
  const uint32_t s = k.tmem_base + at.tmem.s;
  const uint32_t dp = k.tmem_base + at.tmem.dp;
#pragma unroll
  for (uint32_t step = 0; step < kHeadSteps; ++step) {
    pl::tcgen05::mma_ss(s, pl::tcgen05::desc_boxed_kmajor(k_stage, kTileN, step),
                        pl::tcgen05::desc_boxed_kmajor(q_stage, kTileQ, step), kIdescScores,
                        step > 0);
  }
#pragma unroll
  for (uint32_t step = 0; step < kHeadSteps; ++step) {
    pl::tcgen05::mma_ss(dp, pl::tcgen05::desc_boxed_kmajor(v_stage, kTileN, step),
                        pl::tcgen05::desc_boxed_kmajor(do_stage, kTileQ, step), kIdescScores,
                        step > 0);
  }
}

// dV += P^T dO and dK += dS^T Q (A from Tensor Memory), then dQ^T = K^T dS^T (dS^T from
// shared memory). `first` overwrites dK and dV: the record's first step.
__device__ __forceinline__ void issue_grads(const pl_place_attn_bwd_umma_core& at,
                                            const pl::KernelInfo& k,
                                            const pl_state_attn_bwd_umma_core_mma& st,
                                            uint32_t k_stage, uint32_t q_stage,
                                            uint32_t do_stage, bool first) {
  const uint32_t p = k.tmem_base + at.tmem.p;
  const uint32_t ds = k.tmem_base + at.tmem.ds;
  const uint32_t dv = k.tmem_base + pl::stage_column(at.port.dv, st.dv);
  const uint32_t dk = k.tmem_base + pl::stage_column(at.port.dk, st.dk);
  const uint64_t desc_do = OperandQ::desc(do_stage);
  const uint64_t desc_q = OperandQ::desc(q_stage);
#pragma unroll
  for (uint32_t step = 0; step < kQuerySteps; ++step) {
    pl::tcgen05::mma_ts(dv, p + step * kPackedStep,
                        pl::tcgen05::desc_advance(desc_do, step * OperandQ::kKStepBytes),
                        kIdescKeyGrads, !first || step > 0);
  }
#pragma unroll
  for (uint32_t step = 0; step < kQuerySteps; ++step) {
    pl::tcgen05::mma_ts(dk, ds + step * kPackedStep,
                        pl::tcgen05::desc_advance(desc_q, step * OperandQ::kKStepBytes),
                        kIdescKeyGrads, !first || step > 0);
  }
  const uint64_t desc_k = OperandKeys::desc(k_stage);
  const uint64_t desc_ds = OperandKeys::desc(at.smem.ds);
#pragma unroll
  for (uint32_t step = 0; step < kKeySteps; ++step) {
    pl::tcgen05::mma_ss(k.tmem_base + at.tmem.dq,
                        pl::tcgen05::desc_advance(desc_k, step * OperandKeys::kKStepBytes),
                        pl::tcgen05::desc_advance(desc_ds, step * OperandKeys::kKStepBytes),
                        kIdescQueryGrads, step > 0);
  }
}

// The MMA warp's perspective, per record: take dK's and dV's buffers (their epilogues
// have stored the last record's), run the query steps, report the buffers full.
extern "C" __device__ void pl_attn_bwd_umma_core_mma(const pl_place_attn_bwd_umma_core& at,
                                                     const pl_args_attn_bwd_umma_core&,
                                                     const pl::KernelInfo& k,
                                                     const pl::WorkTile& tile,
                                                     pl_state_attn_bwd_umma_core_mma& st) {
  pl::consumer_wait(at.port.kv, st.kv);
  const uint32_t k_stage = pl::stage_offset(at.port.kv, st.kv);
  const uint32_t v_stage = k_stage + kTileN * kHeadDim * uint32_t(sizeof(Element));
  pl::producer_acquire(at.port.dk, st.dk);
  pl::producer_acquire(at.port.dv, st.dv);
  for (int32_t step = tile.k_begin; step < tile.k_end; ++step) {
    pl::consumer_wait(at.port.q, st.q);
    pl::consumer_wait(at.port.d_o, st.d_o);
    const uint32_t q_stage = pl::stage_offset(at.port.q, st.q);
    const uint32_t do_stage = pl::stage_offset(at.port.d_o, st.d_o);
    // K and V stay for the whole record: without this the compiler keeps their 24
    // descriptors in registers across the loop instead of deriving them per step.
    uint32_t k_here = k_stage, v_here = v_stage;
    asm volatile("" : "+r"(k_here), "+r"(v_here));
    pl::tcgen05::fence_after_thread_sync();
    if (pl::elect_one_sync()) {
      issue_scores(at, k, k_here, v_here, q_stage, do_stage);
      pl::tcgen05::commit(at.mbar.s_full);
    }
    __syncwarp();
    pl::mbar::wait(pl::own_barrier(at.mbar.p_full, st.s), st.s.phase);
    st.s.advance(pl::OwnRing{kOneStage});
    pl::tcgen05::fence_after_thread_sync();
    if (pl::elect_one_sync()) {
      issue_grads(at, k, st, k_here, q_stage, do_stage, step == tile.k_begin);
      pl::tcgen05::commit(pl::empty_barrier(at.port.q, st.q));
      pl::tcgen05::commit(pl::empty_barrier(at.port.d_o, st.d_o));
      pl::tcgen05::commit(at.mbar.dq_full);
    }
    __syncwarp();
    st.q.advance(at.port.q);
    st.d_o.advance(at.port.d_o);
  }
  // A record with no step issues no MMA: the commits still arrive, and the epilogues,
  // which read the same record, write zeros.
  if (pl::elect_one_sync()) {
    pl::tcgen05::commit(pl::full_barrier(at.port.dk, st.dk));
    pl::tcgen05::commit(pl::full_barrier(at.port.dv, st.dv));
    pl::tcgen05::commit(pl::empty_barrier(at.port.kv, st.kv));
  }
  __syncwarp();
  st.dk.advance(at.port.dk);
  st.dv.advance(at.port.dv);
  st.kv.advance(at.port.kv);
}

// ---- The gradient warpgroup ---------------------------------------------------------------

// A step's place: its queries [q_first, q_first + tile_q), this thread's key, the
// record's first key, and the sequence's length (queries and keys alike).
struct StepTile {
  int32_t q_first;
  int32_t kv;
  int32_t kv_first;
  int32_t len;
  bool partial;      // some element may be masked: ask per element
};

// A step's statistics, staged: thread i < tile_q loads query i's base-2 LSE, thread
// tile_q + i its delta (pl::attn::stats_index, written by attn_bwd_prep in this launch:
// read through L2), into a shared [2, tile_q] buffer; a query past the sequence gets LSE
// +inf and delta 0 (P = 0). Two buffers in turn and one barrier per step: a thread
// writes step n's only after step n - 1's barrier, which every thread reaches after
// reading step n - 2's.
__device__ __forceinline__ void stage_stats(const pl_args_attn_bwd_umma_core& args,
                                            const pl::WorkTile& tile, int32_t head,
                                            int32_t q_first, int32_t len, uint32_t buffer,
                                            uint32_t thread) {
  const uint32_t kind = thread / kTileQ;            // kLseRow, then kDeltaRow
  const int32_t q = q_first + int32_t(thread % kTileQ);
  float value = kind == pl::attn::kLseRow ? kInf : 0.0f;
  if (q < len) {
    value = __ldcg(args.stats + pl::attn::stats_index(uint32_t(head), kind, args.rows,
                                                      tile.m_offset + q));
  }
  pl::st_shared_f32(buffer + thread * uint32_t(sizeof(float)), value);
}

__device__ __forceinline__ float staged_stat(uint32_t buffer, uint32_t kind, uint32_t i) {
  return pl::ld_shared_f32(buffer + (kind * kTileQ + i) * uint32_t(sizeof(float)));
}

// Whose scores a step's are, for the score modifier: the sequence and the query head.
struct ScoreOf {
  int32_t sequence;
  int32_t head;
};

// This key's half row of dS^T (16-byte chunks from `first`) into the shared [tile_n
// keys] x [tile_q queries] tile, 128-byte swizzled (row r's chunk c at chunk c ^ (r % 8)):
// dQ^T's GEMM reads it as dS, MN-major.
__device__ __forceinline__ void stage_score_grads(uint32_t buffer, uint32_t row, uint32_t first,
                                                  const uint32_t (&packed)[kHalfPacked]) {
  constexpr uint32_t kWordsPerChunk = pl::epi::kChunkBytes / sizeof(uint32_t);
#pragma unroll
  for (uint32_t c = 0; c < kHalfChunks; ++c) {
    const uint32_t* w = packed + c * kWordsPerChunk;
    pl::st_shared_v4(buffer + pl::epi::sw128_offset(row, first + c), w[0], w[1], w[2], w[3]);
  }
}

// P^T = exp2(scale log2e S^T - LSE2) (0 where masked) and dS^T = scale P^T (dP^T -
// delta) along this thread's key row, as bf16 pairs (the lower query in the low half),
// written to Tensor Memory (p_row, ds_row) and dS^T to the shared tile (ds_tile, row
// `key`). With a score modifier m, P^T = exp2(log2e m(scale S^T) - LSE2) and dS^T takes
// m' (the interface's grad, given the score).
// Half a row at a time: S^T and dP^T read from Tensor Memory just before, the pairs
// written out just after. Holding S^T and dP^T of the whole row, or the first half's
// pairs through the second half, would leave too few of the role's registers for the
// statistics the compiler loads ahead and for the values every role keeps live (the
// thread index: at head dim 64 the linked kernel spilled it). The stores are volatile
// statements, which keep their order: the next half's loads wait for this half's pairs.
__device__ __forceinline__ void step_gradients(uint32_t s_row, uint32_t dp_row, uint32_t p_row,
                                               uint32_t ds_row, uint32_t ds_tile, uint32_t key,
                                               const pl::KernelInfo& k, uint32_t stats,
                                               StepTile t, ScoreOf of) {
  const bool identity = pl_attn_bwd_umma_core_score_identity(k);   // a constant after LTO
#pragma unroll
  for (uint32_t half = 0; half < kRowHalves; ++half) {
    float s[kHalfRow], dp[kHalfRow];
    uint32_t p_pairs[kHalfPacked], ds_pairs[kHalfPacked];
    pl::tcgen05::start_load_row_x32(s_row + half * kHalfRow, s);
    pl::tcgen05::start_load_row_x32(dp_row + half * kHalfRow, dp);
    pl::tcgen05::wait_loaded(s);
    pl::tcgen05::wait_loaded(dp);
#pragma unroll
    for (uint32_t j = 0; j < kHalfRow; j += kPair) {
      float p[kPair], ds[kPair];
#pragma unroll
      for (uint32_t h = 0; h < kPair; ++h) {
        const uint32_t i = half * kHalfRow + j + h;     // the query in the step
        const int32_t q = t.q_first + int32_t(i);
        const float lse = staged_stat(stats, pl::attn::kLseRow, i);
        // With a modifier m: P^T = exp2(log2e m(scale S^T) - LSE2) and dS^T takes m'.
        float slope = 1.0f;
        if (identity) {
          p[h] = pl::attn::exp2_approx(fmaf(s[j + h], kScaleLog2, -lse));
        } else {
          const float score = pl_attn_bwd_umma_core_score_score(k, s[j + h] * kScale,
                                                                of.sequence, of.head, q, t.kv);
          p[h] = pl::attn::exp2_approx(fmaf(score, pl::attn::kLog2e, -lse));
          slope = pl_attn_bwd_umma_core_score_grad(k, score, of.sequence, of.head, q, t.kv);
        }
        if (t.partial &&
            (t.kv >= t.len || q >= t.len || !pl_attn_bwd_umma_core_mask_keep(k, q, t.kv))) {
          p[h] = 0.0f;
        }
        ds[h] = kScale * p[h] * (dp[j + h] - staged_stat(stats, pl::attn::kDeltaRow, i));
        if (!identity) ds[h] *= slope;
      }
      p_pairs[j / kPair] = pl::epi::pack_bf16x2(p[0], p[1]);
      ds_pairs[j / kPair] = pl::epi::pack_bf16x2(ds[0], ds[1]);
    }
    stage_score_grads(ds_tile, key, half * kHalfChunks, ds_pairs);
    pl::tcgen05::store_row_x16(p_row + half * kHalfPacked, p_pairs);
    pl::tcgen05::store_row_x16(ds_row + half * kHalfPacked, ds_pairs);
  }
}

// Deterministic mode: a (query head, query tile)'s dQ partial sums are added in key-tile
// order (pl::attn::dq_turn), one warpgroup per key tile: its turn comes after every key
// tile before its own.
__device__ __forceinline__ uint32_t my_turn(const pl::KernelInfo& k, const pl::WorkTile& tile,
                                            StepTile t) {
  const pl::attn::Span keys = pl_attn_bwd_umma_core_mask_kv_range(
      k, t.q_first, min(t.q_first + int32_t(kTileQ), t.len), t.len);
  return pl::attn::key_tiles_before(keys, t.len, tile.m_block, int32_t(kTileN)) *
         kAddsPerKeyTile;
}

// This thread's head dim of dQ^T (the step's queries) added to the fp32 accumulator
// [rows, heads, head_dim], half a row of dQ^T at a time from Tensor Memory; queries past
// the sequence are not added. A warp's threads add adjacent floats of one query row at a
// time (32 of them; at head dim 64, an M = 64 dQ^T, the 16 that hold a row: `held`);
// one pointer walks the rows (a query's row is `heads * head_dim` floats after the
// last's). Every thread loads: tcgen05.ld is warp-wide.
__device__ __forceinline__ void add_query_grads(uint32_t dq_row, float* dq_column, bool held,
                                                uint32_t heads, StepTile t) {
  const size_t stride = size_t(heads) * kHeadDim;
  float* at = dq_column + size_t(t.q_first) * stride;
  const int32_t count = min(int32_t(kTileQ), t.len - t.q_first);
#pragma unroll
  for (uint32_t half = 0; half < kRowHalves; ++half) {
    float dq[kHalfRow];
    pl::tcgen05::start_load_row_x32(dq_row + half * kHalfRow, dq);
    pl::tcgen05::wait_loaded(dq);
#pragma unroll
    for (uint32_t j = 0; j < kHalfRow; ++j) {
      if (int32_t(half * kHalfRow + j) >= count) return;
      if (held) asm volatile("red.global.add.f32 [%0], %1;" :: "l"(at), "f"(dq[j]) : "memory");
      at += stride;
    }
  }
}

// The gradient warpgroup's perspective, per record: per query step, S^T and dP^T in,
// P^T and dS^T out, then dQ^T's row added to the accumulator.
extern "C" __device__ void pl_attn_bwd_umma_core_grad(const pl_place_attn_bwd_umma_core& at,
                                                      const pl_args_attn_bwd_umma_core& args,
                                                      const pl::KernelInfo& k,
                                                      const pl::WorkTile& tile,
                                                      pl_state_attn_bwd_umma_core_grad& st) {
  const uint32_t row = pl::thread_in_role(at.role.grad);   // key row
  const pl::tcgen05::AccumulatorRow<kHeadDim> dq_dim{row};   // dQ^T's head dim, if any
  const uint32_t lanes = pl::tcgen05::subpartition_lanes(k.tmem_base,
                                                         pl::warp_in_role(at.role.grad));
  const int32_t len = tile.m_end - tile.m_offset;
  const int32_t kv_first = tile.m_block * int32_t(kTileN);
  const pl::attn::QueryWalk walk = pl::attn::query_walk(tile, args.kv_group);
  // The walk runs over slots; each step's query tile is its slot's (the q_tiles
  // function: the slot itself, or a BlockMask's block).
  pl::attn::QueryStep slot = pl::attn::query_step(tile, tile.k_begin, args.kv_group);
  for (int32_t step = tile.k_begin; step < tile.k_end; ++step) {
    const pl::attn::QueryStep qs{
        slot.head, pl_attn_bwd_umma_core_q_tiles_q_tile(k, tile, slot.head, slot.q_tile)};
    StepTile t{qs.q_tile * int32_t(kTileQ), kv_first + int32_t(row), kv_first, len, false};
    const uint32_t stats = at.smem.stats + (st.s.phase & 1) * kStatsBytes;
    stage_stats(args, tile, qs.head, t.q_first, len, stats, row);
    pl::named_sync(at.bar.staged, kTileN);
    t.partial = kv_first + int32_t(kTileN) > len || t.q_first + int32_t(kTileQ) > len ||
                pl_attn_bwd_umma_core_mask_partial(k, t.q_first, t.q_first + int32_t(kTileQ),
                                                   kv_first, kv_first + int32_t(kTileN));
    pl::mbar::wait(at.mbar.s_full, st.s.phase);
    pl::tcgen05::fence_after_thread_sync();
    // The row's swizzled chunk addresses, derived per step: kept across the record loop
    // they would hold eight registers the role does not have.
    uint32_t ds_tile = at.smem.ds, ds_key = row;
    asm volatile("" : "+r"(ds_tile), "+r"(ds_key));
    step_gradients(lanes + at.tmem.s, lanes + at.tmem.dp, lanes + at.tmem.p, lanes + at.tmem.ds,
                   ds_tile, ds_key, k, stats, t, ScoreOf{tile.group, qs.head});
    pl::fence_proxy_async_smem();          // the tensor core reads dS^T next
    pl::tcgen05::wait_store();
    pl::tcgen05::fence_before_thread_sync();
    pl::mbar::arrive(pl::own_barrier(at.mbar.p_full, st.s));
    st.s.advance(pl::OwnRing{kOneStage});
    pl::mbar::wait(at.mbar.dq_full, st.dq.phase);
    st.dq.advance(pl::OwnRing{kOneStage});
    pl::tcgen05::fence_after_thread_sync();
    float* dq_column = args.dq_accum + size_t(tile.m_offset) * args.heads * kHeadDim +
                       size_t(qs.head) * kHeadDim + dq_dim.row;
    // Deterministic turns count the key tiles the mask's kv_range gives a query tile;
    // mapped slots (a BlockMask's) skip tiles, so there the sums go in any order.
    if (pl_attn_bwd_umma_core_q_tiles_contiguous(k) && args.deterministic != 0) {
      uint32_t* turn = pl::attn::dq_turn<kTileQ>(args.dq_turns, args.turns_per_head, tile, qs);
      if (row == 0) pl::counter_wait(turn, my_turn(k, tile, t));
      pl::named_sync(at.bar.turn, kTileN);
      add_query_grads(lanes + at.tmem.dq, dq_column, dq_dim.held, args.heads, t);
      pl::named_sync(at.bar.turn, kTileN);
      if (row == 0) pl::counter_release(turn);
    } else {
      add_query_grads(lanes + at.tmem.dq, dq_column, dq_dim.held, args.heads, t);
    }
    slot = walk.next(slot);
  }
}
