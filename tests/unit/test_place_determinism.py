"""Placement bytes do not depend on the number of solver workers or on the process: the
same problem gives the same placement.json from 1, 2 and 8 workers, and from two separate
interpreters. The ``HARD`` rows are synthetic problems one thread cannot prove within its
budget; with parallel workers they used to give other bytes, and one of them a placement
that broke the placer's own rules."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pipelink.errors import PlacementError
from pipelink.place import place, verify
from pipelink.problem import Problem
from pipelink.synth import first_fit_smem, gemm, synth

ROOT = Path(__file__).resolve().parents[2]

PROVEN = {
    "gemm_sm90": ("gemm()", gemm()),
    "gemm_sm100": ("gemm('sm_100a')", gemm("sm_100a")),
    "synth_one_phase": ("synth(6, 24, seed=1)", synth(6, 24, seed=1)),
    "synth_phases": ("synth(12, 48, seed=5)", synth(12, 48, seed=5)),
    "synth_tmem": ("synth(8, 48, seed=4, arch='sm_100a')", synth(8, 48, seed=4, arch="sm_100a")),
}

# (components, buffers, seed, arch) where workers=2 once differed from workers=1.
HARD = [(8, 32, 1, "sm_90a"), (8, 32, 6, "sm_100a"), (12, 48, 1, "sm_90a"),
        (16, 64, 5, "sm_90a")]
HARD_SLOW = [(8, 32, 6, "sm_90a"), (8, 64, 7, "sm_100a"), (12, 48, 1, "sm_100a")]


def _peak(smem: dict[str, tuple[int, int]]) -> int:
    return max([0] + [offset + size for offset, size in smem.values()])


@pytest.mark.parametrize("problem", [p for _, p in PROVEN.values()], ids=PROVEN.keys())
def test_same_bytes_for_any_worker_count(problem: Problem):
    one = place(problem, workers=1)
    assert one.solver["status"] == "OPTIMAL"
    assert place(problem, workers=8).to_json() == one.to_json()
    assert place(problem, workers=2).to_json() == one.to_json()


def _hard_case(components: int, buffers: int, seed: int, arch: str, workers: int) -> None:
    problem = synth(components, buffers, seed=seed, arch=arch)
    one = place(problem, workers=1)
    many = place(problem, workers=workers)
    assert many.to_json() == one.to_json()
    assert verify(problem, many) == []
    # No first-fit layout at the chosen tunables beats the placement's peak.
    assert one.smem_bytes <= _peak(first_fit_smem(problem, one.tunables))


@pytest.mark.parametrize("components,buffers,seed,arch", HARD)
def test_unproven_problems_same_bytes_with_two_workers(components: int, buffers: int,
                                                       seed: int, arch: str):
    _hard_case(components, buffers, seed, arch, 2)


@pytest.mark.slow
@pytest.mark.parametrize("components,buffers,seed,arch", HARD + HARD_SLOW)
def test_unproven_problems_same_bytes_with_eight_workers(components: int, buffers: int,
                                                         seed: int, arch: str):
    _hard_case(components, buffers, seed, arch, 8)


@pytest.mark.parametrize("workers", [0, -3])
def test_workers_below_one_refused(workers: int):
    with pytest.raises(PlacementError, match="at least one solver thread"):
        place(gemm(), workers=workers)


def _in_subprocess(expr: str, workers: int) -> str:
    code = ("import sys; from pipelink.place import place; "
            "from pipelink.synth import gemm, synth; "
            f"sys.stdout.write(place({expr}, workers={workers}).to_json())")
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout


def test_same_bytes_from_separate_processes():
    for expr, problem in (PROVEN["gemm_sm90"], PROVEN["synth_phases"]):
        here = place(problem).to_json()
        assert _in_subprocess(expr, 1) == here
        assert _in_subprocess(expr, 8) == here
