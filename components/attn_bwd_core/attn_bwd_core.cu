// attn_bwd_core: the consumer warpgroups of an attention backward, key tile stationary
// (FA2/FA3's order). Warpgroup g owns keys [64g, 64g + 64) of a record's key tile and
// keeps their dK and dV in registers across the record. Per query step it recomputes
// P^T = exp(scale K Q^T - LSE) and dP^T = V dO^T (smem x smem wgmma), forms
// dS^T = scale P^T (dP^T - delta), accumulates dV += P^T dO and dK += dS^T Q with P^T and
// dS^T as register A operands, and adds its share of dQ = dS K (dS through shared
// memory) to an fp32 dQ accumulator in global memory by TMA reductions from shared
// memory: at head dim 128 its columns over every warpgroup's keys (the two meet at a
// barrier each step), at 64 every column over its own keys (each goes at its own pace).
#include "pl_attn_bwd_core.h"
#include "pipelink/wgmma.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "attn_bwd_core issues wgmma, which only sm_90a has: build it for sm_90a"
#endif

using Params = pl_params_attn_bwd_core;
using Element = Params::dtype;
using pl::attn::Fragment;

constexpr uint32_t kTileN = Params::tile_n;                   // keys per record
constexpr uint32_t kTileQ = Params::tile_q;                   // queries per step
constexpr uint32_t kHeadDim = Params::head_dim;
constexpr uint32_t kRows = pl::wgmma::kM;                     // keys per warpgroup
constexpr uint32_t kWarpgroups = kTileN / kRows;
constexpr uint32_t kThreads = kWarpgroups * pl::kWarpgroupThreads;
constexpr uint32_t kScores = kRows * kTileQ / pl::kWarpgroupThreads;    // S^T floats per thread
constexpr uint32_t kGrads = kRows * kHeadDim / pl::kWarpgroupThreads;   // dK (and dV) floats
constexpr uint32_t kBoxColumns = pl::wgmma::kSwizzleBytes / sizeof(Element);   // 64
// dQ = dS K is split between the warpgroups by its columns (each sums over all keys)
// while each gets whole 64-column boxes of K; below that (head_dim 64 over two
// warpgroups) by keys: warpgroup g adds dS[:, its keys] K[its keys, :] to every column.
constexpr bool kDqByKeys = kHeadDim / kWarpgroups < kBoxColumns;
constexpr uint32_t kDqColumns = kDqByKeys ? kHeadDim : kHeadDim / kWarpgroups;
constexpr uint32_t kDq = kTileQ * kDqColumns / pl::kWarpgroupThreads;
constexpr uint32_t kHeadSteps = kHeadDim / pl::wgmma::kK;     // K steps of S^T and dP^T
constexpr uint32_t kQuerySteps = kTileQ / pl::wgmma::kK;      // of dV and dK
constexpr uint32_t kDqKeySteps = (kDqByKeys ? kRows : kTileN) / pl::wgmma::kK;   // of dQ
constexpr uint32_t kDsBytes = kTileN * kTileQ * sizeof(Element);  // one dS^T buffer
constexpr uint32_t kDsBuffers = 2;
constexpr uint32_t kStatsFloats = pl::attn::kStatsRows * kTileQ;   // one step's statistics
constexpr uint32_t kStatsBytes = kStatsFloats * sizeof(float);
constexpr uint32_t kBlocks = kTileQ / pl::epi::kBlockCols;    // 8-column blocks of S^T
constexpr float kScale = pl::attn::rsqrt_constexpr(float(kHeadDim));   // softmax scale
constexpr float kScaleLog2 = kScale * pl::attn::kLog2e;
constexpr float kInf = __builtin_huge_valf();
constexpr uint32_t kAccumulate = 1;
// dQ's partial sums leave through shared memory: per warpgroup, boxes of 32 fp32
// columns (one 128-byte swizzled row) by the step's queries, which one thread adds to
// dq_accum with TMA reductions while the warpgroup goes on.
constexpr uint32_t kDqBoxColumns = pl::wgmma::kSwizzleBytes / sizeof(float);
constexpr uint32_t kDqBoxes = kDqColumns / kDqBoxColumns;
constexpr uint32_t kDqBoxBytes = kTileQ * pl::wgmma::kSwizzleBytes;
constexpr uint32_t kDqStagingBytes = kDqBoxes * kDqBoxBytes;        // one warpgroup's

static_assert(std::is_same_v<Element, __nv_bfloat16>, "this core multiplies bf16");
static_assert(kTileQ == kBoxColumns,
              "dS^T is one 128-byte swizzled row per key: tile_q = 64");
static_assert(kTileN == kRows || kTileN == 2 * kRows,
              "each warpgroup owns 64 keys: tile_n = 64 or 128");
static_assert(kHeadDim == 64 || kHeadDim == 128, "head_dim is 64 or 128");
static_assert(kStatsFloats <= pl::kWarpgroupThreads,
              "one thread of each warpgroup stages each float of a step's statistics");
static_assert(kDqColumns % kBoxColumns == 0, "dQ's columns are whole 64-column boxes of K");
static_assert(kWarpgroups * kDqStagingBytes ==
                  (kTileN > kHeadDim ? kTileN : kHeadDim) * kTileQ * sizeof(float),
              "the contract's dq_staging bytes are every warpgroup's staging");

// Issues S^T = K Q^T and dP^T = V dO^T for this warpgroup's keys and kQueries of the
// step's queries from `first_query` (all of them, or a half) as two committed batches
// (rows: keys; columns: the queries).
template <uint32_t kQueries>
__device__ __forceinline__ void issue_scores(float (&s)[kQueries / 2],
                                             float (&dp)[kQueries / 2], uint32_t k_stage,
                                             uint32_t v_stage, uint32_t q_stage,
                                             uint32_t do_stage, uint32_t first_key,
                                             uint32_t first_query = 0) {
  pl::wgmma::fence_operands(s);
  pl::wgmma::fence_operands(dp);
  pl::wgmma::fence();
#pragma unroll
  for (uint32_t step = 0; step < kHeadSteps; ++step) {
    pl::wgmma::mma_bf16_ss<kQueries>(
        s, pl::wgmma::desc_boxed_kmajor(k_stage, kTileN, first_key, step),
        pl::wgmma::desc_boxed_kmajor(q_stage, kTileQ, first_query, step), step > 0);
  }
  pl::wgmma::commit();
#pragma unroll
  for (uint32_t step = 0; step < kHeadSteps; ++step) {
    pl::wgmma::mma_bf16_ss<kQueries>(
        dp, pl::wgmma::desc_boxed_kmajor(v_stage, kTileN, first_key, step),
        pl::wgmma::desc_boxed_kmajor(do_stage, kTileQ, first_query, step), step > 0);
  }
  pl::wgmma::commit();
}

// A query step's place: its queries [q_first, q_first + tile_q) and this warpgroup's
// keys [kv_first, kv_first + 64) of a sequence of `len` tokens (queries and keys alike).
struct StepTile {
  int32_t q_first;
  int32_t kv_first;
  int32_t len;
  bool partial;      // some element may be masked: ask per element
};

// A step's query statistics (base-2 LSE and delta of its tile_q queries,
// pl::attn::stats_index: written by attn_bwd_prep in this launch, so read through L2)
// go to each warpgroup's own shared buffer, float `index` of the step at `index` * 4
// (ordinary loads and stores). A query past the sequence gets LSE +inf and delta 0
// (P = 0). During each step a warpgroup stages the next step's: early, under the step's
// GEMMs, with contiguous query tiles and no score modifier; late otherwise (a BlockMask's
// mapping and a modifier's per-element work leave no registers for an early load), and
// a late L2 load beside dQ's reductions outlasts most of a step. So with contiguous
// tiles and a modifier the dq_writer warp stages every step's after a record's first two
// (below), and the consumers' loop loads nothing from global memory. Not in the
// deterministic order: there the writer is the slower side (its adds wait their turn)
// and its stores would lengthen every turn of the chain. (Staged by the writer, the
// causal backward without a modifier ran 0.97x-1.01x the early load, its deterministic
// order 0.90x-0.95x, on an H100.)
__device__ __forceinline__ float load_stat(const pl_args_attn_bwd_core& args,
                                           const pl::WorkTile& tile, pl::attn::QueryStep qs,
                                           uint32_t index) {
  const uint32_t kind = index / kTileQ;             // kLseRow, then kDeltaRow
  const int32_t q = qs.q_tile * int32_t(kTileQ) + int32_t(index % kTileQ);
  if (index >= kStatsFloats) return 0.0f;
  if (q >= tile.m_end - tile.m_offset) return kind == pl::attn::kLseRow ? kInf : 0.0f;
  return __ldcg(args.stats + pl::attn::stats_index(uint32_t(qs.head), kind, args.rows,
                                                   tile.m_offset + q));
}

__device__ __forceinline__ void store_stat(uint32_t buffer, float value, uint32_t index) {
  if (index < kStatsFloats) {
    pl::st_shared_f32(buffer + index * uint32_t(sizeof(float)), value);
  }
}

// Whether the dq_writer warp stages the statistics of a record's later steps (above).
__device__ __forceinline__ bool writer_stages(const pl::KernelInfo& k,
                                              const pl_args_attn_bwd_core& args) {
  return pl_attn_bwd_core_q_tiles_contiguous(k) && !pl_attn_bwd_core_score_identity(k) &&
         args.deterministic == 0;
}

// Warpgroup g's statistics buffer of its record's n-th step (two in turn).
__device__ __forceinline__ uint32_t stats_buffer(const pl_place_attn_bwd_core& at,
                                                 uint32_t warpgroup, uint32_t n) {
  return at.smem.stats + (warpgroup * kDsBuffers + n % kDsBuffers) * kStatsBytes;
}

// Two adjacent floats of a statistics row in shared memory.
__device__ __forceinline__ float2 stats_pair(uint32_t stats_stage, uint32_t row, int32_t column) {
  return pl::ld_shared_v2_f32(stats_stage + (row * kTileQ + uint32_t(column)) * sizeof(float));
}

// P^T in place of S^T: exp2(scale log2e S - LSE2) per element with the step's base-2
// LSE (+inf for a query that saw no key or lies past the sequence: P = 0, never NaN),
// 0 where the mask hides the element (asked only on a partial step). With head dim 64
// the registers allow the mask its own pass that other steps branch around; at 128
// that pass's live ranges spill, so there the test is folded into the exponentials.
constexpr bool kMaskPass = kHeadDim == 64;

__device__ __forceinline__ void probabilities(float (&s)[kScores], const pl::KernelInfo& k,
                                              uint32_t stats_stage, Fragment f, StepTile t) {
#pragma unroll
  for (uint32_t j = 0; j < kBlocks; ++j) {
    const int32_t column = f.col0 + int32_t(pl::epi::kBlockCols * j);
    const float2 lse = stats_pair(stats_stage, pl::attn::kLseRow, column);
#pragma unroll
    for (uint32_t e = 0; e < pl::epi::kFloatsPerBlock; ++e) {
      const uint32_t i = pl::epi::kFloatsPerBlock * j + e;
      const int32_t q = t.q_first + column + int32_t(e % Fragment::kColumnsPerThread);
      const int32_t kv = t.kv_first + f.row(uint32_t(Fragment::row_half(i)));
      float p = pl::attn::exp2_approx(fmaf(s[i], kScaleLog2, -(e % 2 == 0 ? lse.x : lse.y)));
      if (!kMaskPass && t.partial &&
          (kv >= t.len || q >= t.len || !pl_attn_bwd_core_mask_keep(k, q, kv))) {
        p = 0.0f;
      }
      s[i] = p;
    }
  }
  if (!kMaskPass || !t.partial) return;
#pragma unroll
  for (uint32_t i = 0; i < kScores; ++i) {
    const int32_t q = t.q_first + f.col0 + Fragment::column(i);
    const int32_t kv = t.kv_first + f.row(uint32_t(Fragment::row_half(i)));
    if (kv >= t.len || q >= t.len || !pl_attn_bwd_core_mask_keep(k, q, kv)) s[i] = 0.0f;
  }
}

// dS^T = scale P^T (dP^T - delta) in place of dP^T.
__device__ __forceinline__ void score_gradients(float (&dp)[kScores], const float (&p)[kScores],
                                                uint32_t stats_stage, Fragment f) {
#pragma unroll
  for (uint32_t j = 0; j < kBlocks; ++j) {
    const int32_t column = f.col0 + int32_t(pl::epi::kBlockCols * j);
    const float2 delta = stats_pair(stats_stage, pl::attn::kDeltaRow, column);
#pragma unroll
    for (uint32_t e = 0; e < pl::epi::kFloatsPerBlock; ++e) {
      const uint32_t i = pl::epi::kFloatsPerBlock * j + e;
      dp[i] = kScale * p[i] * (dp[i] - (e % 2 == 0 ? delta.x : delta.y));
    }
  }
}

// -- the score modifier's step ---------------------------------------------------------
//
// With a modifier m (score_identity() false), P^T = exp2(log2e m(scale S^T) - LSE2) and
// dS^T = scale m'(score) P^T (dP^T - delta): the chain rule needs m'(score) beside P^T
// until dP^T is in, and a modifier's own work beside dP^T's accumulators, which at head
// dim 128 do not fit in a step's registers. So the step runs in halves of its queries,
// each with half of every per-step array: S^T and dP^T of 32 queries (m64n32 wgmma),
// P^T and W = m'(score) P^T straight into bf16 pairs (dV's A operand; dS^T's factor,
// whose rounding is below dS^T's own), dS^T, the half's dV and dK GEMMs (K = its 32
// queries) and its dS^T into the shared tile that dQ's GEMM reads whole.
constexpr uint32_t kHalves = 2;
constexpr uint32_t kHalfQ = kTileQ / kHalves;                 // queries per half
constexpr uint32_t kHalfScores = kScores / kHalves;
constexpr uint32_t kHalfSteps = kQuerySteps / kHalves;        // K steps of its dV and dK
constexpr uint32_t kHalfBlocks = kBlocks / kHalves;           // 8-column blocks of its S^T
constexpr uint32_t kPairsPerStep = 4;                         // bf16 pairs per A fragment
using HalfPairs = uint32_t[kHalfSteps][kPairsPerStep];

static_assert(kHalfQ % pl::wgmma::kK == 0, "a half's queries are whole K steps");

// Element i of a half's accumulator is half i % 2 of pair i / 2 of its A fragments
// (pack_a_operand's order).
__device__ __forceinline__ uint32_t& pair_of(HalfPairs& a, uint32_t i) {
  const uint32_t pair = i / Fragment::kColumnsPerThread;
  return a[pair / kPairsPerStep][pair % kPairsPerStep];
}

// A half's P^T and W in bf16 pairs from its S^T; masked elements (asked on a partial
// step, as probabilities() does) get P = W = 0. grad() is finite everywhere (the
// interface's promise), so W is 0 where P is; where it is 1 (a bias) W is P and the
// two packs are one.
__device__ __forceinline__ void modified_probabilities(const float (&s)[kHalfScores],
                                                       HalfPairs& p, HalfPairs& w,
                                                       const pl::KernelInfo& k,
                                                       uint32_t stats_stage, Fragment f,
                                                       StepTile t, uint32_t half,
                                                       pl::attn::QueryStep qs,
                                                       int32_t sequence) {
#pragma unroll
  for (uint32_t j = 0; j < kHalfBlocks; ++j) {
    const int32_t column = f.col0 + int32_t(half * kHalfQ + pl::epi::kBlockCols * j);
    const float2 lse = stats_pair(stats_stage, pl::attn::kLseRow, column);
#pragma unroll
    for (uint32_t e = 0; e < pl::epi::kFloatsPerBlock; e += Fragment::kColumnsPerThread) {
      const uint32_t i = pl::epi::kFloatsPerBlock * j + e;
      const int32_t kv = t.kv_first + f.row(uint32_t(Fragment::row_half(i)));
      float prob[Fragment::kColumnsPerThread], factor[Fragment::kColumnsPerThread];
#pragma unroll
      for (uint32_t c = 0; c < Fragment::kColumnsPerThread; ++c) {
        const int32_t q = t.q_first + column + int32_t(c);
        const bool keep = !t.partial ||
                          (kv < t.len && q < t.len && pl_attn_bwd_core_mask_keep(k, q, kv));
        const float score = pl_attn_bwd_core_score_score(k, s[i + c] * kScale, sequence,
                                                         qs.head, q, kv);
        prob[c] = keep ? pl::attn::exp2_approx(
                             fmaf(score, pl::attn::kLog2e, -(c == 0 ? lse.x : lse.y)))
                       : 0.0f;
        factor[c] = prob[c] * pl_attn_bwd_core_score_grad(k, score, sequence, qs.head, q, kv);
      }
      pair_of(p, i) = pl::epi::pack_bf16x2(prob[0], prob[1]);
      pair_of(w, i) = pl::epi::pack_bf16x2(factor[0], factor[1]);
    }
  }
}

// A half's dS^T = scale W (dP^T - delta), in bf16 pairs.
__device__ __forceinline__ void modified_score_gradients(const float (&dp)[kHalfScores],
                                                         HalfPairs& w, HalfPairs& ds,
                                                         uint32_t stats_stage, Fragment f,
                                                         uint32_t half) {
#pragma unroll
  for (uint32_t j = 0; j < kHalfBlocks; ++j) {
    const int32_t column = f.col0 + int32_t(half * kHalfQ + pl::epi::kBlockCols * j);
    const float2 delta = stats_pair(stats_stage, pl::attn::kDeltaRow, column);
#pragma unroll
    for (uint32_t e = 0; e < pl::epi::kFloatsPerBlock; e += Fragment::kColumnsPerThread) {
      const uint32_t i = pl::epi::kFloatsPerBlock * j + e;
      float grad[Fragment::kColumnsPerThread];
#pragma unroll
      for (uint32_t c = 0; c < Fragment::kColumnsPerThread; ++c) {
        const float factor = pl::epi::unpack_bf16(pair_of(w, i), c);
        grad[c] = kScale * factor * (dp[i + c] - (c == 0 ? delta.x : delta.y));
      }
      pair_of(ds, i) = pl::epi::pack_bf16x2(grad[0], grad[1]);
    }
  }
}

// Issues dV += P^T dO and dK += dS^T Q (register A, B MN-major: N = head_dim) over
// kSteps K steps of the step's queries from `first_step` (all of them, or a half's) as
// one committed batch.
template <uint32_t kSteps>
__device__ __forceinline__ void issue_key_grads(float (&dk)[kGrads], float (&dv)[kGrads],
                                                uint32_t (&p)[kSteps][4],
                                                uint32_t (&ds)[kSteps][4],
                                                uint32_t q_stage, uint32_t do_stage,
                                                uint32_t first_step = 0) {
  pl::wgmma::fence_fragments(p);
  pl::wgmma::fence_fragments(ds);
  pl::wgmma::fence_operands(dk);
  pl::wgmma::fence_operands(dv);
  pl::wgmma::fence();
#pragma unroll
  for (uint32_t step = 0; step < kSteps; ++step) {
    pl::wgmma::mma_bf16_rs<kHeadDim, true>(
        dv, p[step], pl::wgmma::desc_boxed_mnmajor(do_stage, kTileQ, 0, first_step + step),
        kAccumulate);
  }
#pragma unroll
  for (uint32_t step = 0; step < kSteps; ++step) {
    pl::wgmma::mma_bf16_rs<kHeadDim, true>(
        dk, ds[step], pl::wgmma::desc_boxed_mnmajor(q_stage, kTileQ, 0, first_step + step),
        kAccumulate);
  }
  pl::wgmma::commit();
}

// dS^T's bf16 pairs (the register fragments of dK's GEMM) into a shared [tile_n keys]
// x [64 queries] tile, 128-byte swizzled: row r's 16-byte chunk c sits at chunk
// c ^ (r % 8), so dQ's GEMM reads dS from it M-major. Fragment K step j (of the tile's
// from `first_step`), register r holds 8-column block 2j + r / 2 of row half r % 2.
template <uint32_t kSteps>
__device__ __forceinline__ void store_score_grads(uint32_t buffer,
                                                  const uint32_t (&ds)[kSteps][4],
                                                  Fragment f, uint32_t first_key,
                                                  uint32_t first_step = 0) {
  constexpr uint32_t kRegsPerBlockPair = 2;
#pragma unroll
  for (uint32_t j = 0; j < kSteps; ++j) {
#pragma unroll
    for (uint32_t r = 0; r < 4; ++r) {
      const uint32_t block = kRegsPerBlockPair * (first_step + j) + r / kRegsPerBlockPair;
      const uint32_t row = first_key + uint32_t(f.row(r % kRegsPerBlockPair));
      const uint32_t chunk = block ^ (row % pl::epi::kSwizzleRows);
      const uint32_t offset = buffer + row * pl::epi::kSwizzleRowBytes +
                              chunk * pl::epi::kChunkBytes + uint32_t(f.col0) * sizeof(Element);
      pl::st_shared_b32(offset, ds[j][r]);
    }
  }
}

// The shared-memory tiles a query step multiplies: the record's K and V, the step's Q and
// dO.
struct StepTiles {
  uint32_t k;
  uint32_t v;
  uint32_t q;
  uint32_t d_o;
};

// A query step with a score modifier, half its queries at a time (above); each half's
// dS^T goes into `ds_buffer`. A half's dV and dK GEMMs complete at the next half's first
// wait, the last half's here: on return every GEMM it issued is done and its fragments
// are dead before dQ's GEMM.
__device__ __forceinline__ void modified_step(float (&dk)[kGrads], float (&dv)[kGrads],
                                              StepTiles tiles, const pl::KernelInfo& k,
                                              uint32_t stats_stage, Fragment f, StepTile t,
                                              pl::attn::QueryStep qs, int32_t sequence,
                                              uint32_t first_key, uint32_t ds_buffer) {
  HalfPairs p[kHalves], w[kHalves], ds[kHalves];
#pragma unroll
  for (uint32_t half = 0; half < kHalves; ++half) {
    float s[kHalfScores], dp[kHalfScores];
    // Each half derives its descriptors anew (as the record loop does per step): shared
    // between the halves, they would hold 32 registers across the first.
    uint32_t k_half = tiles.k, v_half = tiles.v;
    asm volatile("" : "+r"(k_half), "+r"(v_half));
    issue_scores<kHalfQ>(s, dp, k_half, v_half, tiles.q, tiles.d_o, first_key, half * kHalfQ);
    pl::wgmma::wait<1>();
    pl::wgmma::fence_operands(s);
    if (half > 0) {
      pl::wgmma::fence_fragments(p[half - 1]);
      pl::wgmma::fence_fragments(ds[half - 1]);
    }
    modified_probabilities(s, p[half], w[half], k, stats_stage, f, t, half, qs, sequence);
    pl::wgmma::wait<0>();
    pl::wgmma::fence_operands(dp);
    modified_score_gradients(dp, w[half], ds[half], stats_stage, f, half);
    issue_key_grads(dk, dv, p[half], ds[half], tiles.q, tiles.d_o, half * kHalfSteps);
    store_score_grads(ds_buffer, ds[half], f, first_key, half * kHalfSteps);
  }
  pl::wgmma::wait<0>();
  pl::wgmma::fence_fragments(p[kHalves - 1]);
  pl::wgmma::fence_fragments(ds[kHalves - 1]);
}

// Issues this warpgroup's share of dQ = dS K (A: dS^T's tile read M-major; B: the K
// tile read MN-major, N = the columns) as one committed batch: its columns over every
// key, or (kDqByKeys) every column over its own keys.
__device__ __forceinline__ void issue_query_grads(float (&dq)[kDq], uint32_t ds_buffer,
                                                  uint32_t k_stage, uint32_t warpgroup) {
  const uint32_t first_box = kDqByKeys ? 0 : warpgroup * kDqColumns / kBoxColumns;
  const uint32_t first_step = kDqByKeys ? warpgroup * kDqKeySteps : 0;
  pl::wgmma::fence_operands(dq);
  pl::wgmma::fence();
#pragma unroll
  for (uint32_t step = 0; step < kDqKeySteps; ++step) {
    pl::wgmma::mma_bf16_ss<kDqColumns, true, true>(
        dq, pl::wgmma::desc_boxed_mnmajor(ds_buffer, kTileN, 0, first_step + step),
        pl::wgmma::desc_boxed_mnmajor(k_stage, kTileN, first_box, first_step + step),
        step > 0);
  }
  pl::wgmma::commit();
}

// dQ's partial sums into this warpgroup's staging boxes, laid out as the 128-byte
// swizzled tile map reads them: 16-byte chunk c of row r at chunk c ^ (r % 8). A quad
// stores one row's 8-column block (two chunks, 32 bytes) at a time, and the swizzle puts
// rows r and r ^ 1 on the same eight banks, so odd rows store their blocks in another
// order (block b ^ kOddRowBlockXor where even rows store b): a half-warp's four rows then
// fill the 32 banks, two wavefronts a store where the one order took four. A thread's
// two rows are 8 apart (the same r % 8), so its addresses are four (one per block order
// slot) plus immediates.
__device__ __forceinline__ void stage_query_grads(const float (&dq)[kDq], uint32_t staging,
                                                  Fragment f) {
  constexpr uint32_t kPairsPerBox = kDqBoxColumns / pl::epi::kBlockCols;   // 8-column blocks
  constexpr uint32_t kBlockBytes = pl::epi::kBlockCols * sizeof(float);     // two chunks
  constexpr uint32_t kOddRowBlockXor = 2;
  static_assert(kOddRowBlockXor < kPairsPerBox, "odd rows reorder blocks within a box");
  const bool odd_row = f.row0 % 2 != 0;
  const uint32_t order = odd_row ? kOddRowBlockXor : 0;
  const uint32_t swizzle = uint32_t(f.row0) % pl::wgmma::kSwizzleRows;
  const uint32_t byte = uint32_t(f.col0) * uint32_t(sizeof(float));         // in its block
  const uint32_t chunk = (byte / pl::epi::kChunkBytes) ^ (swizzle % 2);
  const uint32_t row_base = staging + uint32_t(f.row0) * pl::wgmma::kSwizzleBytes +
                            chunk * pl::epi::kChunkBytes + byte % pl::epi::kChunkBytes;
#pragma unroll
  for (uint32_t block = 0; block < kPairsPerBox; ++block) {
    const uint32_t at = row_base + (block ^ order ^ (swizzle / 2)) * kBlockBytes;
#pragma unroll
    for (uint32_t i = block * pl::epi::kFloatsPerBlock; i < kDq;
         i += kPairsPerBox * pl::epi::kFloatsPerBlock) {
#pragma unroll
      for (uint32_t half = 0; half < Fragment::kRowHalves; ++half) {
        const uint32_t e = i + half * Fragment::kColumnsPerThread;   // this row's pair
        const uint32_t o = e ^ (kOddRowBlockXor * pl::epi::kFloatsPerBlock);   // odd rows'
        const uint32_t box = (e / pl::epi::kFloatsPerBlock) / kPairsPerBox;
        pl::st_shared_v2_f32(at + box * kDqBoxBytes +
                                 half * pl::epi::kHalfRows * pl::wgmma::kSwizzleBytes,
                             odd_row ? dq[o] : dq[e], odd_row ? dq[o + 1] : dq[e + 1]);
      }
    }
  }
}

// One thread: adds the staged boxes to dq_accum [rows, heads, head_dim] from row
// `first_row`. The map clips rows past its end; rows past the sequence within it get
// dQ's rows of queries past the sequence, which are zero (P = 0 there).
__device__ __forceinline__ void reduce_query_grads(const void* map, uint32_t staging,
                                                   int32_t first_row, int32_t head,
                                                   uint32_t first_column) {
#pragma unroll
  for (uint32_t box = 0; box < kDqBoxes; ++box) {
    pl::tma::reduce_add_3d(map, staging + box * kDqBoxBytes,
                           int32_t(first_column + box * kDqBoxColumns), head, first_row);
  }
  pl::tma::store_commit();
}

// Deterministic mode: the dQ partial sums of one (query head, query tile) are added in
// key-tile order. For each warpgroup's share the writer waits until every key tile before
// its own has added its share (a counter per query tile in dq_turns, both warpgroups of a
// key tile counting 1 each; with kDqByKeys, whose warpgroups add to the same columns,
// warpgroup 1 after warpgroup 0), adds, waits until its reductions are done in global
// memory, and counts the share. Records go out in key-tile order and every
// CTA of the persistent grid is resident, so the tiles waited on are running or done.
// The query tile's first key tile comes from the mask's kv_range, which must agree
// with its q_range at tile granularity (the shipped masks do).
__device__ __forceinline__ uint32_t turns_before(const pl::KernelInfo& k,
                                                 const pl::WorkTile& tile, StepTile t) {
  const pl::attn::Span keys = pl_attn_bwd_core_mask_kv_range(
      k, t.q_first, min(t.q_first + int32_t(kTileQ), t.len), t.len);
  return pl::attn::key_tiles_before(keys, t.len, tile.m_block, int32_t(kTileN)) * kWarpgroups;
}

// Where this warpgroup's turn comes: after every key tile before its own, and with
// kDqByKeys after the warpgroups of its own key tile before it.
__device__ __forceinline__ uint32_t my_turn(const pl::KernelInfo& k, const pl::WorkTile& tile,
                                            StepTile t, uint32_t warpgroup) {
  return turns_before(k, tile, t) + (kDqByKeys ? warpgroup : 0);
}

// A warpgroup's dQ staging changes hands with the writer warp at two named barriers of
// the warpgroup and the writer: full (the warpgroup arrives, the writer waits) and empty
// (the other way round). The writer credits empty once before its first record and the
// warpgroup takes the last credit in its tail, so every barrier instance completes.
constexpr uint32_t kHandoffThreads = pl::kWarpgroupThreads + pl::kWarpThreads;

struct Handoff {
  uint32_t full;
  uint32_t empty;
};

__device__ __forceinline__ Handoff handoff_of(const pl_place_attn_bwd_core& at,
                                              uint32_t warpgroup) {
  return warpgroup == 0 ? Handoff{at.bar.dq_full_a, at.bar.dq_empty_a}
                        : Handoff{at.bar.dq_full_b, at.bar.dq_empty_b};
}

// Consumer warpgroups' perspective, per record: the key tile's query steps in order;
// dK and dV leave through the register ports once the record is done.
extern "C" __device__ void pl_attn_bwd_core_mma(const pl_place_attn_bwd_core& at,
                                                const pl_args_attn_bwd_core& args,
                                                const pl::KernelInfo& k,
                                                const pl::WorkTile& tile,
                                                pl_state_attn_bwd_core_mma& st,
                                                float (&dk)[kGrads], float (&dv)[kGrads]) {
  const uint32_t thread = pl::thread_in_role(at.role.mma);
  const uint32_t warpgroup = thread / pl::kWarpgroupThreads;
  const bool releaser = thread % pl::kWarpgroupThreads == 0;   // of the ring stages
  const Fragment f = pl::attn::fragment_of(thread % pl::kWarpgroupThreads);
  const uint32_t first_key = warpgroup * kRows;
  const uint32_t local = thread % pl::kWarpgroupThreads;
  const uint32_t own = warpgroup == 0 ? at.bar.wg_a : at.bar.wg_b;
  // The barrier that publishes a step's dS^T and statistics: both warpgroups' where dQ
  // reads every key's dS^T; with kDqByKeys a warpgroup reads only its own, so it waits
  // for no one and the two drift apart, one's softmax under the other's GEMMs.
  const uint32_t publish = kDqByKeys ? own : at.bar.ds_ready;
  const uint32_t publish_threads = kDqByKeys ? pl::kWarpgroupThreads : kThreads;
  const int32_t len = tile.m_end - tile.m_offset;
  const int32_t kv_first = tile.m_block * int32_t(kTileN) + int32_t(first_key);
#pragma unroll
  for (uint32_t i = 0; i < kGrads; ++i) {
    dk[i] = 0.0f;
    dv[i] = 0.0f;
  }
  const pl::attn::QueryWalk walk = pl::attn::query_walk(tile, args.kv_group);
  // The walk runs over slots; placed() is the step's query tile (the q_tiles function:
  // the slot itself, or a BlockMask's block).
  const auto placed = [&](pl::attn::QueryStep slot) {
    return pl::attn::QueryStep{slot.head,
                               pl_attn_bwd_core_q_tiles_q_tile(k, tile, slot.head, slot.q_tile)};
  };
  pl::attn::QueryStep slot = pl::attn::query_step(tile, tile.k_begin, args.kv_group);
  // Mapped slots (a BlockMask's) are mapped once, a step ahead, and the tile carried.
  // At head dim 128 the mapping's loads and addresses do not fit beside a step's
  // registers otherwise.
  const bool contiguous = pl_attn_bwd_core_q_tiles_contiguous(k);   // a constant after LTO
  const bool identity = pl_attn_bwd_core_score_identity(k);         // likewise
  int32_t mapped_tile = placed(slot).q_tile;
  // The first step's statistics, and the second's where the writer stages the later
  // steps'; otherwise each step stages the next one's, early where it can (load_stat).
  const bool staged_by_writer = writer_stages(k, args);
  const bool early = contiguous && identity;
  if (tile.k_tiles() > 0) {
    const bool second = staged_by_writer && tile.k_begin + 1 < tile.k_end;
    const float first_stat = load_stat(args, tile, {slot.head, mapped_tile}, local);
    const float second_stat = second ? load_stat(args, tile, placed(walk.next(slot)), local)
                                     : 0.0f;
    store_stat(stats_buffer(at, warpgroup, 0), first_stat, local);
    if (second) store_stat(stats_buffer(at, warpgroup, 1), second_stat, local);
    pl::named_sync(publish, publish_threads);
  }
  // K and V after the statistics: those loads' latency runs under the wait for the record's
  // K and V, which with one K/V stage load only once the last record let go of theirs.
  pl::consumer_wait(at.port.kv, st.kv);
  const uint32_t k_stage = pl::stage_offset(at.port.kv, st.kv);
  const uint32_t v_stage = k_stage + kTileN * kHeadDim * uint32_t(sizeof(Element));
  uint32_t n = 0;
  for (int32_t step = tile.k_begin; step < tile.k_end; ++step, ++n) {
    const pl::attn::QueryStep qs{slot.head, contiguous ? slot.q_tile : mapped_tile};
    const pl::attn::QueryStep next_slot = walk.next(slot);
    StepTile t{qs.q_tile * int32_t(kTileQ), kv_first, len, false};
    t.partial = t.kv_first + int32_t(kRows) > len || t.q_first + int32_t(kTileQ) > len ||
                pl_attn_bwd_core_mask_partial(k, t.q_first, t.q_first + int32_t(kTileQ),
                                              t.kv_first, t.kv_first + int32_t(kRows));
    // (Shared addresses from first_key, which every step reads anyway: kept apart
    // across the loop they would cost registers the softmax has none of.)
    pl::consumer_wait(at.port.q, st.q);
    pl::consumer_wait(at.port.d_o, st.d_o);
    const uint32_t stats_stage = stats_buffer(at, warpgroup, n);
    const uint32_t q_stage = pl::stage_offset(at.port.q, st.q);
    const uint32_t do_stage = pl::stage_offset(at.port.d_o, st.d_o);
    // K and V stay for the whole record: without this the compiler keeps their 24
    // descriptors in registers across the loop (48 of them) instead of deriving them
    // per step with a few integer adds.
    uint32_t k_here = k_stage, v_here = v_stage;
    asm volatile("" : "+r"(k_here), "+r"(v_here));
    float s[kScores], dp[kScores], dq[kDq];
    uint32_t p_frag[kQuerySteps][4], ds_frag[kQuerySteps][4];
    if (identity) {
      issue_scores<kTileQ>(s, dp, k_here, v_here, q_stage, do_stage, first_key);
    }
    const bool stage_next = !staged_by_writer && step + 1 < tile.k_end;
    float early_stat = 0.0f;
    if (early && stage_next) early_stat = load_stat(args, tile, placed(next_slot), local);
    if (identity) {
      pl::wgmma::wait<1>();
      pl::wgmma::fence_operands(s);
      probabilities(s, k, stats_stage, f, t);
      pl::wgmma::wait<0>();
      pl::wgmma::fence_operands(dp);
      score_gradients(dp, s, stats_stage, f);
      pl::attn::pack_a_operand(s, p_frag);
      pl::attn::pack_a_operand(dp, ds_frag);
      issue_key_grads(dk, dv, p_frag, ds_frag, q_stage, do_stage);
    } else {
      modified_step(dk, dv, StepTiles{k_here, v_here, q_stage, do_stage}, k, stats_stage, f,
                    t, qs, tile.group, first_key, at.smem.ds + (n % kDsBuffers) * kDsBytes);
    }
    if (!staged_by_writer && step + 1 < tile.k_end) {
      store_stat(stats_buffer(at, warpgroup, n + 1),
                 early ? early_stat : load_stat(args, tile, placed(next_slot), local), local);
    }
    // dS^T (and a BlockMask's next statistics) in shared memory before any reads them:
    // every warpgroup's, or with kDqByKeys the warpgroup's own. Two buffers of each in
    // turn: a warpgroup reaches step n's barrier only after it is done with step n - 1's,
    // so step n + 1's writes never meet step n - 1's reads.
    const uint32_t ds_buffer = at.smem.ds + (n % kDsBuffers) * kDsBytes;
    if (identity) store_score_grads(ds_buffer, ds_frag, f, first_key);
    pl::fence_proxy_async_smem();
    pl::named_sync(publish, publish_threads);
    issue_query_grads(dq, ds_buffer, k_here, warpgroup);
    pl::wgmma::wait<0>();
    pl::wgmma::fence_operands(dk);
    pl::wgmma::fence_operands(dv);
    pl::wgmma::fence_operands(dq);
    if (identity) {
      pl::wgmma::fence_fragments(p_frag);
      pl::wgmma::fence_fragments(ds_frag);
    }
    if (releaser) {
      pl::consumer_release(at.port.q, st.q);
      pl::consumer_release(at.port.d_o, st.d_o);
    }
    st.q.advance(at.port.q);
    st.d_o.advance(at.port.d_o);
    // dQ to shared memory once the writer's adds have read the last step's, then over
    // to the writer.
    const Handoff dq_handoff = handoff_of(at, warpgroup);
    pl::named_sync(dq_handoff.empty, kHandoffThreads);
    stage_query_grads(dq, at.smem.dq_staging + warpgroup * kDqStagingBytes, f);
    pl::fence_proxy_async_smem();
    pl::named_arrive(dq_handoff.full, kHandoffThreads);
    if (step + 1 < tile.k_end && !contiguous) mapped_tile = placed(next_slot).q_tile;
    slot = next_slot;
  }
  // The last step's buffers are done with (by every warpgroup that reads them) before
  // the next record writes.
  if (n > 0) pl::named_sync(publish, publish_threads);
  if (releaser) pl::consumer_release(at.port.kv, st.kv);
  st.kv.advance(at.port.kv);
}

// Once, after the last record: the writer's last credit on this warpgroup's empty
// barrier, taken.
extern "C" __device__ void pl_attn_bwd_core_mma_tail(const pl_place_attn_bwd_core& at,
                                                     const pl_args_attn_bwd_core&,
                                                     const pl::KernelInfo&,
                                                     pl_state_attn_bwd_core_mma&) {
  const uint32_t warpgroup = pl::thread_in_role(at.role.mma) / pl::kWarpgroupThreads;
  pl::named_sync(handoff_of(at, warpgroup).empty, kHandoffThreads);
}

// The writer warp's perspective, once before its first record: every warpgroup's staging
// is free.
extern "C" __device__ void pl_attn_bwd_core_dq_writer_init(const pl_place_attn_bwd_core& at,
                                                           const pl_args_attn_bwd_core&,
                                                           const pl::KernelInfo&,
                                                           pl_state_attn_bwd_core_dq_writer&) {
#pragma unroll
  for (uint32_t g = 0; g < kWarpgroups; ++g) pl::named_arrive(handoff_of(at, g).empty, kHandoffThreads);
}

// The writer warp's perspective, per record: the record's query steps in the consumers'
// order; per step and warpgroup, its staged dQ added to dq_accum from the step's first
// row (rows past the map clip; rows past the sequence within it are dQ's zero rows), in
// key-tile order where deterministic (contiguous query tiles only, as the turns count).
// Where writer_stages, also the statistics of the step two ahead: loaded at the top of the
// step and stored into a warpgroup's buffer once it has handed over this step's dQ, so is
// done with this step's statistics, whose buffer they take; the warpgroup reads them
// after the next step's empty barrier. They are stored after the step's adds are issued
// and waited for, whose waits cover the loads' latency: where the writer is the slower
// side, a store before the adds holds the consumers up by it.
extern "C" __device__ void pl_attn_bwd_core_dq_writer(const pl_place_attn_bwd_core& at,
                                                      const pl_args_attn_bwd_core& args,
                                                      const pl::KernelInfo& k,
                                                      const pl::WorkTile& tile,
                                                      pl_state_attn_bwd_core_dq_writer&) {
  constexpr uint32_t kStatsPerLane = kStatsFloats / pl::kWarpThreads;
  static_assert(kStatsFloats % pl::kWarpThreads == 0, "the warp stages whole statistics");
  const uint32_t lane = pl::lane();
  const bool issuer = lane == 0;
  const bool contiguous = pl_attn_bwd_core_q_tiles_contiguous(k);   // a constant after LTO
  const bool in_turn = contiguous && args.deterministic != 0;
  const bool staged_by_writer = writer_stages(k, args);
  const pl::attn::QueryWalk walk = pl::attn::query_walk(tile, args.kv_group);
  pl::attn::QueryStep slot = pl::attn::query_step(tile, tile.k_begin, args.kv_group);
  pl::attn::QueryStep ahead_slot = walk.next(walk.next(slot));   // two steps on
  const int32_t len = tile.m_end - tile.m_offset;
  uint32_t n = 0;
  for (int32_t step = tile.k_begin; step < tile.k_end; ++step, ++n) {
    const bool stage_ahead = staged_by_writer && step + 2 < tile.k_end;
    float ahead[kStatsPerLane];
    if (stage_ahead) {
#pragma unroll
      for (uint32_t j = 0; j < kStatsPerLane; ++j) {
        ahead[j] = load_stat(args, tile, ahead_slot, lane + j * pl::kWarpThreads);
      }
    }
    const pl::attn::QueryStep qs{
        slot.head, pl_attn_bwd_core_q_tiles_q_tile(k, tile, slot.head, slot.q_tile)};
    const StepTile t{qs.q_tile * int32_t(kTileQ), tile.m_block * int32_t(kTileN), len, false};
#pragma unroll
    for (uint32_t g = 0; g < kWarpgroups; ++g) {
      const Handoff h = handoff_of(at, g);
      const uint32_t staging = at.smem.dq_staging + g * kDqStagingBytes;
      const uint32_t first_column = kDqByKeys ? 0 : g * kDqColumns;
      pl::named_sync(h.full, kHandoffThreads);
      if (issuer && in_turn) {
        uint32_t* turn = pl::attn::dq_turn<kTileQ>(args.dq_turns, args.turns_per_head, tile, qs);
        pl::counter_wait(turn, my_turn(k, tile, t, g));
        pl::tma::fence_proxy_async_global();   // the sums before, then ours
        reduce_query_grads(args.dq_accum, staging, tile.m_offset + t.q_first, qs.head,
                           first_column);
        pl::tma::store_wait<0>();
        pl::tma::fence_proxy_async_global();   // ours, then the count
        pl::counter_release(turn);
      } else if (issuer) {
        reduce_query_grads(args.dq_accum, staging, tile.m_offset + t.q_first, qs.head,
                           first_column);
        pl::tma::store_wait_read<0>();
      }
      if (stage_ahead) {   // after the adds: their waits cover the loads' latency
#pragma unroll
        for (uint32_t j = 0; j < kStatsPerLane; ++j) {
          store_stat(stats_buffer(at, g, n), ahead[j], lane + j * pl::kWarpThreads);
        }
      }
      __syncwarp();
      pl::named_arrive(h.empty, kHandoffThreads);
    }
    slot = walk.next(slot);
    ahead_slot = walk.next(ahead_slot);
  }
}

// Once, after the last record: every dQ reduction is done in global memory before the
// phase that reads dq_accum.
extern "C" __device__ void pl_attn_bwd_core_dq_writer_tail(const pl_place_attn_bwd_core&,
                                                           const pl_args_attn_bwd_core&,
                                                           const pl::KernelInfo&,
                                                           pl_state_attn_bwd_core_dq_writer&) {
  if (pl::lane() == 0) pl::tma::store_wait<0>();
}
