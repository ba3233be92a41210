"""The toolchain is there where it must be. With ``PIPELINK_REQUIRE_TOOLCHAIN=1`` (set by
.ci/run; ``CI=true`` implies it) a missing nvcc, nvJitLink or cuobjdump fails here, and
every test skipped for a missing tool fails too (tests/conftest.py), so CI cannot pass
green by skipping. Elsewhere these rows skip, saying what is missing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipelink.errors import ToolchainError
from pipelink.toolchain import discover

from ..conftest import REQUIRE_TOOLCHAIN
from .sass import cuobjdump

ROOT = Path(__file__).resolve().parents[2]


def _missing(what: str) -> None:
    if REQUIRE_TOOLCHAIN:
        pytest.fail(f"PIPELINK_REQUIRE_TOOLCHAIN=1 but {what}")
    pytest.skip(what)


def test_nvcc_and_nvjitlink_are_found_and_agree():
    try:
        tc = discover()
    except ToolchainError as exc:
        _missing(f"the toolchain is incomplete (nvcc / nvJitLink): {exc.message}")
    assert tc.nvcc_version[:2] <= tc.nvjitlink_version
    tc.require_arch("sm_90a")
    tc.require_arch("sm_100a")


def test_cuobjdump_is_found():
    if cuobjdump() is None:
        _missing("cuobjdump is not installed (pip install nvidia-cuda-cuobjdump)")


def test_a_tool_skip_fails_when_the_toolchain_is_required(tmp_path):
    """The conftest hook itself: a test that skips for nvcc fails under the flag."""
    probe = tmp_path / "tests" / "test_probe.py"
    probe.parent.mkdir()
    (probe.parent / "__init__.py").write_text("")
    (probe.parent / "conftest.py").write_text(
        (ROOT / "tests" / "conftest.py").read_text())
    probe.write_text("import pytest\n\n"
                     "def test_needs_a_tool():\n    pytest.skip('needs nvcc')\n\n"
                     "def test_other_skip():\n    pytest.skip('not on this OS')\n")
    runs = {}
    for flag in ("0", "1"):
        env = {**os.environ, "PIPELINK_REQUIRE_TOOLCHAIN": flag, "PYTHONPATH": str(ROOT)}
        runs[flag] = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir",
             str(tmp_path), str(probe)], cwd=tmp_path, env=env, capture_output=True,
            text=True, timeout=120)
    assert runs["0"].returncode == 0, runs["0"].stdout
    assert "2 skipped" in runs["0"].stdout
    assert runs["1"].returncode == 1, runs["1"].stdout
    assert "1 failed" in runs["1"].stdout and "1 skipped" in runs["1"].stdout
    assert "PIPELINK_REQUIRE_TOOLCHAIN=1, but" in runs["1"].stdout
