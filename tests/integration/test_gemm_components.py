"""The GEMM components with real nvcc (no GPU): every component compiles for every
arch it lists into an object that carries its contract; its inline PTX assembles for
that arch; the mainloop really issues wgmma; both GEMM recipes pass the checker; and,
once the placer is there, the linked kernels keep the accumulators in registers."""

from __future__ import annotations

import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pipelink.build import build_objects, default_index
from pipelink.compile import CompileOptions, compile_component, stage_sources
from pipelink.contract import load_contract
from pipelink.errors import ContractError
from pipelink.link import LinkOptions, check_objects, link_kernel
from pipelink.objfile import read_object
from pipelink.recipe import load_recipe
from pipelink.toolchain import discover

from .sass import sass, sass_instructions

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")

# component -> the archs it must build for
ARCHS = {
    "tma_loader": ("sm_90a", "sm_100a"),
    "tile_scheduler": ("sm_90a", "sm_100a", "sm_120a"),
    "wgmma_mainloop": ("sm_90a",),
    "store_epilogue": ("sm_90a", "sm_100a"),
    "swiglu_epilogue": ("sm_90a", "sm_100a", "sm_120a"),
}
BUILDS = [(c, a) for c, archs in ARCHS.items() for a in archs]

# PTX each component must contain (on every arch it builds for)
PTX_MUST = {
    "tma_loader": ["cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx",
                   "mbarrier.arrive.expect_tx", "prefetch.tensormap"],
    "tile_scheduler": [],
    "wgmma_mainloop": ["wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16",
                       "wgmma.fence.sync.aligned", "wgmma.commit_group.sync.aligned",
                       "wgmma.wait_group.sync.aligned 1", "wgmma.wait_group.sync.aligned 0"],
    "store_epilogue": ["stmatrix.sync.aligned.m8n8.x4.shared.b16",
                       "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group",
                       "fence.proxy.async.shared::cta", "cp.async.bulk.wait_group.read 1"],
    "swiglu_epilogue": ["stmatrix.sync.aligned.m8n8.x4.shared.b16", "tanh.approx.f32",
                        "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group"],
}


def _contract(name: str) -> Path:
    return ROOT / "components" / name / "contract.yaml"


def _nvcc_staged(name: str, arch: str, out: Path, mode: str,
                 params: dict[str, int] | None = None) -> subprocess.CompletedProcess:
    """nvcc on the staged source: -ptx, or -cubin (ptxas checks the inline PTX for the
    arch, which LTO-IR alone never does)."""
    bound = load_contract(_contract(name)).bind(params or {})
    stage, includes, _ = stage_sources(bound, _contract(name).parent, arch,
                                       Path(CompileOptions(arch).stage_root))
    cmd = [discover().nvcc, "-std=c++17", "-O3", "-rdc=true", f"-arch={arch}", mode,
           "--expt-relaxed-constexpr", *[f"-I{i}" for i in includes], "-o", str(out),
           str(stage / "component" / bound.contract.source_for(arch))]
    return subprocess.run(cmd, capture_output=True, text=True)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    """Every (component, arch) object, PTX and relocatable cubin, built in parallel."""
    out = tmp_path_factory.mktemp("gemm_components")

    def one(build: tuple[str, str]) -> tuple[tuple[str, str], Path]:
        name, arch = build
        compile_component(_contract(name), {}, CompileOptions(arch), out / f"{name}.{arch}.o")
        for mode, suffix in (("-ptx", "ptx"), ("-cubin", "cubin")):
            proc = _nvcc_staged(name, arch, out / f"{name}.{arch}.{suffix}", mode)
            assert proc.returncode == 0, f"{name} {arch} {mode}:\n{proc.stdout}{proc.stderr}"
        return build, out

    with ThreadPoolExecutor(max_workers=8) as pool:
        return dict(pool.map(one, BUILDS))


@pytest.mark.parametrize("name", sorted(ARCHS))
def test_contract_lists_the_archs(name):
    assert set(load_contract(_contract(name)).archs) == set(ARCHS[name])


@pytest.mark.parametrize("name,arch", BUILDS)
def test_object_carries_its_contract(built, name, arch):
    obj = read_object(built[(name, arch)] / f"{name}.{arch}.o")
    assert obj.arch == arch
    assert obj.header["component"] == name
    assert obj.header["contract"] == load_contract(_contract(name)).data
    assert obj.ltoir


@pytest.mark.parametrize("name,arch", BUILDS)
def test_inline_ptx_assembles_for_the_arch(built, name, arch):
    cubin = built[(name, arch)] / f"{name}.{arch}.cubin"
    assert cubin.read_bytes()[:4] == b"\x7fELF"
    ptx = (built[(name, arch)] / f"{name}.{arch}.ptx").read_text()
    for needle in PTX_MUST[name]:
        assert needle in ptx, f"{name} ({arch}) lacks {needle}"


def test_mainloop_issues_four_wgmma_per_stage(built):
    ptx = (built[("wgmma_mainloop", "sm_90a")] / "wgmma_mainloop.sm_90a.ptx").read_text()
    assert len(re.findall(r"wgmma\.mma_async\S*", ptx)) == 64 // 16   # tile_k / k per wgmma


@pytest.mark.parametrize("tile_m,tile_n", [(128, 128), (64, 256), (64, 64)])
def test_mainloop_and_epilogues_build_other_tiles(tmp_path, tile_m, tile_n):
    store_n = 64                                  # bf16 columns of one 128-byte swizzle row
    out_n = {"wgmma_mainloop": tile_n, "store_epilogue": tile_n, "swiglu_epilogue": tile_n // 2}
    for name, cols in out_n.items():
        params = {"tile_m": tile_m, "tile_n": tile_n}
        if name != "wgmma_mainloop":
            if cols < store_n:
                continue
            params["buffers"] = min(2, cols // store_n)   # chunks per tile rotate evenly
        proc = _nvcc_staged(name, "sm_90a", tmp_path / f"{name}.ptx", "-ptx", params)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    ptx = (tmp_path / "wgmma_mainloop.ptx").read_text()
    assert f"wgmma.mma_async.sync.aligned.m64n{tile_n}k16.f32.bf16.bf16" in ptx


def test_only_sm_90a_builds_the_mainloop(tmp_path):
    with pytest.raises(ContractError, match="does not support sm_100a"):
        compile_component(_contract("wgmma_mainloop"), {}, CompileOptions("sm_100a"),
                          tmp_path / "x.o")


# -- the recipes -------------------------------------------------------------------------

RECIPES = {"gemm": "store", "gemm_swiglu": "swiglu"}


@pytest.fixture(scope="module")
def recipe_objects(object_dir: Path) -> dict[str, dict[str, Path]]:
    index = default_index(ROOT)
    return {r: build_objects(load_recipe(ROOT / "recipes" / f"{r}.yaml"), "sm_90a", index,
                             object_dir) for r in RECIPES}


@pytest.mark.parametrize("recipe,epilogue", sorted(RECIPES.items()))
def test_recipe_checks(recipe_objects, recipe, epilogue):
    kernel, _ = check_objects(load_recipe(ROOT / "recipes" / f"{recipe}.yaml"), "sm_90a",
                              recipe_objects[recipe])
    kinds = sorted((t.kind, str(t.src), str(t.dst)) for t in kernel.transfers)
    assert kinds == [("registers", "mma.acc", f"{epilogue}.acc"),
                     ("work", "sched.work", "load.work"), ("work", "sched.work", "mma.work"),
                     ("work", "sched.work", f"{epilogue}.work"),
                     ("zero_copy", "load.a", "mma.a"), ("zero_copy", "load.b", "mma.b")]
    lanes = {lane.name: lane for lane in kernel.lanes}
    consumers = lanes[f"mma.mma+{epilogue}.store"]
    assert (consumers.warps, consumers.warpgroup, consumers.registers) == (8, True, 168)
    assert kernel.scheduler == "sched"
    assert ("load.stages", "mma.stages") in kernel.problem.equal
    assert not kernel.warnings


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_linked_kernel_keeps_accumulators_in_registers(recipe_objects, recipe, tmp_path):
    result = link_kernel(load_recipe(ROOT / "recipes" / f"{recipe}.yaml"),
                         recipe_objects[recipe], tmp_path, LinkOptions("sm_90a"),
                         index=default_index(ROOT))
    assert result.placement.tunables["load.stages"] >= 4
    ops = {op.split(".")[0] for op in sass_instructions(result.cubin)}
    assert not {"LDL", "STL"} & ops, "local memory in the kernel"
    assert {"STSM", "UTMASTG", "UTMALDG", "SYNCS"} <= ops
    hgmma = re.findall(r"HGMMA\.64x256x16\.F32\.BF16[^;]*;", sass(result.cubin))
    assert len(hgmma) == 64 // 16
    # One batch per stage, committed once and left in flight (not serialised by ptxas).
    assert [h.endswith("gsb0 ;") for h in hgmma] == [False, False, False, True]
