"""recipes/moe_train for Blackwell with real nvcc and nvJitLink, no GPU needed: its three
kernels (forward, backward, w1_grad) check, place and link for sm_100a, and in the
SASS every GEMM phase issues tcgen05 MMAs (four UTCHMMA per k-tile loop body) and no Hopper
wgmma, Tensor Memory is allocated and freed once per kernel, and nothing spills to
local memory (the verifier refuses spills; this reads the cubins themselves)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from .sass import cuobjdump, sass_instructions

ARCH = "sm_100a"
# kernel -> its GEMM phases (each a tcgen05 mainloop with its own k-tile loop)
GEMM_PHASES = {"forward": 2, "backward": 5, "w1_grad": 1}
MMAS_PER_K_TILE = 64 // 16                # tile_k 64, one bf16 tcgen05.mma per K = 16
# tcgen05.alloc / dealloc in SASS (see tests/integration/test_umma.py)
ALLOC, DEALLOC = "UTCATOMSWS.FIND_AND_SET.ALIGN", "UTCATOMSWS.AND"

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")


@pytest.fixture(scope="module")
def cubins(link_repo_kernel) -> dict[str, Path]:  # noqa: ANN001
    """kernel -> its sm_100a cubin, from the session's links (test_work_ring links every
    recipe for every arch it names: reading them costs no compile)."""
    return {k: link_repo_kernel("moe_train", ARCH, "linked", k).cubin for k in GEMM_PHASES}


@pytest.mark.parametrize("kernel", sorted(GEMM_PHASES))
def test_every_gemm_phase_runs_on_tcgen05(cubins, kernel):
    ops = sass_instructions(cubins[kernel])
    # At least one k-tile loop per GEMM phase, each whole (the compiler may lay out a
    # loop body twice: the forward's CuTe mainloop phases show 8 each).
    mmas = ops.count("UTCHMMA")
    assert mmas >= MMAS_PER_K_TILE * GEMM_PHASES[kernel] and mmas % MMAS_PER_K_TILE == 0, mmas
    assert not [op for op in ops if "GMMA" in op or op.startswith("WARPGROUP")]
    assert ALLOC in ops and ops.count(DEALLOC) == 1


@pytest.mark.parametrize("kernel", sorted(GEMM_PHASES))
def test_no_local_memory(cubins, kernel):
    usage = subprocess.run([cuobjdump(), "-res-usage", str(cubins[kernel])],
                           capture_output=True, text=True, check=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", usage)
    assert found and (found[2], found[3]) == ("0", "0"), usage
    assert not {"LDL", "STL"} & {op.split(".")[0] for op in sass_instructions(cubins[kernel])}
