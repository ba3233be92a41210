"""mlp (two phases) through real nvcc and nvJitLink (no GPU), for sm_90a and sm_100a:
linked and monolithic SASS are identical, nothing spills, and the grid-wide hand-off
shows as one release-add and one acquire-poll loop of the phase counter per branch."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from .sass import sass, sass_instructions

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")


@pytest.fixture(scope="module", params=["sm_90a", "sm_100a"])
def linked(request: pytest.FixtureRequest, link_repo_kernel) -> dict[str, object]:  # noqa: ANN001
    return {mode: link_repo_kernel("mlp", request.param, mode) for mode in ("linked", "mono")}


def test_linked_and_monolithic_sass_are_identical(linked):
    ops = sass_instructions(linked["linked"].cubin)
    assert ops == sass_instructions(linked["mono"].cubin)
    assert not {"LDL", "STL"} & {op.split(".")[0] for op in ops}


def test_grid_wide_hand_off_in_the_sass(linked):
    text = sass(linked["linked"].cubin)
    # Each warpgroup branch (two on sm_90a: producer and consumers; one on sm_100a,
    # which moves no registers) carries the boundary: one add, one poll loop.
    branches = 2 if linked["linked"].kernel.arch == "sm_90a" else 1
    assert len(re.findall(r"REDG\.E\.ADD\.STRONG\.GPU", text)) == branches
    assert len(re.findall(r"NANOSLEEP", text)) >= branches   # the poll's back-off
    assert len(re.findall(r"LDG\.E\.STRONG\.GPU R\d+,", text)) == 2 * branches
    assert linked["linked"].kernel_json.read_text().count('"cooperative": true') == 1
