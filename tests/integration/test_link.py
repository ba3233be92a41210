"""Linking real components with real nvcc and nvJitLink (no GPU needed)."""

from __future__ import annotations

import re
import shutil
import textwrap
from pathlib import Path

import pytest

from pipelink.build import build_objects, default_index
from pipelink.errors import CheckError
from pipelink.link import LinkOptions, link_kernel
from pipelink.recipe import ComponentIndex, load_recipe

from .sass import sass, sass_instructions

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """pipeline_demo linked for both archs, plus the sm_90a monolithic build."""
    out = tmp_path_factory.mktemp("demo")
    recipe = load_recipe(ROOT / "recipes" / "pipeline_demo.yaml")
    index = default_index(ROOT)
    built = {}
    for arch in ("sm_90a", "sm_100a"):
        objects = build_objects(recipe, arch, index, out / arch / "obj")
        built[arch] = link_kernel(recipe, objects, out / arch, LinkOptions(arch, emit_ptx=True),
                                  index=index)
    objects = build_objects(recipe, "sm_90a", index, out / "sm_90a" / "obj")
    built["mono"] = link_kernel(recipe, objects, out / "mono", LinkOptions("sm_90a", mode="mono"),
                                index=index)
    return built


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_links_to_a_cubin_with_folded_placement(demo, arch):
    result = demo[arch]
    assert result.cubin.read_bytes()[:4] == b"\x7fELF"
    ptx = (result.cubin.parent / "pipeline_demo.ptx").read_text()
    assert ".entry pl_pipeline_demo" in ptx
    # No entry call and no run-time load of a placement constant survived LTO.
    assert not re.search(r"\bcall(\.uni)?\b.*pl_(tile_loader|row_|neighbor)", ptx)
    assert not re.search(r"\bld\.[^\n]*\bpl_(at|cvt)_", ptx)


def test_every_transfer_kind_is_present(demo):
    kinds = {t.kind for t in demo["sm_90a"].kernel.transfers}
    assert kinds == {"zero_copy", "conversion", "registers", "global"}


def test_linked_and_monolithic_sass_match_within_one_percent(demo):
    linked = sass_instructions(demo["sm_90a"].cubin)
    mono = sass_instructions(demo["mono"].cubin)
    assert abs(len(linked) - len(mono)) <= 0.01 * len(mono), (len(linked), len(mono))


def test_same_inputs_same_cubin(demo, tmp_path):
    recipe = load_recipe(ROOT / "recipes" / "pipeline_demo.yaml")
    index = default_index(ROOT)
    objects = build_objects(recipe, "sm_90a", index, tmp_path / "obj")
    again = link_kernel(recipe, objects, tmp_path, LinkOptions("sm_90a"), index=index)
    assert again.cubin.read_bytes() == demo["sm_90a"].cubin.read_bytes()
    assert (tmp_path / "kernel.json").read_bytes() == demo["sm_90a"].kernel_json.read_bytes()


# -- fixed named barriers ------------------------------------------------------------------

LEGACY = """\
// A third-party stage that hard-codes named barrier {bar_id}.
#include "pl_{name}.h"
constexpr uint32_t kLegacyBarrier = {bar_id};  // hard-coded by its original source
constexpr uint32_t kThreads = 128;
extern "C" __device__ void pl_{name}_main(const pl_place_{name}& at, const pl_args_{name}& args,
                                     const pl::KernelInfo&, const pl::WorkTile& tile,
                                     pl_state_{name}_main&) {{
  pl::named_sync({barrier}, kThreads);
  if (pl::thread_in_role(at.role.main) == 0) args.out[tile.m_block] = {value};
}}
"""


def _component(root: Path, name: str, fixed: int | None, value: int) -> None:
    folder = root / name
    folder.mkdir(parents=True)
    fixed_key = f", fixed: {fixed}" if fixed else ""
    (folder / "contract.yaml").write_text(textwrap.dedent(f"""\
        component: {name}
        arch: [sm_90a]
        roles: {{main: {{warps: 4, registers: 64}}}}
        named_barriers: {{sync: {{threads: 128{fixed_key}}}}}
        args: [{{name: out, type: ptr, dtype: i32}}]
        """))
    barrier = "kLegacyBarrier" if fixed else "at.bar.sync"
    (folder / f"{name}.cu").write_text(LEGACY.format(name=name, bar_id=fixed or 0,
                                                     barrier=barrier, value=value))


def _pair_recipe(root: Path, a: str, b: str) -> Path:
    path = root / "pair.yaml"
    path.write_text(f"recipe: pair\narch: [sm_90a]\ninstances: {{a: {a}, b: {b}}}\n")
    return path


def test_fixed_barriers_collide_when_both_are_fixed(tmp_path):
    _component(tmp_path / "components", "legacy_a", 13, 1)
    _component(tmp_path / "components", "legacy_b", 13, 2)
    recipe = load_recipe(_pair_recipe(tmp_path, "legacy_a", "legacy_b"))
    index = ComponentIndex((tmp_path / "components",))
    objects = build_objects(recipe, "sm_90a", index, tmp_path / "obj")
    with pytest.raises(CheckError) as err:
        link_kernel(recipe, objects, tmp_path / "out", LinkOptions("sm_90a"), index=index)
    text = str(err.value)
    assert "named barrier id 13 is fixed by both" in text
    assert "a.sync (legacy_a" in text and "b.sync (legacy_b" in text
    assert "drop 'fixed:'" in text


def test_relocatable_barrier_moves_off_the_fixed_id(tmp_path):
    _component(tmp_path / "components", "legacy_a", 13, 1)
    _component(tmp_path / "components", "modern_b", None, 2)
    recipe = load_recipe(_pair_recipe(tmp_path, "legacy_a", "modern_b"))
    index = ComponentIndex((tmp_path / "components",))
    objects = build_objects(recipe, "sm_90a", index, tmp_path / "obj")
    result = link_kernel(recipe, objects, tmp_path / "out", LinkOptions("sm_90a", emit_ptx=True),
                         index=index)
    assert result.placement.barriers["a.sync"] == 13
    moved = result.placement.barriers["b.sync"]
    assert moved != 13 and 1 <= moved <= 15
    # ptxas turns the placed ids into immediates: 0 is the glue's __syncthreads.
    ids = {int(i, 16) for i in re.findall(r"BAR\.SYNC\S*\s+(0x[0-9a-f]+),",
                                          sass(result.cubin))}
    assert ids == {13, moved}
