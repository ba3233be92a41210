// CUTLASS's own Blackwell (sm_100a) warp-specialised GEMM, instantiated only (no host
// launcher), as a structural SASS reference for PipeLink's sm_100a kernels.
//
//   C[M,N] (bf16, row-major) = A[M,K] (bf16, row-major = K-major)
//                            @ B[N,K]^T (bf16, CUTLASS "column-major" KxN = K-major [N,K])
//   fp32 accumulation in TMEM, no source operand (ElementC = void: D = alpha * acc).
//
// Configurations (select with -DPL_SM100_CONFIG=1 or =2; default: both in one cubin):
//   1: 1-SM  MMA tile 128x256x64, cluster 1x1x1,
//      KernelTmaWarpSpecialized1SmSm100 / TmaWarpSpecialized1Sm
//   2: 2-SM  MMA tile 256x256x64 (per CTA pair), cluster 2x1x1,
//      KernelTmaWarpSpecialized2SmSm100 / TmaWarpSpecialized2Sm
// Stages: StageCountAutoCarveout<sizeof(epilogue shared storage)>; tile scheduler: the
// kernel's default (void -> CLC-based dynamic persistent scheduler on sm100).
//
// Build (see reference.py, which does this into a temp dir):
//   nvcc -std=c++17 -arch=sm_100a -cubin --expt-relaxed-constexpr \
//        -I<cutlass>/include -I<cutlass>/tools/util/include \
//        -DPL_SM100_CONFIG=1 cutlass_gemm_sm100.cu -o gemm_1sm.cubin
// (The nvcc of CUDA >= 12.8 sets CUTLASS_ARCH_MMA_SM100_SUPPORTED through cutlass/arch/
// config.h, and -arch=sm_100a defines __CUDA_ARCH_FEAT_SM100_ALL: no extra -D needed.)

#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "cutlass/device_kernel.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/thread/linear_combination.h"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/kernel/tile_scheduler_params.h"

#if !defined(CUTLASS_ARCH_MMA_SM100_SUPPORTED)
#error "CUTLASS_ARCH_MMA_SM100_SUPPORTED is not set: needs nvcc >= 12.8"
#endif

#ifndef PL_SM100_CONFIG
#define PL_SM100_CONFIG 0  // 0 = both
#endif

namespace pl_sm100 {

using namespace cute;

using ElementA = cutlass::bfloat16_t;
using LayoutA = cutlass::layout::RowMajor;      // [M,K], K contiguous
using ElementB = cutlass::bfloat16_t;
using LayoutB = cutlass::layout::ColumnMajor;   // KxN column-major == [N,K], K contiguous
using ElementC = void;                          // no source operand
using ElementD = cutlass::bfloat16_t;
using LayoutD = cutlass::layout::RowMajor;      // [M,N], N contiguous
using ElementAccumulator = float;
using ElementCompute = float;
constexpr int AlignmentA = 128 / cutlass::sizeof_bits<ElementA>::value;  // 8
constexpr int AlignmentB = 128 / cutlass::sizeof_bits<ElementB>::value;  // 8
constexpr int AlignmentD = 128 / cutlass::sizeof_bits<ElementD>::value;  // 8
constexpr int AlignmentC = AlignmentD;

template <class MmaTileShape, class ClusterShape, class KernelSchedule, class EpilogueSchedule>
struct Sm100Gemm {
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassTensorOp,
      MmaTileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto,
      ElementAccumulator, ElementCompute,
      ElementC, LayoutD, AlignmentC,
      ElementD, LayoutD, AlignmentD,
      EpilogueSchedule>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassTensorOp,
      ElementA, LayoutA, AlignmentA,
      ElementB, LayoutB, AlignmentB,
      ElementAccumulator,
      MmaTileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<
          static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;

  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<
      Shape<int, int, int, int>,  // M, N, K, L
      CollectiveMainloop,
      CollectiveEpilogue,
      void>;                      // default tile scheduler
};

// (a) 1-SM: 128x256x64 MMA tile, 1x1x1 cluster.
using Gemm1Sm = Sm100Gemm<Shape<_128, _256, _64>, Shape<_1, _1, _1>,
                          cutlass::gemm::KernelTmaWarpSpecialized1SmSm100,
                          cutlass::epilogue::TmaWarpSpecialized1Sm>::GemmKernel;

// (b) 2-SM: 256x256x64 MMA tile over a CTA pair, 2x1x1 cluster.
using Gemm2Sm = Sm100Gemm<Shape<_256, _256, _64>, Shape<_2, _1, _1>,
                          cutlass::gemm::KernelTmaWarpSpecialized2SmSm100,
                          cutlass::epilogue::TmaWarpSpecialized2Sm>::GemmKernel;

}  // namespace pl_sm100

// Forced instantiation plus a few compile-time facts, stored as a __device__ array the
// reference script reads back from the cubin's .nv.global.init (no GPU needed). Order:
//   MaxThreadsPerBlock, SharedStorageSize (dynamic smem bytes), mainloop Stages,
//   AccumulatorPipelineStageCount, SchedulerPipelineStageCount, NumEpilogueThreads
#define PL_SM100_EMIT(tag, Kernel)                                                    \
  extern "C" __host__ void* pl_sm100_gemm_##tag() {                                  \
    return reinterpret_cast<void*>(&cutlass::device_kernel<Kernel>);                 \
  }                                                                                  \
  extern "C" __device__ const unsigned pl_sm100_gemm_##tag##_facts[6] = {             \
      Kernel::MaxThreadsPerBlock,                                                    \
      static_cast<unsigned>(Kernel::SharedStorageSize),                              \
      Kernel::CollectiveMainloop::DispatchPolicy::Stages,                            \
      Kernel::AccumulatorPipelineStageCount,                                         \
      Kernel::SchedulerPipelineStageCount,                                           \
      Kernel::NumEpilogueThreads};

#if PL_SM100_CONFIG == 0 || PL_SM100_CONFIG == 1
PL_SM100_EMIT(1sm, pl_sm100::Gemm1Sm)
#endif

#if PL_SM100_CONFIG == 0 || PL_SM100_CONFIG == 2
PL_SM100_EMIT(2sm, pl_sm100::Gemm2Sm)
#endif
