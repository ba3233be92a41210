"""The CuTe mainloop and the bias + GELU epilogue with real nvcc and nvJitLink (no GPU).

cute_mainloop is wgmma_mainloop's contract written with CuTe: it compiles, its
accumulator fragment is the contract's register layout (checked on the host by CuTe's
own layout algebra), and swapping it into a recipe reuses every other object as is.
bias_gelu_epilogue compiles for sm_90a and sm_100a. The three recipes link, linked and
monolithic, into kernels that issue HGMMA and keep everything in registers."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pipelink.build import build_objects, default_index, object_name
from pipelink.compile import CompileOptions, compile_component, cutlass_include, stage_sources
from pipelink.contract import load_contract
from pipelink.errors import ToolchainError
from pipelink.link import LinkOptions, link_kernel
from pipelink.objfile import read_object
from pipelink.recipe import load_recipe, resolve_components
from pipelink.toolchain import discover

from .sass import cuobjdump, sass, sass_instructions

ROOT = Path(__file__).resolve().parents[2]


def _cutlass_missing() -> bool:
    try:
        cutlass_include()
    except ToolchainError:
        return True
    return False


pytestmark = [
    pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc"),
    pytest.mark.skipif(_cutlass_missing(), reason="needs the CUTLASS headers "
                                                  "(pip install nvidia-cutlass==4.2.0.0)"),
]

ARCHS = {"cute_mainloop": ("sm_90a",), "bias_gelu_epilogue": ("sm_90a", "sm_100a")}
# recipe -> the recipe it copies with the hand-written mainloop (None: a new one)
RECIPES = {"gemm_cute": "gemm", "gemm_swiglu_cute": "gemm_swiglu", "gemm_bias_gelu": None}
MODES = ("linked", "mono")
TILE_N = 256
K_STEPS = 64 // 16                   # wgmma per stage: tile_k / k per instruction

# Host program: for every thread of the TiledMMA, where CuTe puts each accumulator it
# holds, against the contract's wgmma_f32_m64nN_wg_rows formula.
LAYOUT_CHECK = r"""
#include <cstdio>
#include "cute_mainloop.cu"

int main() {
  const auto tile = cute::make_identity_tensor(cute::Shape<TileM, TileN>{});  // (row, col)
  int wrong = 0;
  for (int t = 0; t < int(cute::size(TiledMma{})); ++t) {
    const auto coords = TiledMma{}.get_thread_slice(t).partition_C(tile);
    const int g = t / 128, w = t % 128;
    for (int i = 0; i < int(kAccCount); ++i) {
      const int row = 64 * g + 16 * (w / 32) + (w % 32) / 4 + 8 * ((i / 2) % 2);
      const int col = 8 * (i / 4) + 2 * (w % 4) + i % 2;
      const auto rc = coords(AccLayout{}(i));
      wrong += int(cute::get<0>(rc)) != row || int(cute::get<1>(rc)) != col;
    }
  }
  std::printf("threads %d floats %d wrong %d\n", int(cute::size(TiledMma{})), int(kAccCount),
              wrong);
  return wrong != 0;
}
"""


def _contract(name: str) -> Path:
    return ROOT / "components" / name / "contract.yaml"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _layout_check(out: Path) -> subprocess.CompletedProcess:
    bound = load_contract(_contract("cute_mainloop")).bind({})
    stage, includes, _ = stage_sources(bound, _contract("cute_mainloop").parent, "sm_90a",
                                       Path(CompileOptions("sm_90a").stage_root))
    (out / "layout_check.cu").write_text(LAYOUT_CHECK)
    cmd = [discover().nvcc, "-std=c++17", "-gencode=arch=compute_90a,code=compute_90a",
           "--expt-relaxed-constexpr", *[f"-I{i}" for i in includes], "-o",
           str(out / "layout_check"),
           str(out / "layout_check.cu")]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        return proc
    return subprocess.run([str(out / "layout_check")], capture_output=True, text=True)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Every object the recipes need, compiled in parallel into one folder (beside the
    sm_100a epilogue and the host layout check), then each recipe's objects resolved
    by build_objects, which must find them all fresh."""
    out = tmp_path_factory.mktemp("cute_gelu")
    objdir = out / "obj"
    index = default_index(ROOT)
    recipes = {r: load_recipe(ROOT / "recipes" / f"{r}.yaml")
               for r in [*RECIPES, *filter(None, RECIPES.values())]}
    jobs = {}
    for recipe in recipes.values():
        for spec, path in resolve_components(recipe, "sm_90a", index).values():
            bound = load_contract(path).bind(spec.params)
            target = objdir / object_name(bound.name, bound.params_hash(), "sm_90a")
            jobs[target] = (path, spec.params, "sm_90a")
    for name, archs in ARCHS.items():
        for arch in archs[1:]:
            jobs[out / arch / f"{name}.{arch}.o"] = (_contract(name), {}, arch)

    def compile_one(target: Path) -> None:
        path, params, arch = jobs[target]
        compile_component(path, params, CompileOptions(arch), target)

    with ThreadPoolExecutor(max_workers=8) as pool:
        layout = pool.submit(_layout_check, out)
        list(pool.map(compile_one, sorted(jobs)))
        layout = layout.result()
    before = {p.name: (p.stat().st_mtime_ns, _sha(p)) for p in objdir.iterdir()}
    objects = {r: build_objects(rec, "sm_90a", index, objdir) for r, rec in recipes.items()}
    after = {p.name: (p.stat().st_mtime_ns, _sha(p)) for p in objdir.iterdir()}
    return {"out": out, "objects": objects, "recipes": recipes, "layout": layout,
            "before": before, "after": after, "index": index}


@pytest.fixture(scope="module")
def linked(built: dict) -> dict:
    """(recipe, mode) -> LinkResult, for the three recipes and the hand-written gemm."""
    runs = [(r, m) for r in RECIPES for m in MODES] + [("gemm", "linked")]

    def one(run: tuple[str, str]) -> tuple[tuple[str, str], object]:
        recipe, mode = run
        return run, link_kernel(built["recipes"][recipe], built["objects"][recipe],
                                built["out"] / mode / recipe, LinkOptions("sm_90a", mode=mode),
                                index=built["index"])

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = dict(pool.map(one, runs))
    return results


def _result(linked: dict, recipe: str, mode: str):  # noqa: ANN202  (a LinkResult)
    return linked[(recipe, mode)]


def _resources(cubin: Path) -> dict[str, int]:
    """REG, STACK, SHARED, LOCAL, ... of the kernel (cuobjdump -res-usage)."""
    tool = cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not installed (pip install nvidia-cuda-cuobjdump)")
    text = subprocess.run([tool, "-res-usage", str(cubin)], capture_output=True, text=True,
                          check=True).stdout
    line = next(ln for ln in text.splitlines() if "REG:" in ln)
    return {k: int(v) for k, v in re.findall(r"(\w+):(\d+)", line)}


# -- the components ----------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(ARCHS))
def test_contract_lists_the_archs(name):
    assert set(load_contract(_contract(name)).archs) == set(ARCHS[name])


@pytest.mark.parametrize("name,arch", [(n, a) for n, archs in ARCHS.items() for a in archs])
def test_component_compiles(built, name, arch):
    if arch == "sm_90a":
        path = built["objects"]["gemm_cute" if name == "cute_mainloop" else "gemm_bias_gelu"]
        path = path["mma" if name == "cute_mainloop" else "store"]
    else:
        path = built["out"] / arch / f"{name}.{arch}.o"
    obj = read_object(path)
    assert (obj.arch, obj.header["component"]) == (arch, name)
    assert obj.header["contract"] == load_contract(_contract(name)).data
    assert obj.ltoir


def test_cute_mainloop_keeps_the_hand_written_contract():
    cute = load_contract(_contract("cute_mainloop")).data
    hand = load_contract(_contract("wgmma_mainloop")).data
    for key in ("arch", "params", "tunables", "roles", "ports", "args"):
        assert cute.get(key) == hand.get(key), key
    assert cute["includes"] == ["cutlass"]


def test_cute_fragment_is_the_contract_layout(built):
    proc = built["layout"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == f"threads 256 floats {TILE_N // 2} wrong 0"


@pytest.mark.parametrize("cute,hand", [(c, h) for c, h in RECIPES.items() if h])
def test_swapping_the_mainloop_reuses_every_other_object(built, cute, hand):
    mine, theirs = built["objects"][cute], built["objects"][hand]
    assert mine.keys() == theirs.keys()
    assert mine["mma"] != theirs["mma"]
    assert {i: p for i, p in mine.items() if i != "mma"} == \
           {i: p for i, p in theirs.items() if i != "mma"}
    # build_objects found every object fresh: nothing was compiled or rewritten.
    assert built["after"] == built["before"]


# -- the linked kernels ------------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_kernel_issues_hgmma_in_registers(linked, recipe, mode):
    result = _result(linked, recipe, mode)
    ops = sass_instructions(result.cubin)
    assert not {"LDL", "STL"} & {op.split(".")[0] for op in ops}, "local memory in the kernel"
    res = _resources(result.cubin)
    assert res["LOCAL"] == 0 and res["STACK"] == 0, res
    hgmma = re.findall(rf"HGMMA\.64x{TILE_N}x16\.F32\.BF16[^;]*;", sass(result.cubin))
    # One batch per stage, committed once and left in flight (not serialised by ptxas).
    assert [h.endswith("gsb0 ;") for h in hgmma] == [False] * (K_STEPS - 1) + [True]


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_linked_matches_monolithic(linked, recipe):
    ops = {m: sorted(sass_instructions(_result(linked, recipe, m).cubin)) for m in MODES}
    assert ops["linked"] == ops["mono"]


def test_cute_mainloop_costs_what_the_hand_written_one_does(linked):
    cute = sass_instructions(_result(linked, "gemm_cute", "linked").cubin)
    hand = sass_instructions(_result(linked, "gemm", "linked").cubin)
    assert cute.count("HGMMA.64x256x16.F32.BF16") == hand.count("HGMMA.64x256x16.F32.BF16")
    assert abs(len(cute) - len(hand)) <= 0.03 * len(hand), (len(cute), len(hand))


def test_bias_gelu_epilogue_has_one_tanh_per_accumulator(linked):
    ops = sass_instructions(_result(linked, "gemm_bias_gelu", "linked").cubin)
    assert ops.count("MUFU.TANH") == TILE_N // 2
    # One bias load per column a thread holds: two columns per 8-column block (the
    # split-K fix-up's L2 loads of partials and flags are the .STRONG.GPU ones).
    assert sum(op.startswith("LDG") and ".STRONG." not in op for op in ops) == TILE_N // 8 * 2
