// PipeLink device-side ABI: everything a component needs to read its placement.
//
// A component never hard-codes where it sits. Shared-memory offsets, mbarrier
// addresses, named-barrier ids, warp bases and stage counts arrive in its placement
// struct (generated from its own contract as pl_<component>.h) and, after nvJitLink's
// LTO inlines the entry, fold into immediates.
#pragma once

#include "pipelink/types.cuh"
#include "pipelink/smem.cuh"
#include "pipelink/cluster.cuh"
#include "pipelink/mbarrier.cuh"
#include "pipelink/named_barrier.cuh"
#include "pipelink/pipeline.cuh"
#include "pipelink/work.cuh"
#include "pipelink/raster.cuh"
#include "pipelink/tma.cuh"
#include "pipelink/warp.cuh"
#include "pipelink/vec.cuh"
#include "pipelink/cp_async.cuh"
#include "pipelink/global_handoff.cuh"
#include "pipelink/splitk.cuh"
#include "pipelink/phase.cuh"
#include "pipelink/wgmma.cuh"
#include "pipelink/tcgen05.cuh"
#include "pipelink/epilogue.cuh"
#include "pipelink/tmem_epilogue.cuh"
#include "pipelink/attention.cuh"
