"""The CuTe Blackwell components (cute_umma_mainloop, cute_tmem_store_epilogue) with real
nvcc and nvJitLink, no GPU.

cute_umma_mainloop is umma_mainloop's contract written with CuTe's SM100 MMA atoms, and
cute_tmem_store_epilogue is tmem_store_epilogue's with its Tensor Memory reads done by a
CuTe TMEM copy (make_tmem_copy of SM100_TMEM_LOAD_32dp32b64x): the gemm_cute recipe
picks both for sm_100a (cute_mainloop and store_epilogue for sm_90a), and since each
binds its twin's contract every other object is the one gemm links and the placement
does not move. Linked and monolithic, the kernel issues four tcgen05 MMAs (UTCHMMA)
per k-tile with the instruction descriptor as an immediate, no Hopper wgmma and no
local memory, and reads each 256-column accumulator row with four LDTM.x64, each
waited for; its MMA loop and its epilogue's tile loop are set beside the hand-written
ones' with bench/sm100/reference.py. The hand-written epilogues read through the same
pipelink/tmem_epilogue.cuh walk with its default reader: gemm still reads with LDTM.x64
only. With cta_group: 2 (recipes/gemm_pair.yaml with the mainloop swapped) it issues
the CTA-pair MMA (UTCHMMA.2CTA) from CuTe's 2x1SM atom and multicasts its commits to
both CTAs, as umma_mainloop does."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipelink.build import build_objects, default_index
from pipelink.compile import cutlass_include
from pipelink.contract import load_contract
from pipelink.errors import ToolchainError
from pipelink.link import LinkOptions, link_kernel
from pipelink.objfile import read_object
from pipelink.recipe import load_recipe

from .sass import cuobjdump, sass, sass_instructions

ROOT = Path(__file__).resolve().parents[2]
ARCH = "sm_100a"


def _cutlass_missing() -> bool:
    try:
        cutlass_include()
    except ToolchainError:
        return True
    return False


CUTE, HAND = "gemm_cute", "gemm"
PAIR_CUTE, PAIR_HAND = "gemm_pair_cute", "gemm_pair"   # the first: written by the fixture
# instance -> (sm_90a component, sm_100a component) in gemm_cute
PER_ARCH = {"mma": ("cute_mainloop", "cute_umma_mainloop"),
            "store": ("store_epilogue", "cute_tmem_store_epilogue")}
# CuTe component -> the hand-written one whose contract it binds
TWIN_OF = {"cute_umma_mainloop": "umma_mainloop",
           "cute_tmem_store_epilogue": "tmem_store_epilogue"}
# What a second owner of a contract may change.
OWN_KEYS = {"component", "description", "includes"}
TILE_M, TILE_N, TILE_K = 128, 256, 64     # the recipes' mma params
MMA_K = 16                                # one tcgen05.mma: K = 16 (bf16)
MMAS_PER_K_TILE = TILE_K // MMA_K
COMMITS_PER_K_TILE = 2                    # one tcgen05.commit per operand ring
LOAD_COLUMNS = 64                         # tcgen05.ld.32x32b.x64: 64 columns of a row
LOADS_PER_TILE = TILE_N // LOAD_COLUMNS   # each epilogue thread reads a 256-column row
# PTX ISA, tcgen05 "Instruction descriptor" (.kind::f16): D f32 = 1 at bit 4, A and B
# bf16 = 1 at bits 7 and 10, K-major 0 at bits 15 and 16, N >> 3 at bit 17, M >> 4 at
# bit 24. CuTe builds its own (UMMA::make_instr_desc); it must come out the same.
IDESC = (1 << 4) | (1 << 7) | (1 << 10) | ((TILE_N >> 3) << 17) | ((TILE_M >> 4) << 24)
assert IDESC == 0x8400490
# Upper word of a 128-byte-swizzled K-major smem descriptor: stride byte offset
# 1024 >> 4, the SM100 version bit 46, swizzle 2 (128B) at bit 61 (UMMA::make_umma_desc).
DESC_HI = (1024 >> 4) | (1 << (46 - 32)) | (2 << (61 - 32))
PAIR_M = 2 * TILE_M                       # one M = 256 MMA across the CTA pair
PAIR_IDESC = IDESC - ((TILE_M >> 4) << 24) + ((PAIR_M >> 4) << 24)


def _contract(name: str) -> dict:
    return load_contract(ROOT / "components" / name / "contract.yaml").data


def _shared(contract: dict) -> dict:
    return {k: v for k, v in contract.items() if k not in OWN_KEYS}


# -- recipe and contract (no compiler) -----------------------------------------------------

def test_recipe_picks_cute_components_per_arch():
    cute, hand = (load_recipe(ROOT / "recipes" / f"{r}.yaml") for r in (CUTE, HAND))
    assert cute.archs == hand.archs == ("sm_90a", ARCH)
    for i, arch in enumerate(cute.archs):
        mine, theirs = cute.instances(arch), hand.instances(arch)
        assert mine.keys() == theirs.keys()
        for inst in mine:
            want = PER_ARCH[inst][i] if inst in PER_ARCH else theirs[inst].component
            assert mine[inst].component == want, (arch, inst)
            assert mine[inst].params == theirs[inst].params, (arch, inst)
    # sm_90a keeps gemm's epilogue; sm_100a swaps it for its CuTe twin.
    assert cute.instances("sm_90a")["store"].component == \
           hand.instances("sm_90a")["store"].component
    assert TWIN_OF[cute.instances(ARCH)["store"].component] == \
           hand.instances(ARCH)["store"].component


@pytest.mark.parametrize("name", sorted(TWIN_OF))
def test_contract_is_the_hand_written_twins(name):
    cute, hand = _contract(name), _contract(TWIN_OF[name])
    assert _shared(cute) == _shared(hand)
    assert cute["includes"] == ["cutlass"] and "includes" not in hand
    assert cute["component"] == name


# -- built, linked, disassembled -----------------------------------------------------------

def _pair_cute_recipe(folder: Path) -> Path:
    """recipes/gemm_pair.yaml with cute_umma_mainloop for umma_mainloop (cta_group 2),
    instances kept in order so that the placement is gemm_pair's."""
    data = yaml.safe_load((ROOT / "recipes" / f"{PAIR_HAND}.yaml").read_text())
    assert data["instances"]["mma"]["component"] == "umma_mainloop"
    data["recipe"] = PAIR_CUTE
    data["instances"]["mma"]["component"] = "cute_umma_mainloop"
    path = folder / f"{PAIR_CUTE}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def linked(tmp_path_factory: pytest.TempPathFactory, object_dir: Path) -> dict:
    """Objects of the four recipes for sm_100a, gemm_cute linked (with PTX) and
    monolithic, the others linked: {"objects": {recipe: {instance: path}},
    (recipe, mode): LinkResult}."""
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc")
    if _cutlass_missing():
        pytest.skip("needs the CUTLASS headers (pip install nvidia-cutlass==4.2.0.0)")
    out = tmp_path_factory.mktemp("cute_umma")
    index = default_index(ROOT)
    results: dict = {"objects": {}}
    linked_only = (("linked", LinkOptions(ARCH)),)
    runs = {ROOT / "recipes" / f"{CUTE}.yaml": (("linked", LinkOptions(ARCH, emit_ptx=True)),
                                                ("mono", LinkOptions(ARCH, mode="mono"))),
            ROOT / "recipes" / f"{HAND}.yaml": linked_only,
            _pair_cute_recipe(out): linked_only,
            ROOT / "recipes" / f"{PAIR_HAND}.yaml": linked_only}
    for path, modes in runs.items():
        recipe = load_recipe(path)
        objects = build_objects(recipe, ARCH, index, object_dir)
        results["objects"][recipe.name] = objects
        for mode, opts in modes:
            results[(recipe.name, mode)] = link_kernel(recipe, objects,
                                                       out / recipe.name / mode, opts,
                                                       index=index)
    return results


def _ops(linked: dict, recipe: str = CUTE, mode: str = "linked") -> list[str]:
    return sass_instructions(linked[(recipe, mode)].cubin)


TWINS = [(CUTE, HAND), (PAIR_CUTE, PAIR_HAND)]
# recipe -> instance -> (its CuTe component, the twin recipe's component), sm_100a
SWAPPED = {CUTE: {"mma": ("cute_umma_mainloop", "umma_mainloop"),
                  "store": ("cute_tmem_store_epilogue", "tmem_store_epilogue")},
           PAIR_CUTE: {"mma": ("cute_umma_mainloop", "umma_mainloop")}}
ROLES = {"mma": {"mma"}, "store": {"store", "store.tail"}}   # object symbols per instance


@pytest.mark.parametrize("mine,theirs", TWINS)
def test_objects_bind_the_same_contract(linked, mine, theirs):
    objects = linked["objects"]
    for inst, names in SWAPPED[mine].items():
        cute, hand = (read_object(objects[r][inst]).header for r in (mine, theirs))
        assert (cute["component"], hand["component"]) == names
        assert cute["arch"] == hand["arch"] == ARCH
        assert _shared(cute["contract"]) == _shared(hand["contract"])
        assert cute["params"] == hand["params"]
        assert cute["symbols"].keys() == hand["symbols"].keys() == ROLES[inst]
        assert objects[mine][inst] != objects[theirs][inst]
    # Every other instance links the very object the twin links: nothing else recompiles.
    assert {i: p for i, p in objects[mine].items() if i not in SWAPPED[mine]} == \
           {i: p for i, p in objects[theirs].items() if i not in SWAPPED[mine]}


@pytest.mark.parametrize("mine,theirs", TWINS)
def test_placement_does_not_move(linked, mine, theirs):
    cute, hand = (dataclasses.replace(linked[(r, "linked")].placement, solver={})
                  for r in (mine, theirs))
    assert cute == hand   # shared memory, barriers, roles, registers, Tensor Memory
    assert cute.tmem == {"mma.acc": (0, 2 * TILE_N)}


def test_ptx_issues_cta_group_1_kind_f16_mmas(linked):
    result = linked[(CUTE, "linked")]
    ptx = (result.cubin.parent / f"{result.kernel.recipe.name}.ptx").read_text()
    # CuTe's atom issues the disable-output-lane form (an all-zero mask).
    assert len(re.findall(r"tcgen05\.mma\.cta_group::1\.kind::f16", ptx)) == MMAS_PER_K_TILE
    assert "wgmma" not in ptx


def test_sass_has_four_umma_per_k_tile_and_no_hgmma(linked):
    ops = _ops(linked)
    assert ops.count("UTCHMMA") == MMAS_PER_K_TILE     # the k-tile loop's body
    assert not [op for op in ops if "GMMA" in op or op.startswith("WARPGROUP")]
    # Commits: two stage releases per k-tile, one full accumulator per tile.
    assert ops.count("UTCBAR") == COMMITS_PER_K_TILE + 1
    text = sass(linked[(CUTE, "linked")].cubin)
    assert re.search(rf"\bUMOV UR\d+, {IDESC:#x} ;", text), f"idesc {IDESC:#x} not found"
    assert f"{DESC_HI:#x}" in text, f"smem descriptor high word {DESC_HI:#x} not found"


@pytest.mark.parametrize("mode", ["linked", "mono"])
def test_no_local_memory(linked, mode):
    cubin = linked[(CUTE, mode)].cubin
    usage = subprocess.run([cuobjdump(), "-res-usage", str(cubin)], capture_output=True,
                           text=True, check=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", usage)
    assert found, usage
    assert (found[2], found[3]) == ("0", "0"), usage
    assert not {"LDL", "STL"} & {op.split(".")[0] for op in _ops(linked, CUTE, mode)}


def test_linked_matches_monolithic(linked):
    assert _ops(linked, CUTE, "linked") == _ops(linked, CUTE, "mono")


# -- the epilogue's Tensor Memory reads ----------------------------------------------------

def _ldtm(ops: list[str]) -> list[str]:
    return [op for op in ops if op.startswith("LDTM")]


@pytest.mark.parametrize("mode", ["linked", "mono"])
def test_cute_epilogue_reads_rows_with_ldtm_x64(linked, mode):
    ldtm = _ldtm(_ops(linked, CUTE, mode))
    # CuTe's SM100_TMEM_LOAD_32dp32b64x: one LDTM.x64 per 64 columns, a whole row a tile.
    assert set(ldtm) == {"LDTM.x64"}
    assert len(ldtm) * LOAD_COLUMNS == TILE_N
    # CuTe's copy_unpack asserts the warp's lanes (no -DNDEBUG): the component's
    # __builtin_assume of the same condition must have folded the __assertfail away.
    assert not [op for op in _ops(linked, CUTE, mode) if op.startswith("CALL.ABS")]


def test_ptx_waits_for_every_tensor_memory_load(linked):
    """CuTe's atom issues tcgen05.ld alone; the reader's tcgen05.wait::ld must follow
    each load before the next one (and before any use of its registers)."""
    result = linked[(CUTE, "linked")]
    ptx = (result.cubin.parent / f"{result.kernel.recipe.name}.ptx").read_text()
    seq = re.findall(r"tcgen05\.(ld\.sync\.aligned\.32x32b\.x64|wait::ld)", ptx)
    assert seq == ["ld.sync.aligned.32x32b.x64", "wait::ld"] * LOADS_PER_TILE


@pytest.mark.parametrize("recipe", [HAND, PAIR_HAND, PAIR_CUTE])
def test_hand_written_epilogue_still_reads_with_ldtm_x64(linked, recipe):
    # tmem_store_epilogue through TmemTile's default reader (pipelink/tmem_epilogue.cuh).
    ldtm = _ldtm(_ops(linked, recipe))
    assert set(ldtm) == {"LDTM.x64"} and len(ldtm) == LOADS_PER_TILE


def test_pair_issues_cta_pair_mmas_and_multicast_commits(linked):
    ops = _ops(linked, PAIR_CUTE)
    assert ops.count("UTCHMMA.2CTA") == MMAS_PER_K_TILE and "UTCHMMA" not in ops
    # Two stage releases per k-tile and the full buffer per tile, multicast to the pair.
    assert ops.count("UTCBAR.2CTA.MULTICAST") == COMMITS_PER_K_TILE + 1
    assert not [op for op in ops if op.startswith(("LDL", "STL"))]
    text = sass(linked[(PAIR_CUTE, "linked")].cubin)
    assert re.search(rf"\bUMOV UR\d+, {PAIR_IDESC:#x} ;", text), f"{PAIR_IDESC:#x} not found"
    assert f"{DESC_HI:#x}" in text, f"smem descriptor high word {DESC_HI:#x} not found"


def _mma_loop(cubin: Path) -> dict[str, float]:
    """Classes per k-tile over the innermost loops issuing tcgen05.mma (as
    bench/sm100/compare.py counts them: a k-tile is MMAS_PER_K_TILE UTCHMMA)."""
    sys.path.insert(0, str(ROOT / "bench" / "sm100"))
    try:
        from reference import instruction_mix
    finally:
        sys.path.remove(str(ROOT / "bench" / "sm100"))
    loops = instruction_mix(sass(cubin))["loops"]["tcgen05_mma"]
    assert loops, "no loop issues tcgen05.mma"
    total: dict[str, int] = {}
    for loop in loops:
        for name, n in loop["classes"].items():
            total[name] = total.get(name, 0) + n
    k_tiles = total["tcgen05_mma"] / MMAS_PER_K_TILE
    return {"instructions": sum(total.values()) / k_tiles,
            **{name: n / k_tiles for name, n in total.items()}}


@pytest.mark.parametrize("mine,theirs", TWINS)
def test_mma_loop_costs_about_what_the_hand_written_one_does(linked, record_property, mine,
                                                             theirs):
    cute = _mma_loop(linked[(mine, "linked")].cubin)
    hand = _mma_loop(linked[(theirs, "linked")].cubin)
    record_property("mma_loop_instructions_per_k_tile",
                    {"cute_umma_mainloop": cute["instructions"],
                     "umma_mainloop": hand["instructions"]})
    print(f"{mine} vs {theirs}: MMA-loop instructions per k-tile: cute_umma_mainloop "
          f"{cute['instructions']:g}, umma_mainloop {hand['instructions']:g}")
    for loop in (cute, hand):
        assert loop["tcgen05_mma"] == MMAS_PER_K_TILE
        assert loop["tcgen05_commit"] == COMMITS_PER_K_TILE
        assert loop["mbarrier_try_wait"] == 2          # one wait per operand ring
        assert loop.get("local_load", 0) == loop.get("local_store", 0) == 0
    # Not equal (CuTe rebuilds the uniform idesc operand per MMA, the hand-written loop
    # branches around one elect.sync), but of the same size.
    assert cute["instructions"] <= 1.1 * hand["instructions"], (cute, hand)


def _tile_loop(cubin: Path) -> dict[str, int]:
    """Classes in the epilogue's tile loop: the innermost loops issuing tcgen05.ld (a
    static count over the loop's code, its split-K and empty-tile paths included)."""
    sys.path.insert(0, str(ROOT / "bench" / "sm100"))
    try:
        from reference import loops_issuing, parse_sass
    finally:
        sys.path.remove(str(ROOT / "bench" / "sm100"))
    loops = loops_issuing(parse_sass(sass(cubin)), "tmem_load")
    assert len(loops) == 1, loops   # one epilogue warpgroup, one tile loop
    classes = loops[0]["classes"]
    return {"instructions": sum(classes.values()), **classes}


def test_epilogue_tile_costs_about_what_the_hand_written_one_does(linked, record_property):
    cute = _tile_loop(linked[(CUTE, "linked")].cubin)
    hand = _tile_loop(linked[(HAND, "linked")].cubin)
    record_property("epilogue_tile_loop_instructions",
                    {"cute_tmem_store_epilogue": cute["instructions"],
                     "tmem_store_epilogue": hand["instructions"]})
    print(f"epilogue tile-loop instructions: cute_tmem_store_epilogue {cute['instructions']}, "
          f"tmem_store_epilogue {hand['instructions']}")
    for loop in (cute, hand):
        assert loop["tmem_load"] == LOADS_PER_TILE
        assert loop.get("local_load", 0) == loop.get("local_store", 0) == 0
    assert cute["instructions"] <= 1.05 * hand["instructions"], (cute, hand)
