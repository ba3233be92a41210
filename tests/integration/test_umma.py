"""umma_mainloop with real nvcc and nvJitLink for sm_100a (no Blackwell GPU needed, nor
any GPU): both GEMM recipes pick it for sm_100a through per_arch and keep wgmma_mainloop
for sm_90a; they build and link with the real pipeline; the linked SASS issues
tcgen05 MMAs (UTC*) and no Hopper wgmma, with the descriptor bit patterns the PTX ISA
tables give, stays out of local memory, and matches the monolithic build."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pipelink.build import build_objects, default_index
from pipelink.compile import CompileOptions, stage_sources
from pipelink.contract import load_contract
from pipelink.link import LinkOptions, link_kernel
from pipelink.recipe import load_recipe
from pipelink.toolchain import discover

from .sass import cuobjdump, sass, sass_instructions

ROOT = Path(__file__).resolve().parents[2]
ARCH = "sm_100a"
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")

RECIPES = {"gemm": "store", "gemm_swiglu": "swiglu"}
TILE_M, TILE_N, TILE_K = 128, 256, 64     # the recipes' mma params
MMA_M, MMA_K = 64, 16                     # one tcgen05.mma: 64 rows, 16 of K (bf16)
MMAS_PER_STAGE = (TILE_M // MMA_M) * (TILE_K // MMA_K)
CONSUMER_THREADS = TILE_M // 16 * 32

# PTX ISA, tcgen05 "Instruction descriptor" (.kind::f16): D f32 = 1 at bit 4, A and B
# bf16 = 1 at bits 7 and 10, K-major (no transpose) 0 at bits 15 and 16, N >> 3 at bit
# 17, M >> 4 at bit 24.
IDESC = (1 << 4) | (1 << 7) | (1 << 10) | ((TILE_N >> 3) << 17) | ((MMA_M >> 4) << 24)
# PTX ISA, tcgen05 "Shared memory descriptor", upper 32 bits for a 128-byte-swizzled
# K-major tile: stride byte offset 1024 >> 4 at bit 32, the fixed 0b001 at bit 46,
# swizzle 2 (128B) at bit 61.
DESC_HI = ((1024 >> 4) << 0) | (1 << (46 - 32)) | (2 << (61 - 32))


# -- recipes (no compiler) -----------------------------------------------------------------

@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_recipe_picks_the_mainloop_per_arch(recipe):
    r = load_recipe(ROOT / "recipes" / f"{recipe}.yaml")
    assert r.archs == ("sm_90a", "sm_100a")
    hopper, blackwell = r.instances("sm_90a")["mma"], r.instances(ARCH)["mma"]
    assert (hopper.component, blackwell.component) == ("wgmma_mainloop", "umma_mainloop")
    assert hopper.params == blackwell.params == {"tile_m": TILE_M, "tile_n": TILE_N,
                                                 "tile_k": TILE_K}


def test_contract_states_one_arrival_per_stage_and_the_wgmma_fragment():
    umma = load_contract(ROOT / "components" / "umma_mainloop" / "contract.yaml").bind({})
    wgmma = load_contract(ROOT / "components" / "wgmma_mainloop" / "contract.yaml").bind({})
    assert umma.contract.archs == (ARCH,)
    for port in ("a", "b"):   # one tcgen05.commit per stage and ring
        assert umma.eval(umma.contract.ports[port].spec["arrivals"], port) == 1
    # Same acc port as the Hopper mainloop, so the same epilogues take it.
    assert umma.contract.ports["acc"].spec == wgmma.contract.ports["acc"].spec
    assert umma.eval("tile_n // 2", "count") == 128


# -- built, linked, disassembled -----------------------------------------------------------

@pytest.fixture(scope="module")
def linked(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], object]:
    """(recipe, mode) -> LinkResult for sm_100a, linked (with PTX) and monolithic."""
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc")
    out = tmp_path_factory.mktemp("umma")
    index = default_index(ROOT)
    results = {}
    for name in RECIPES:
        recipe = load_recipe(ROOT / "recipes" / f"{name}.yaml")
        objects = build_objects(recipe, ARCH, index, out / "obj")
        for mode, opts in (("linked", LinkOptions(ARCH, emit_ptx=True)),
                           ("mono", LinkOptions(ARCH, mode="mono"))):
            results[(name, mode)] = link_kernel(recipe, objects, out / name / mode, opts,
                                                index=index)
    return results


def _ptx(result) -> str:
    return (result.cubin.parent / f"{result.kernel.recipe.name}.ptx").read_text()


@needs_nvcc
@pytest.mark.parametrize("recipe,epilogue", sorted(RECIPES.items()))
def test_checks_and_places_tensor_memory(linked, recipe, epilogue):
    result = linked[(recipe, "linked")]
    kinds = sorted((t.kind, str(t.src), str(t.dst)) for t in result.kernel.transfers)
    assert kinds == [("registers", "mma.acc", f"{epilogue}.acc"),
                     ("work", "sched.work", "load.work"), ("work", "sched.work", "mma.work"),
                     ("work", "sched.work", f"{epilogue}.work"),
                     ("zero_copy", "load.a", "mma.a"), ("zero_copy", "load.b", "mma.b")]
    assert result.placement.tmem == {"mma.acc": (0, TILE_N)}
    assert result.placement.tunables["mma.stages"] >= 2
    glue = (result.cubin.parent / "glue.cu").read_text()
    # The checker and the glue agree with the contract: the loader's empty barriers
    # expect the one commit per stage; acc_full the commit plus every consumer thread.
    assert re.search(r"pl::mbar::init\(\d+ \+ i \* 8, 1\);  // load\.a empty", glue)
    assert re.search(r"pl::mbar::init\(\d+ \+ i \* 8, 1\);  // load\.b empty", glue)
    assert re.search(rf"pl::mbar::init\(\d+ \+ i \* 8, {1 + CONSUMER_THREADS}\);  "
                     r"// mma\.acc_full", glue)
    assert f"tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%0], {TILE_N};" in glue


@needs_nvcc
@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_ptx_issues_tcgen05_and_no_wgmma(linked, recipe):
    ptx = _ptx(linked[(recipe, "linked")])
    assert len(re.findall(r"tcgen05\.mma\.cta_group::1\.kind::f16", ptx)) == MMAS_PER_STAGE
    assert len(re.findall(r"tcgen05\.commit\.cta_group::1\.mbarrier::arrive::one", ptx)) == 3
    assert "tcgen05.ld.sync.aligned.16x256b.x32.b32" in ptx
    assert "tcgen05.wait::ld.sync.aligned" in ptx
    assert "wgmma" not in ptx


@needs_nvcc
@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_sass_has_umma_and_no_hgmma(linked, recipe):
    result = linked[(recipe, "linked")]
    ops = sass_instructions(result.cubin)
    umma = [op for op in ops if op.startswith("UTC") and "MMA" in op]
    assert len(umma) == MMAS_PER_STAGE, umma          # UTCHMMA: tcgen05.mma kind::f16
    assert not [op for op in ops if "GMMA" in op or op.startswith("WARPGROUP")]
    assert ops.count("UTCBAR") == 3                   # two stage releases + acc_full
    assert {"UTMALDG.2D", "UTMASTG.2D", "STSM.16.M88.4"} <= set(ops)
    text = sass(result.cubin)
    # One tcgen05.ld of the whole fragment: 16 lanes x 256 columns per warp.
    assert re.findall(r"\bLDTM\.[\w.]+", text) == ["LDTM.16dp256bit.x32"]
    # The descriptors fold to the PTX ISA's bit patterns.
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
    # setmaxnreg: the producer warpgroup gives registers to the consumer warpgroups.
    ops = set(sass_instructions(cubin))
    assert {"USETMAXREG.DEALLOC.CTAPOOL", "USETMAXREG.TRY_ALLOC.CTAPOOL"} <= ops


@needs_nvcc
@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_linked_matches_monolithic(linked, recipe):
    ops_linked = sass_instructions(linked[(recipe, "linked")].cubin)
    ops_mono = sass_instructions(linked[(recipe, "mono")].cubin)
    assert abs(len(ops_linked) - len(ops_mono)) <= 0.01 * len(ops_mono), \
        (len(ops_linked), len(ops_mono))
    assert sorted(op for op in ops_linked if op.startswith("UTC")) == \
        sorted(op for op in ops_mono if op.startswith("UTC"))


# -- another tile shape --------------------------------------------------------------------

@needs_nvcc
def test_other_tile_assembles(tmp_path):
    """tile_m 64, tile_n 128: one row block, a 64-register fragment; ptxas checks the
    inline PTX for sm_100a (-cubin), which LTO-IR alone never does."""
    contract = ROOT / "components" / "umma_mainloop" / "contract.yaml"
    bound = load_contract(contract).bind({"tile_m": 64, "tile_n": 128})
    stage, includes, _ = stage_sources(bound, contract.parent, ARCH,
                                       Path(CompileOptions(ARCH).stage_root))
    source = str(stage / "component" / bound.contract.source_for(ARCH))
    for mode in ("-ptx", "-cubin"):
        out = tmp_path / f"umma{mode}"
        proc = subprocess.run([discover().nvcc, "-std=c++17", "-O3", "-rdc=true", f"-arch={ARCH}",
                               mode, "--expt-relaxed-constexpr", *[f"-I{i}" for i in includes],
                               "-o", str(out), source], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    ptx = (tmp_path / "umma-ptx").read_text()
    assert len(re.findall(r"tcgen05\.mma\.cta_group::1\.kind::f16", ptx)) == TILE_K // MMA_K
    assert "tcgen05.ld.sync.aligned.16x256b.x16.b32" in ptx
