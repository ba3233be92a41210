"""The Blackwell (sm_100a) GEMM family with real nvcc and nvJitLink, no Blackwell GPU
needed (nor any GPU): every recipe picks umma_mainloop (a dedicated MMA warp issuing
M = 128 tcgen05.mma into double-buffered Tensor Memory accumulators) and a TMEM
epilogue for sm_100a through per_arch, and keeps wgmma for sm_90a. Built and linked
with the real pipeline, the SASS issues tcgen05 MMAs (UTCHMMA) at four per k-tile and
no Hopper wgmma, allocates and frees Tensor Memory once, from the warp the contract
names, stays out of local memory, folds the descriptors and placement into
immediates, and is the monolithic build's instruction for instruction."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pipelink.build import build_objects, default_index
from pipelink.contract import load_contract
from pipelink.link import LinkOptions, link_kernel
from pipelink.recipe import load_recipe

from .sass import cuobjdump, sass, sass_instructions

ROOT = Path(__file__).resolve().parents[2]
ARCH = "sm_100a"
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")

# recipe -> (epilogue instance, its sm_90a component, its sm_100a component)
RECIPES = {
    "gemm": ("store", "store_epilogue", "tmem_store_epilogue"),
    "gemm_swiglu": ("swiglu", "swiglu_epilogue", "tmem_swiglu_epilogue"),
    "gemm_bias_gelu": ("store", "bias_gelu_epilogue", "tmem_bias_gelu_epilogue"),
    "grouped_gemm": ("store", "grouped_store_epilogue", "tmem_grouped_store_epilogue"),
}
TILE_M, TILE_N, TILE_K = 128, 256, 64     # the recipes' mma params
MMA_K = 16                                # one tcgen05.mma: K = 16 (bf16)
MMAS_PER_K_TILE = TILE_K // MMA_K
ACC_STAGES = 2                            # accumulator buffers in Tensor Memory
EPILOGUE_THREADS = TILE_M                 # one accumulator row per thread

# PTX ISA, tcgen05 "Instruction descriptor" (.kind::f16): D f32 = 1 at bit 4, A and B
# bf16 = 1 at bits 7 and 10, K-major (no transpose) 0 at bits 15 and 16, N >> 3 at bit
# 17, M >> 4 at bit 24.
IDESC = (1 << 4) | (1 << 7) | (1 << 10) | ((TILE_N >> 3) << 17) | ((TILE_M >> 4) << 24)
# PTX ISA, tcgen05 "Shared memory descriptor", upper 32 bits for a 128-byte-swizzled
# K-major tile: stride byte offset 1024 >> 4 at bit 32, the fixed 0b001 at bit 46,
# swizzle 2 (128B) at bit 61.
DESC_HI = ((1024 >> 4) << 0) | (1 << (46 - 32)) | (2 << (61 - 32))
# SASS of the Tensor Memory allocator (bench/sm100/reference.py maps PTX to SASS with
# one-instruction probes): tcgen05.alloc -> UTCATOMSWS.FIND_AND_SET.ALIGN (inside a
# retry loop), tcgen05.dealloc -> UTCATOMSWS.AND, relinquish_alloc_permit ->
# UVIRTCOUNT.DEALLOC.SMPOOL.
ALLOC, DEALLOC, RELINQUISH = "UTCATOMSWS.FIND_AND_SET.ALIGN", "UTCATOMSWS.AND", \
    "UVIRTCOUNT.DEALLOC.SMPOOL"


# -- recipes and contracts (no compiler) --------------------------------------------------

@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_recipe_picks_the_mainloop_and_epilogue_per_arch(recipe):
    r = load_recipe(ROOT / "recipes" / f"{recipe}.yaml")
    assert r.archs == ("sm_90a", "sm_100a")
    hopper, blackwell = r.instances("sm_90a"), r.instances(ARCH)
    assert (hopper["mma"].component, blackwell["mma"].component) == ("wgmma_mainloop",
                                                                       "umma_mainloop")
    epilogue, on_hopper, on_blackwell = RECIPES[recipe]
    assert (hopper[epilogue].component, blackwell[epilogue].component) == (on_hopper,
                                                                           on_blackwell)
    assert blackwell["mma"].params == {"tile_m": TILE_M, "tile_n": TILE_N, "tile_k": TILE_K}


def test_contracts_meet_at_one_tmem_layout():
    umma = load_contract(ROOT / "components" / "umma_mainloop" / "contract.yaml").bind({})
    assert umma.contract.archs == (ARCH,)
    assert umma.contract.roles["mma"].warps == 1
    assert "tmem_alloc" in umma.contract.roles["mma"].uses
    for port in ("a", "b"):   # one tcgen05.commit per stage and ring
        assert umma.eval(umma.contract.ports[port].spec["arrivals"], port) == 1
    acc = umma.contract.ports["acc"]
    assert (acc.kind, acc.spec["layout"]) == ("tmem", "tmem_f32_m128_rows")
    for _, _, name in RECIPES.values():
        epi = load_contract(ROOT / "components" / name / "contract.yaml").bind({})
        port = epi.contract.ports["acc"]
        assert (port.kind, port.dir, port.spec["layout"]) == ("tmem", "in", acc.spec["layout"])
        assert epi.eval(port.spec["arrivals"], "arrivals") == EPILOGUE_THREADS


# -- built, linked, disassembled -----------------------------------------------------------

@pytest.fixture(scope="module")
def linked(link_repo_kernel) -> dict[tuple[str, str], object]:  # noqa: ANN001
    """(recipe, mode) -> LinkResult for sm_100a, linked (with PTX) and monolithic."""
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc")
    return {(name, mode): link_repo_kernel(name, ARCH, mode)
            for name in RECIPES for mode in ("linked", "mono")}


def _ptx(result) -> str:
    return (result.cubin.parent / f"{result.kernel.recipe.name}.ptx").read_text()


@needs_nvcc
@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_checks_and_places_tensor_memory(linked, recipe):
    result = linked[(recipe, "linked")]
    epilogue = RECIPES[recipe][0]
    transfers = {(t.kind, str(t.src), str(t.dst)) for t in result.kernel.transfers}
    assert ("zero_copy", "mma.acc", f"{epilogue}.acc") in transfers
    # Two accumulator buffers of tile_n columns: all 512 columns, from column 0.
    assert result.placement.tmem == {"mma.acc": (0, ACC_STAGES * TILE_N)}
    glue = (result.cubin.parent / "glue.cu").read_text()
    assert re.search(r"pl::mbar::init\(\d+ \+ i \* 8, 1\);  // mma\.acc full", glue)
    assert re.search(rf"pl::mbar::init\(\d+ \+ i \* 8, {EPILOGUE_THREADS}\);  "
                     r"// mma\.acc empty", glue)
    # The MMA warp (the role that says tmem_alloc) allocates and frees; nobody else.
    warp = result.placement.roles[next(lane.name for lane in result.kernel.lanes
                                       if ("mma", "mma") in lane.members)].warp_base
    owner = rf"if \(threadIdx\.x / 32 == {warp}\) \{{\n\s+asm volatile\(\"tcgen05\."
    assert len(re.findall(owner + "alloc", glue)) == 1
    assert len(re.findall(owner + r"fence::after_thread_sync;\" ::: \"memory\"\);\n\s+"
                                  r"asm volatile\(\"tcgen05\.dealloc", glue)) == 1


@needs_nvcc
@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_ptx_issues_full_rate_tcgen05_and_no_wgmma(linked, recipe):
    ptx = _ptx(linked[(recipe, "linked")])
    assert len(re.findall(r"tcgen05\.mma\.cta_group::1\.kind::f16", ptx)) == MMAS_PER_K_TILE
    for op in ("tcgen05.alloc", "tcgen05.relinquish_alloc_permit", "tcgen05.dealloc"):
        assert len(re.findall(re.escape(op) + r"\.cta_group::1", ptx)) == 1, op
    loads = re.findall(r"tcgen05\.ld\.sync\.aligned\.([\w.]+)\.b32", ptx)
    assert loads and set(loads) == {"32x32b.x64"}, loads
    assert "wgmma" not in ptx


@needs_nvcc
@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_sass_has_umma_and_no_hgmma(linked, recipe):
    result = linked[(recipe, "linked")]
    ops = sass_instructions(result.cubin)
    assert ops.count("UTCHMMA") == MMAS_PER_K_TILE     # the k-tile loop's body
    assert not [op for op in ops if "GMMA" in op or op.startswith("WARPGROUP")]
    # Commits: two stage releases per k-tile, one full accumulator per tile.
    assert ops.count("UTCBAR") == 3
    assert ops.count(DEALLOC) == 1 and ops.count(RELINQUISH) == 1 and ALLOC in ops
    assert {op for op in ops if op.startswith("LDTM")} == {"LDTM.x64"}
    text = sass(result.cubin)
    assert re.search(rf"\bUMOV UR\d+, {IDESC:#x} ;", text), f"idesc {IDESC:#x} not found"
    assert f"{DESC_HI:#x}" in text, f"smem descriptor high word {DESC_HI:#x} not found"


@needs_nvcc
@pytest.mark.parametrize("recipe", sorted(RECIPES))
@pytest.mark.parametrize("mode", ["linked", "mono"])
def test_no_local_memory(linked, recipe, mode):
    cubin = linked[(recipe, mode)].cubin
    usage = subprocess.run([cuobjdump(), "-res-usage", str(cubin)], capture_output=True,
                           text=True, check=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", usage)
    assert found, usage
    assert (found[2], found[3]) == ("0", "0"), usage
    assert not {"LDL", "STL"} & {op.split(".")[0] for op in sass_instructions(cubin)}


@needs_nvcc
@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_linked_matches_monolithic(linked, recipe):
    assert sass_instructions(linked[(recipe, "linked")].cubin) == \
        sass_instructions(linked[(recipe, "mono")].cubin)


# -- the CTA pair (cta_group::2, recipes/gemm_pair.yaml) -------------------------------------

PAIR_M = 2 * TILE_M                           # one M = 256 MMA across the pair
PAIR_IDESC = (1 << 4) | (1 << 7) | (1 << 10) | ((TILE_N >> 3) << 17) | ((PAIR_M >> 4) << 24)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, object_dir: Path) -> dict[str, object]:
    """mode -> LinkResult of gemm_pair for sm_100a."""
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc")
    out = tmp_path_factory.mktemp("pair")
    index = default_index(ROOT)
    recipe = load_recipe(ROOT / "recipes" / "gemm_pair.yaml")
    objects = build_objects(recipe, ARCH, index, object_dir)
    return {mode: link_kernel(recipe, objects, out / mode, opts, index=index)
            for mode, opts in (("linked", LinkOptions(ARCH, emit_ptx=True)),
                               ("mono", LinkOptions(ARCH, mode="mono")))}


@needs_nvcc
def test_pair_glue_clusters_and_allocates_for_the_pair(pair):
    glue = (pair["linked"].cubin.parent / "glue.cu").read_text()
    assert "__cluster_dims__(2, 1, 1)" in glue
    # Peers arrive on each other's barriers: the cluster initialises before any role
    # runs, and no CTA frees its Tensor Memory or leaves before the other is done.
    assert glue.count("pl::cluster::sync();") == 3
    assert "tcgen05.alloc.cta_group::2" in glue and "tcgen05.dealloc.cta_group::2" in glue
    # The leader reuses a buffer once the readers of both CTAs released it.
    assert re.search(rf"pl::mbar::init\(\d+ \+ i \* 8, {2 * EPILOGUE_THREADS}\);  "
                     r"// mma\.acc empty", glue)
    meta = (pair["linked"].cubin.parent / "kernel.json").read_text()
    assert '"cluster": [\n  2,\n  1,\n  1\n ]' in meta or '"cluster": [2, 1, 1]' in meta


@needs_nvcc
def test_pair_sass_issues_cta_pair_mmas_copies_and_commits(pair):
    ops = sass_instructions(pair["linked"].cubin)
    assert ops.count("UTCHMMA.2CTA") == MMAS_PER_K_TILE and "UTCHMMA" not in ops
    # Two stage releases per k-tile and the full buffer per tile, multicast to the pair.
    assert ops.count("UTCBAR.2CTA.MULTICAST") == 3
    assert ops.count("UTMALDG.2D.2CTA") == 2          # A and this CTA's half of B
    assert "UTCATOMSWS.2CTA.FIND_AND_SET.ALIGN" in ops
    assert ops.count(DEALLOC) == 1 and ops.count(RELINQUISH) == 1
    assert not [op for op in ops if "GMMA" in op]
    assert not {"LDL", "STL"} & {op.split(".")[0] for op in ops}
    text = sass(pair["linked"].cubin)
    assert re.search(rf"\bUMOV UR\d+, {PAIR_IDESC:#x} ;", text), f"{PAIR_IDESC:#x} not found"


@needs_nvcc
def test_pair_linked_matches_monolithic(pair):
    assert sass_instructions(pair["linked"].cubin) == sass_instructions(pair["mono"].cubin)
