// Tiny sm_100a probes: one __global__ per PTX instruction (tcgen05.*, TMA, mbarrier,
// cluster-launch-control, barriers), each wrapped in the same boilerplate as the
// `probe_baseline` kernel. reference.py compiles this with
//   nvcc -std=c++17 -arch=sm_100a -cubin tcgen05_probes.cu
// and maps each PTX instruction to the SASS opcodes its kernel has beyond the baseline's
// (probe_cluster_baseline for the cta_group::2 / multicast probes, which run in a 2x1x1
// cluster). Never launched: these are compile-only, operands are arbitrary.
#include <cuda.h>
#include <cstdint>

#define PROBE_BODY_BEGIN                                                             \
  __shared__ alignas(1024) unsigned char smem[4096];                                 \
  __shared__ alignas(8) unsigned long long mbar_storage;                             \
  [[maybe_unused]] unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));                \
  [[maybe_unused]] unsigned mb = static_cast<unsigned>(__cvta_generic_to_shared(&mbar_storage));      \
  [[maybe_unused]] unsigned long long tm = reinterpret_cast<unsigned long long>(&tmap);               \
  unsigned r[16] = {0};                                                              \
  (void)d;

#define PROBE_BODY_END                                                               \
  unsigned acc = 0;                                                                  \
  _Pragma("unroll") for (int i = 0; i < 16; ++i) acc += r[i];                        \
  out[threadIdx.x] = acc;

#define PROBE(name, ...)                                                             \
  extern "C" __global__ void __launch_bounds__(128) probe_##name(                    \
      unsigned* out, const __grid_constant__ CUtensorMap tmap, unsigned a,           \
      unsigned long long d) {                                                        \
    PROBE_BODY_BEGIN __VA_ARGS__; PROBE_BODY_END                                     \
  }

#define PROBE2(name, ...)                                                            \
  extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(128)        \
  probe_##name(unsigned* out, const __grid_constant__ CUtensorMap tmap, unsigned a,  \
               unsigned long long d) {                                               \
    PROBE_BODY_BEGIN __VA_ARGS__; PROBE_BODY_END                                     \
  }

#define MMA_F16(CG, A_OPERAND, A_CONSTRAINT)                                         \
  asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %4, 0;\n\t"                     \
               "tcgen05.mma.cta_group::" #CG ".kind::f16 [%0], " A_OPERAND           \
               ", %2, %3, p;\n\t}"                                                   \
               :: "r"(a), A_CONSTRAINT, "l"(d + 8), "r"(a + 7), "r"(a & 1))

PROBE(baseline, )
PROBE2(cluster_baseline, )

// ---- TMEM allocation ------------------------------------------------------------
PROBE(tcgen05_alloc_cg1,
      asm volatile("tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%0], %1;"
                   :: "r"(s), "r"(a)))
PROBE(tcgen05_dealloc_cg1,
      asm volatile("tcgen05.dealloc.cta_group::1.sync.aligned.b32 %0, %1;"
                   :: "r"(a), "r"(128)))
PROBE(tcgen05_relinquish_alloc_permit_cg1,
      asm volatile("tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;"))
PROBE2(tcgen05_alloc_cg2,
       asm volatile("tcgen05.alloc.cta_group::2.sync.aligned.shared::cta.b32 [%0], %1;"
                    :: "r"(s), "r"(a)))
PROBE2(tcgen05_dealloc_cg2,
       asm volatile("tcgen05.dealloc.cta_group::2.sync.aligned.b32 %0, %1;"
                    :: "r"(a), "r"(128)))
PROBE2(tcgen05_relinquish_alloc_permit_cg2,
       asm volatile("tcgen05.relinquish_alloc_permit.cta_group::2.sync.aligned;"))

// ---- MMA and commit --------------------------------------------------------------
PROBE(tcgen05_mma_cg1_f16_ss, MMA_F16(1, "%1", "l"(d)))
PROBE(tcgen05_mma_cg1_f16_ts, MMA_F16(1, "[%1]", "r"(a + 64)))
PROBE(tcgen05_mma_cg1_f16_ss_disable_lane,  // CUTLASS's SM100_MMA_F16BF16_SS form
      asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %4, 0;\n\t"
                   "tcgen05.mma.cta_group::1.kind::f16 [%0], %1, %2, %3, "
                   "{%5, %6, %7, %8}, p;\n\t}"
                   :: "r"(a), "l"(d), "l"(d + 8), "r"(a + 7), "r"(a & 1),
                      "r"(0), "r"(0), "r"(0), "r"(0)))
PROBE2(tcgen05_mma_cg2_f16_ss, MMA_F16(2, "%1", "l"(d)))
PROBE(tcgen05_commit_cg1,
      asm volatile("tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [%0];"
                   :: "r"(mb)))
PROBE2(tcgen05_commit_cg2,
       asm volatile("tcgen05.commit.cta_group::2.mbarrier::arrive::one.shared::cluster.b64 [%0];"
                    :: "r"(mb)))
PROBE2(tcgen05_commit_cg2_multicast,
       asm volatile("tcgen05.commit.cta_group::2.mbarrier::arrive::one.shared::cluster"
                    ".multicast::cluster.b64 [%0], %1;"
                    :: "r"(mb), "h"(static_cast<uint16_t>(a))))

// ---- TMEM <-> registers, smem -> TMEM, fences -------------------------------------
PROBE(tcgen05_ld_32x32b_x16,
      asm volatile("tcgen05.ld.sync.aligned.32x32b.x16.b32 {%0, %1, %2, %3, %4, %5, %6, %7, "
                   "%8, %9, %10, %11, %12, %13, %14, %15}, [%16];"
                   : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]), "=r"(r[4]), "=r"(r[5]),
                     "=r"(r[6]), "=r"(r[7]), "=r"(r[8]), "=r"(r[9]), "=r"(r[10]),
                     "=r"(r[11]), "=r"(r[12]), "=r"(r[13]), "=r"(r[14]), "=r"(r[15])
                   : "r"(a));
      asm volatile("tcgen05.wait::ld.sync.aligned;" ::: "memory"))
PROBE(tcgen05_st_32x32b_x16,
      asm volatile("tcgen05.st.sync.aligned.32x32b.x16.b32 [%0], {%1, %2, %3, %4, %5, %6, %7, "
                   "%8, %9, %10, %11, %12, %13, %14, %15, %16};"
                   :: "r"(a), "r"(a), "r"(a + 1), "r"(a + 2), "r"(a + 3), "r"(a + 4),
                      "r"(a + 5), "r"(a + 6), "r"(a + 7), "r"(a + 8), "r"(a + 9), "r"(a + 10),
                      "r"(a + 11), "r"(a + 12), "r"(a + 13), "r"(a + 14), "r"(a + 15));
      asm volatile("tcgen05.wait::st.sync.aligned;" ::: "memory"))
PROBE(tcgen05_wait_ld, asm volatile("tcgen05.wait::ld.sync.aligned;" ::: "memory"))
PROBE(tcgen05_wait_st, asm volatile("tcgen05.wait::st.sync.aligned;" ::: "memory"))
PROBE(tcgen05_fence_before_thread_sync,
      asm volatile("tcgen05.fence::before_thread_sync;" ::: "memory"))
PROBE(tcgen05_fence_after_thread_sync,
      asm volatile("tcgen05.fence::after_thread_sync;" ::: "memory"))
PROBE(tcgen05_cp_128x256b,
      asm volatile("tcgen05.cp.cta_group::1.128x256b [%0], %1;" :: "r"(a), "l"(d)))

// ---- mbarrier ----------------------------------------------------------------------
PROBE(mbarrier_init,
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(mb), "r"(a)))
PROBE(mbarrier_arrive,
      asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(mb) : "memory"))
PROBE(mbarrier_arrive_expect_tx,
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                   :: "r"(mb), "r"(a) : "memory"))
PROBE(mbarrier_try_wait_parity,
      asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;"
                   "\n\tselp.u32 %0, 1, 0, p;\n\t}"
                   : "=r"(r[0]) : "r"(mb), "r"(a) : "memory"))
PROBE(mbarrier_test_wait_parity,
      asm volatile("{\n\t.reg .pred p;\n\tmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;"
                   "\n\tselp.u32 %0, 1, 0, p;\n\t}"
                   : "=r"(r[0]) : "r"(mb), "r"(a) : "memory"))
PROBE(mbarrier_wait_parity_spin,  // CUTLASS ClusterBarrier::wait: try_wait in a loop
      asm volatile("{\n\t.reg .pred P1;\n\tLAB_WAIT:\n\t"
                   "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n\t"
                   "@P1 bra DONE;\n\tbra LAB_WAIT;\n\tDONE:\n\t}"
                   :: "r"(mb), "r"(a) : "memory"))
PROBE(mbarrier_wait_parity_spin_hint,  // CUTLASS ClusterBarrier::wait (suspend-time hint)
      asm volatile("{\n\t.reg .pred P1;\n\tLAB_WAIT:\n\t"
                   "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1, %2;\n\t"
                   "@P1 bra DONE;\n\tbra LAB_WAIT;\n\tDONE:\n\t}"
                   :: "r"(mb), "r"(a), "r"(0x989680) : "memory"))
PROBE2(mbarrier_arrive_expect_tx_remote_cta,  // ClusterTransactionBarrier (cta_id)
       asm volatile("{\n\t.reg .b32 remAddr32;\n\tmapa.shared::cluster.u32 remAddr32, %0, %1;"
                    "\n\tmbarrier.arrive.expect_tx.shared::cluster.b64 _, [remAddr32], %2;\n\t}"
                    :: "r"(mb), "r"(a & 1), "r"(a) : "memory"))
PROBE2(fence_mbarrier_init_cluster,
       asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"))
PROBE2(mbarrier_arrive_remote_cta,  // CUTLASS ClusterBarrier::arrive(cta_id)
       asm volatile("{\n\t.reg .b32 remAddr32;\n\tmapa.shared::cluster.u32 remAddr32, %0, %1;"
                    "\n\tmbarrier.arrive.shared::cluster.b64 _, [remAddr32];\n\t}"
                    :: "r"(mb), "r"(a & 1) : "memory"))
PROBE(fence_mbarrier_init,
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"))

// ---- TMA / bulk copies ---------------------------------------------------------------
PROBE(tma_load_2d,
      asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                   " [%0], [%1, {%3, %4}], [%2];"
                   :: "r"(s), "l"(tm), "r"(mb), "r"(a), "r"(a + 64) : "memory"))
PROBE2(tma_load_2d_multicast,
       asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                    ".multicast::cluster [%0], [%1, {%3, %4}], [%2], %5;"
                    :: "r"(s), "l"(tm), "r"(mb), "r"(a), "r"(a + 64),
                       "h"(static_cast<uint16_t>(3)) : "memory"))
PROBE2(tma_load_2d_cta_group2,  // CUTLASS SM100_TMA_2SM_LOAD
       asm volatile("cp.async.bulk.tensor.2d.cta_group::2.shared::cluster.global"
                    ".mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];"
                    :: "r"(s), "l"(tm), "r"(mb), "r"(a), "r"(a + 64) : "memory"))
PROBE2(tma_load_2d_cta_group2_multicast,
       asm volatile("cp.async.bulk.tensor.2d.cta_group::2.shared::cluster.global"
                    ".mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%3, %4}], [%2], %5;"
                    :: "r"(s), "l"(tm), "r"(mb), "r"(a), "r"(a + 64),
                       "h"(static_cast<uint16_t>(3)) : "memory"))
PROBE(tma_store_2d,
      asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];"
                   :: "l"(tm), "r"(s), "r"(a), "r"(a + 64) : "memory"))
PROBE(bulk_commit_group, asm volatile("cp.async.bulk.commit_group;" ::: "memory"))
PROBE(bulk_wait_group_read, asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"))
PROBE(bulk_copy_g2s,
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                   " [%0], [%1], %2, [%3];"
                   :: "r"(s), "l"(d), "r"(256), "r"(mb) : "memory"))
PROBE(prefetch_tensormap, asm volatile("prefetch.tensormap [%0];" :: "l"(tm) : "memory"))
PROBE(fence_proxy_async_shared_cta,
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory"))

// ---- scheduling, barriers, warp election ---------------------------------------------
PROBE2(clc_try_cancel_multicast,  // CUTLASS sm100 tile scheduler
       asm volatile("clusterlaunchcontrol.try_cancel.async.shared::cta.mbarrier::complete_tx"
                    "::bytes.multicast::cluster::all.b128 [%0], [%1];"
                    :: "r"(s), "r"(mb) : "memory"))
PROBE(clc_query_cancel,
      asm volatile("{\n\t.reg .b128 res;\n\t.reg .pred p1;\n\tld.shared.b128 res, [%2];\n\t"
                   "clusterlaunchcontrol.query_cancel.is_canceled.pred.b128 p1, res;\n\t"
                   "selp.u32 %1, 1, 0, p1;\n\t"
                   "@p1 clusterlaunchcontrol.query_cancel.get_first_ctaid.v4.b32.b128 "
                   "{%0, _, _, _}, res;\n\t}"
                   : "=r"(r[0]), "=r"(r[1]) : "r"(s) : "memory"))
PROBE(named_barrier_sync, asm volatile("bar.sync 1, 128;" ::: "memory"))
PROBE(named_barrier_arrive, asm volatile("bar.arrive 1, 128;" ::: "memory"))
PROBE2(cluster_arrive_wait,
       asm volatile("barrier.cluster.arrive.release.aligned;\n\t"
                    "barrier.cluster.wait.acquire.aligned;" ::: "memory"))
PROBE(elect_sync,
      asm volatile("{\n\t.reg .pred p;\n\telect.sync _|p, 0xffffffff;\n\tselp.u32 %0, 1, 0, p;\n\t}"
                   : "=r"(r[0])))
