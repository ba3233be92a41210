"""Builds the kernels the gpu tests and benchmarks load, into build/gpu/.

    python -m tests.gpu.build [recipe ...]

Runs where nvcc, nvJitLink and OR-Tools are (this is the CPU side); the GPU machine
only loads the results, so carry build/gpu there.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pipelink.build import build_objects, default_index
from pipelink.link import LinkOptions, link_recipe
from pipelink.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = ["pipeline_demo", "gemm", "gemm_auto", "gemm_swiglu_auto", "gemm_streamk",
           "gemm_dynamic", "gemm_multicast", "gemm_pingpong", "gemm_swiglu",
           "gemm_swiglu_streamk", "gemm_swiglu_pingpong",
           "gemm_cute", "gemm_swiglu_cute", "gemm_bias_gelu", "linear", "grouped_gemm", "mlp",
           "moe_ffn", "moe_forward", "moe_layer", "grouped_wgrad", "moe_train",
           "moe_train_simt", "attn_causal", "attn_dense", "attn_softcap", "attn_alibi",
           "attn_sliding", "attn_document", "attn_block_sparse", "attn_paged",
           "attn_causal_deterministic", "attn_causal_d64", "attn_dense_d64",
           "attn_causal_d64_deterministic", "attn_sliding_d64", "attn_block_sparse_d64",
           "attn_paged_d64", "attn_document_d64", "attn_cp_ring", "attn_document_ids"]

# Also linked with phase clocks into <out>/phases/ (bench: where the time goes).
PHASE_CLOCKED = {"mlp", "moe_train", "attn_causal", "attn_dense", "attn_sliding",
                 "attn_block_sparse", "attn_causal_d64", "attn_sliding_d64",
                 "attn_block_sparse_d64"}


def build(names: list[str], out: Path = ROOT / "build" / "gpu") -> None:
    index = default_index(ROOT)
    for name in names:
        recipe = load_recipe(ROOT / "recipes" / f"{name}.yaml")
        # A multi-kernel recipe links one folder per kernel beside kernels.json.
        objects = {kernel: build_objects(view, "sm_90a", index, out / "obj" / "sm_90a")
                   for kernel, view in recipe.select(None, "sm_90a").items()}
        builds = [("linked", "sm_90a", False), ("mono", "mono", False)]
        if name in PHASE_CLOCKED:
            builds.append(("linked", "phases", True))
        for mode, folder, clock in builds:
            results = link_recipe(recipe, objects, out / folder / name,
                                  LinkOptions("sm_90a", mode=mode, phase_clock=clock),
                                  index=index)
            for result in results.values():
                print(f"{result.cubin}: {result.placement.threads} threads, "
                      f"{result.placement.smem_bytes} B smem")


if __name__ == "__main__":
    build(sys.argv[1:] or DEFAULT)
