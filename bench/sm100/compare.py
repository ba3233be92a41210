"""PipeLink's sm_100a GEMM beside CUTLASS's own, instruction class by instruction class,
and a throughput model of it on a B200. Nothing here has run on a Blackwell GPU: there
is none to run on. The comparison is of SASS, the model is arithmetic.

    .venv/bin/python bench/sm100/reference.py                  # CUTLASS's kernels (once)
    .venv/bin/python bench/sm100/compare.py --json bench/sm100/compare.json
    .venv/bin/python bench/sm100/compare.py --report bench/sm100/compare.json

It links recipes/gemm.yaml for sm_100a with the real pipeline (nvcc, nvJitLink), counts
the SASS with the same :func:`reference.instruction_mix` that counted CUTLASS's 1-SM
128x256x64 kernel (cutlass_reference.json), and writes both per k-tile (the MMA warp's
loop, the TMA producer's loop) and per tile (the epilogue). The model times the
GEMM shapes of bench/gemm_swiglu.json on a B200 from its published rates, next to what
the same shapes measured on the H200.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(ROOT), str(HERE)]

from reference import instruction_mix  # noqa: E402

ARCH = "sm_100a"
# (PipeLink recipe, CUTLASS kernel of cutlass_reference.json, what both are)
PAIRS = [("gemm", "1sm_128x256x64_cluster1x1x1",
          "one CTA per 128x256 tile: cta_group::1, KernelTmaWarpSpecialized1SmSm100"),
         ("gemm_pair", "2sm_256x256x64_cluster2x1x1",
          "a CTA pair per 256x256 tile: cta_group::2 in a 2x1x1 cluster, "
          "KernelTmaWarpSpecialized2SmSm100")]
TILE_M, TILE_N, TILE_K = 128, 256, 64       # recipes/gemm.yaml and the CUTLASS kernel
MMAS_PER_K_TILE = TILE_K // 16              # K = 16 per bf16 tcgen05.mma
STORE_N = 64                                # tmem_store_epilogue's chunk (CUTLASS: 32)

# B200 (HGX B200, per GPU), as NVIDIA publishes them: the model's only inputs.
B200 = {"sms": 148, "bf16_dense_flops": 2.25e15, "hbm_bytes_per_s": 8.0e12}
SPLITK = {"max_pieces": 160, "max_splits": 16, "min_k_tiles": 4,   # splitk_scheduler params
          "cost_unit": 1024, "fixup_cost": 1024 // 32}                 # and its cost model


# -- the instruction mix --------------------------------------------------------------------

def link_recipe(name: str, out: Path) -> Path:
    """recipes/<name>.yaml linked for sm_100a; the cubin's path."""
    from pipelink.build import build_objects, default_index
    from pipelink.link import LinkOptions, link_kernel
    from pipelink.recipe import load_recipe
    index = default_index(ROOT)
    recipe = load_recipe(ROOT / "recipes" / f"{name}.yaml")
    objects = build_objects(recipe, ARCH, index, out / "obj")
    return link_kernel(recipe, objects, out / name, LinkOptions(ARCH), index=index).cubin


def per_k_tile(loops: list[dict], cls: str, per_tile: int) -> dict:
    """Classes per k-tile over the innermost loops issuing `cls` (PipeLink's producer
    has one loop per operand ring), normalised by `per_tile` of `cls` per k-tile."""
    total: dict[str, float] = {}
    for loop in loops:
        for name, n in loop["classes"].items():
            total[name] = total.get(name, 0) + n
    k_tiles = total.get(cls, 0) / per_tile
    return {"instructions": sum(total.values()) / k_tiles,
            **{name: n / k_tiles for name, n in sorted(total.items())}}


def digest(mix: dict, tmem_loads_per_tile: int, tma_stores_per_tile: int) -> dict:
    """What the comparison shows of one kernel's mix."""
    g = mix["groups"]
    return {
        "mma_loop": per_k_tile(mix["loops"]["tcgen05_mma"], "tcgen05_mma", MMAS_PER_K_TILE),
        "tma_loop": per_k_tile(mix["loops"]["tma_load"], "tma_load", 2),
        "epilogue": {"tmem_loads_per_tile": tmem_loads_per_tile,
                     "tmem_load_opcodes": sorted(mix["opcodes"].get("tmem_load", {})),
                     "tma_stores_per_tile": tma_stores_per_tile},
        "kernel": {"instructions": mix["total_instructions"], "hgmma": g["hgmma"],
                   "local_memory": g["local_memory"],
                   "tmem_alloc_dealloc_relinquish": g["tmem_alloc_dealloc_relinquish"],
                   "utc_opcodes": mix["utc_opcodes"]},
    }


def ours(name: str, out: Path) -> dict:
    from tests.integration.sass import sass
    cubin = link_recipe(name, out)
    placement = json.loads((cubin.parent / "placement.json").read_text())
    meta = json.loads((cubin.parent / "kernel.json").read_text())
    mix = instruction_mix(sass(cubin))
    d = digest(mix, TILE_N // STORE_N, TILE_N // STORE_N)
    d["resources"] = {"threads": meta["block"][0], "dynamic_smem_bytes": meta["dynamic_smem"],
                      "tmem_columns": sum(c for _, c in placement["tmem"].values())}
    return d


def cutlass(kernel: str) -> dict:
    ref = json.loads((HERE / "cutlass_reference.json").read_text())
    k = ref["kernels"][kernel]
    loads = k["instruction_mix"]["groups"]["tmem_ld_st"]
    stores = k["instruction_mix"]["classes"].get("tma_store", 0)
    d = digest(k["instruction_mix"], loads, stores)
    d["resources"] = {"threads": k["threads_per_cta"], "dynamic_smem_bytes":
                      k["dynamic_smem_bytes"], "tmem_columns": k["tmem_columns_allocated"],
                      "registers": k["registers"]}
    d["versions"] = ref["versions"]
    return d


# -- the throughput model -------------------------------------------------------------------

def model_ms(m: int, n: int, k: int) -> dict:
    """A B200 time for C = A @ B^T (bf16, fp32 accumulation) from the instruction counts:
    the MMA warp issues MMAS_PER_K_TILE M = 128 x N = 256 x K = 16 MMAs per k-tile,
    each at the SM's share of the dense bf16 rate, so a k-tile takes a fixed time; the
    tiles run in whole waves over the SMs and the partial last wave is split along K as
    splitk_scheduler does. The epilogue overlaps the next tile's MMAs (two TMEM
    buffers); the memory floor bounds it from below. A model, not a measurement."""
    sms = B200["sms"]
    per_sm = B200["bf16_dense_flops"] / sms
    k_tile_s = MMAS_PER_K_TILE * 2 * TILE_M * TILE_N * 16 / per_sm
    tiles = math.ceil(m / TILE_M) * math.ceil(n / TILE_N)
    k_tiles = math.ceil(k / TILE_K)
    waves, tail = divmod(tiles, sms)
    splits, rounds = tail_split(tail, sms, k_tiles)
    tail_k_tiles = rounds * math.ceil(k_tiles / splits) if tail else 0
    compute = (waves * k_tiles + tail_k_tiles) * k_tile_s
    moved = 2 * (m * k + n * k + m * n)
    memory = moved / B200["hbm_bytes_per_s"]
    floor = max(2 * m * n * k / B200["bf16_dense_flops"], memory)
    return {"model_ms": max(compute, memory) * 1e3, "floor_ms": floor * 1e3,
            "tiles": tiles, "waves": waves, "tail_splits": splits}


def tail_split(tail: int, sms: int, k_tiles: int) -> tuple[int, int]:
    """splitk_scheduler's split of a tail of ``tail`` tiles: (pieces a tile, rounds)."""
    best, best_cost = 1, SPLITK["cost_unit"]
    most = min(k_tiles // SPLITK["min_k_tiles"], SPLITK["max_splits"])
    for s in range(2, most + 1):
        if tail * (s - 1) > SPLITK["max_pieces"]:
            break
        cost = (math.ceil(tail * s / sms) * SPLITK["cost_unit"] // s
                + (s - 1) * SPLITK["fixup_cost"])
        if cost < best_cost:
            best, best_cost = s, cost
    return best, math.ceil(tail * best / sms) if tail else 0


def model_rows() -> list[dict]:
    rows = []
    data = json.loads((ROOT / "bench" / "gemm_swiglu.json").read_text())
    if "H200" not in data["gpu"]:   # the table's measured columns are labelled H200
        raise SystemExit(f"bench/gemm_swiglu.json was measured on {data['gpu']}, not an "
                         "H200: rerun bench/gemm_swiglu.py on an H200 first")
    for r in data["rows"]:
        b200 = model_ms(r["M"], r["N"], r["K"])
        rows.append({"M": r["M"], "N": r["N"], "K": r["K"],
                     "h200_linked_ms": r["gemm"]["linked"], "h200_cublas_ms": r["gemm"]["cublas"],
                     "h200_floor_ms": r["floor_gemm"], **{f"b200_{k}": v for k, v in b200.items()}})
    return rows


def run() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        comparisons = [{"recipe": recipe, "cutlass_kernel": kernel, "what": what,
                        "pipelink": ours(recipe, Path(tmp)), "cutlass": cutlass(kernel)}
                       for recipe, kernel, what in PAIRS]
    return {"comparisons": comparisons, "b200": B200, "model": model_rows()}


# -- RESULTS.md -----------------------------------------------------------------------------

# Every row the table shows: (label, section, key).
ROWS = [
    ("tcgen05.mma (UTCHMMA) per k-tile", "mma_loop", "tcgen05_mma"),
    ("tcgen05.commit (UTCBAR) per k-tile", "mma_loop", "tcgen05_commit"),
    ("mbarrier waits per k-tile, MMA warp", "mma_loop", "mbarrier_try_wait"),
    ("MMA-loop instructions per k-tile", "mma_loop", "instructions"),
    ("TMA loads per k-tile", "tma_loop", "tma_load"),
    ("arrive.expect_tx per k-tile", "tma_loop", "mbarrier_arrive_expect_tx"),
    ("TMA-loop instructions per k-tile", "tma_loop", "instructions"),
    ("tcgen05.ld per tile (per thread)", "epilogue", "tmem_loads_per_tile"),
    ("TMA stores per tile", "epilogue", "tma_stores_per_tile"),
    ("threads per CTA", "resources", "threads"),
    ("dynamic shared memory (bytes)", "resources", "dynamic_smem_bytes"),
    ("Tensor Memory columns", "resources", "tmem_columns"),
    ("HGMMA", "kernel", "hgmma"),
    ("local memory instructions", "kernel", "local_memory"),
]

WHY = [
    "**Commits and expect_tx.** PipeLink's loader fills two rings (A and B), so the MMA warp "
    "commits once per ring and the producer arms two barriers per k-tile; CUTLASS keeps A and "
    "B in one stage (one commit, one expect_tx). Two rings let another producer feed one "
    "operand alone (tma_loader's contract); the price is one commit and one arrive per k-tile, "
    "a few issue slots against 512 cycles of MMA.",
    "**Instructions per k-tile.** Both loops rebuild the four descriptors with uniform-datapath "
    "arithmetic; PipeLink's adds the second ring's wait, commit and stage advance.",
    "**TMA loop.** Both walk a k-tile per iteration with one elected lane issuing the copies. "
    "PipeLink's waits for and arms two barriers (two rings) and re-reads two fields of the "
    "work record from shared memory per k-tile (it reads records in place, and each wait's "
    "memory clobber forces the reload); CUTLASS's arms one and checks a guard (a trap).",
    "**Epilogue.** PipeLink reads 64 columns per tcgen05.ld (32x32b.x64) into a 128-byte "
    "swizzled staging row, four TMA stores of 128x64 per tile; CUTLASS reads 32 columns per "
    "load (.x32) and stores eight 128x32 subtiles. Both use one warpgroup, one row per thread.",
    "**Warps.** Both run 256 threads: CUTLASS has an MMA warp, a scheduler warp (cluster launch "
    "control), a TMA warp, an idle C-load warp and four epilogue warps; PipeLink has a "
    "scheduler warp (a static persistent schedule with a split-K tail), a TMA warp, an MMA "
    "warp, an idle padding warp and four epilogue warps.",
    "**Shared memory.** PipeLink's placer takes the most stages that fit (4 of 48 KiB plus "
    "32 KiB of staging); CUTLASS's carveout leaves more for its epilogue and collective "
    "storage.",
    "**Tensor Memory.** Both allocate all 512 columns: two accumulator buffers of 256, so the "
    "epilogue of one tile overlaps the MMAs of the next.",
    "**CTA pairs.** Both pair kernels issue UTCHMMA.2CTA from the leader only, commit with "
    "UTCBAR.2CTA.MULTICAST to both CTAs and load with UTMALDG.2CTA (each CTA its rows of A and "
    "half of B, completing on the leader's barrier); neither multicasts a TMA load, since in a "
    "2x1x1 cluster no other CTA shares an operand tile. Each CTA stages half of B, so a stage "
    "is 32 KiB and both get 6 stages. The counts above are the leader's code path; the peer "
    "runs the same kernel with the MMA skipped.",
]


def _cell(value: float | int) -> str:
    return f"{value:g}" if isinstance(value, (int, float)) else str(value)


def report(path: Path) -> None:
    """Writes the '## Blackwell sm_100a' section of RESULTS.md from the JSON."""
    data = json.loads(path.read_text())
    comparisons = data["comparisons"]
    ours_d = comparisons[0]["pipelink"]
    v = comparisons[0]["cutlass"]["versions"]
    lines = ["## Blackwell sm_100a: built and compared, not run", "",
             "**None of this has run.** No Blackwell GPU is available: the sm_100a kernels are "
             "built, linked and read as SASS, and the times below are a model. Generated by "
             f"`python bench/sm100/compare.py --report bench/sm100/{path.name}`.", "",
             f"### Against CUTLASS {v.get('cutlass_headers', '')}'s own sm_100 GEMM "
             "(CollectiveBuilder, the same tile and cluster shapes)", ""]
    lines += [f"- `recipes/{c['recipe']}.yaml` vs `{c['cutlass_kernel']}`: {c['what']}."
              for c in comparisons]
    lines += ["", "bf16 in, fp32 in Tensor Memory, bf16 out, one CTA per SM, nvcc "
              f"{v.get('nvcc', '')}. Per CTA:", "",
              "| | " + " | ".join(f"PipeLink {c['recipe']} | CUTLASS {c['cutlass_kernel'][:3]}"
                                  for c in comparisons) + " |",
              "| --- |" + " --- | --- |" * len(comparisons)]
    for label, section, key in ROWS:
        cells = [_cell(c[who][section].get(key, 0)) for c in comparisons
                 for who in ("pipelink", "cutlass")]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "Every difference, explained:", ""] + [f"- {w}" for w in WHY]
    b = data["b200"]
    per_sm = b["bf16_dense_flops"] / b["sms"]
    k_tile_ns = MMAS_PER_K_TILE * 2 * TILE_M * TILE_N * 16 / per_sm * 1e9
    lines += ["", "### Throughput model (B200, not measured)", "",
              f"Inputs: {b['sms']} SMs, {b['bf16_dense_flops'] / 1e15:g} PFLOP/s dense bf16, "
              f"{b['hbm_bytes_per_s'] / 1e12:g} TB/s HBM (NVIDIA's published HGX B200 "
              "figures). A k-tile is four M = 128 MMAs at the SM's share of the rate; tiles "
              "run in waves with splitk_scheduler's tail; the epilogue is hidden by the second "
              "TMEM buffer; never below the memory floor. H200 columns are measured (CUDA "
              "events, bench/gemm_swiglu.json).", "",
              f"It is an upper bound on speed: it assumes the tensor core holds the published "
              f"rate (no power or clock throttling) and that L2 serves every re-read operand "
              f"(the floor counts each byte once). The instruction counts say issue is not "
              f"the limit: a k-tile's four MMAs take {k_tile_ns:.0f} ns at that rate, while "
              f"the MMA warp issues {ours_d['mma_loop']['instructions']:g} instructions and "
              f"the producer {ours_d['tma_loop']['instructions']:g} per k-tile.", "",
              "| M | N | K | H200 PipeLink ms | H200 cuBLAS ms | B200 model ms | B200 floor ms "
              "| model / floor |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in data["model"]:
        lines.append(f"| {r['M']} | {r['N']} | {r['K']} | {r['h200_linked_ms']:.3f} | "
                     f"{r['h200_cublas_ms']:.3f} | {r['b200_model_ms']:.3f} | "
                     f"{r['b200_floor_ms']:.3f} | {r['b200_model_ms'] / r['b200_floor_ms']:.2f} |")
    section = "\n".join(lines) + "\n"
    results = ROOT / "bench" / "RESULTS.md"
    text = re.sub(r"## Blackwell sm_100a.*?(?=\n## |\Z)", "", results.read_text(),
                  flags=re.S).rstrip()
    results.write_text(text + "\n\n" + section)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", help="write the comparison here")
    p.add_argument("--report", help="comparison JSON -> RESULTS.md section")
    a = p.parse_args()
    if a.report:
        report(Path(a.report))
        return
    data = run()
    text = json.dumps(data, indent=1) + "\n"
    if a.json:
        Path(a.json).write_text(text)
    else:
        print(text)


if __name__ == "__main__":
    main()
