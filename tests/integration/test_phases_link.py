"""mlp (two phases) through real nvcc and nvJitLink (no GPU): linked and monolithic SASS
are identical, nothing spills, and the grid-wide hand-off shows as one release-add and
one acquire-poll of the phase counter at an immediate workspace offset."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from pipelink.build import build_objects, default_index
from pipelink.link import LinkOptions, link_kernel
from pipelink.recipe import load_recipe

from .sass import sass, sass_instructions

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")


@pytest.fixture(scope="module")
def linked(tmp_path_factory: pytest.TempPathFactory, object_dir: Path) -> dict[str, object]:
    out = tmp_path_factory.mktemp("phases")
    recipe = load_recipe(ROOT / "recipes" / "mlp.yaml")
    index = default_index(ROOT)
    objects = build_objects(recipe, "sm_90a", index, object_dir)
    return {mode: link_kernel(recipe, objects, out / mode, LinkOptions("sm_90a", mode=mode),
                              index=index) for mode in ("linked", "mono")}


def test_linked_and_monolithic_sass_are_identical(linked):
    ops = sass_instructions(linked["linked"].cubin)
    assert ops == sass_instructions(linked["mono"].cubin)
    assert not {"LDL", "STL"} & {op.split(".")[0] for op in ops}


def test_grid_wide_hand_off_in_the_sass(linked):
    text = sass(linked["linked"].cubin)
    # Both warpgroup branches carry the boundary; each adds once and polls in a loop.
    assert len(re.findall(r"REDG\.E\.ADD\.STRONG\.GPU", text)) == 2
    assert len(re.findall(r"NANOSLEEP", text)) == 2       # one poll loop per branch
    assert len(re.findall(r"LDG\.E\.STRONG\.GPU R\d+,", text)) == 4   # 32-bit polls
    assert linked["linked"].kernel_json.read_text().count('"cooperative": true') == 1
