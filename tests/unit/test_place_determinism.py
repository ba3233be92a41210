"""Placement bytes do not depend on the number of solver workers or on the process: the
same problem gives the same placement.json from 1 and 8 workers, and from two separate
interpreters. Rows are problems whose optimum one thread proves within its budget (the
scope of the guarantee; ``solver.status`` says when a placement is outside it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pipelink.place import place
from pipelink.problem import Problem
from pipelink.synth import gemm, synth

ROOT = Path(__file__).resolve().parents[2]

PROBLEMS = {
    "gemm_sm90": ("gemm()", gemm()),
    "gemm_sm100": ("gemm('sm_100a')", gemm("sm_100a")),
    "synth_one_phase": ("synth(6, 24, seed=1)", synth(6, 24, seed=1)),
    "synth_phases": ("synth(12, 48, seed=5)", synth(12, 48, seed=5)),
    "synth_tmem": ("synth(8, 48, seed=4, arch='sm_100a')", synth(8, 48, seed=4, arch="sm_100a")),
}


@pytest.mark.parametrize("problem", [p for _, p in PROBLEMS.values()], ids=PROBLEMS.keys())
def test_same_bytes_for_any_worker_count(problem: Problem):
    one = place(problem, workers=1)
    assert one.solver["status"] == "OPTIMAL"
    assert place(problem, workers=8).to_json() == one.to_json()
    assert place(problem, workers=2).to_json() == one.to_json()


def _in_subprocess(expr: str, workers: int) -> str:
    code = ("import sys; from pipelink.place import place; "
            "from pipelink.synth import gemm, synth; "
            f"sys.stdout.write(place({expr}, workers={workers}).to_json())")
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout


def test_same_bytes_from_separate_processes():
    for expr, problem in (PROBLEMS["gemm_sm90"], PROBLEMS["synth_phases"]):
        here = place(problem).to_json()
        assert _in_subprocess(expr, 1) == here
        assert _in_subprocess(expr, 8) == here
