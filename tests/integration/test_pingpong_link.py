"""gemm_pingpong through real nvcc and nvJitLink (no GPU): linked and monolithic SASS
are identical, and the SASS shows two teams: two copies of the mainloop's wgmma, each
team's epilogue on its own named barrier, nothing spilled."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from .sass import sass, sass_instructions

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
K_STEPS = 64 // 16        # wgmma per k-tile in one copy of the mainloop


@pytest.fixture(scope="module")
def linked(link_repo_kernel) -> dict[str, object]:  # noqa: ANN001
    return {mode: link_repo_kernel("gemm_pingpong", "sm_90a", mode) for mode in ("linked", "mono")}


def test_linked_and_monolithic_sass_are_identical(linked):
    ops = sass_instructions(linked["linked"].cubin)
    assert ops == sass_instructions(linked["mono"].cubin)
    assert not {"LDL", "STL"} & {op.split(".")[0] for op in ops}


def test_two_teams_in_the_sass(linked):
    text = sass(linked["linked"].cubin)
    p = linked["linked"].placement
    # One mainloop per team, each K_STEPS m64n256k16 wgmma per k-tile.
    assert len(re.findall(r"HGMMA\.64x256x16\.F32\.BF16", text)) == 2 * K_STEPS
    for key in ("store.staged", "store.staged@1"):
        assert re.search(rf"BAR\.SYNC(\.DEFER_BLOCKING)? {p.barriers[key]:#x}", text), key
