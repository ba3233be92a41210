"""The text map and the SVG of a placement: complete (every buffer, barrier, role and TMEM
allocation appears, with its source), in address order, well-formed, and byte-stable."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import replace

import pytest

from pipelink.place import place
from pipelink.problem import Buffer, Problem, Sized
from pipelink.report import explain, svg
from pipelink.synth import gemm, synth

SHARED = replace(gemm(), buffers=gemm().buffers + (
    Buffer("epi.c_in", Sized.const(32 * 1024), 1024, None, "epi.yaml: smem.c_in"),),
    shared=(("store.c_stage", "epi.c_in"),))

PROBLEMS = {
    "gemm_sm90": gemm(),
    "gemm_sm100": gemm("sm_100a"),
    "phases": synth(12, 48, seed=5),
    "zero_copy": SHARED,
}
PLACED = {name: (p, place(p)) for name, p in PROBLEMS.items()}
CASES = list(PLACED.values())


@pytest.mark.parametrize("problem,placement", CASES, ids=PLACED.keys())
def test_explain_lists_every_demand_with_its_source(problem: Problem, placement):
    text = explain(problem, placement)
    for b in problem.buffers:
        line = next(x for x in text.splitlines() if f" {b.name} " in f"{x} ")
        assert b.source in line
        offset, size = placement.smem[b.name]
        assert f"{offset:#07x}" in line and f"{offset + size:#07x}" in line
    for b in problem.barriers:
        assert re.search(rf"^\s+{placement.barriers[b.name]}\s+{re.escape(b.name)}\b", text,
                         re.M)
    for r in problem.roles:
        assert r.name in text and r.source in text
    for wg, regs in enumerate(placement.warpgroup_regs):
        assert f"warpgroup {wg} " in text and f"setmaxnreg {regs}" in text
    assert f"__launch_bounds__({placement.threads}, 1)" in text
    for t in problem.tmem:
        assert t.name in text
    for t in problem.tunables:
        assert re.search(rf"^\s+{re.escape(t.name)}\s+{placement.tunables[t.name]}\s", text, re.M)


@pytest.mark.parametrize("problem,placement", CASES, ids=PLACED.keys())
def test_explain_map_is_in_address_order(problem: Problem, placement):
    offsets = [int(m.group(1), 16) for m in re.finditer(r"^\s+(0x[0-9a-f]+)\s+0x", explain(
        problem, placement), re.M)]
    assert offsets == sorted(offsets) and offsets


def test_explain_shows_gaps_and_zero_copy():
    problem, placement = PLACED["zero_copy"]
    text = explain(problem, placement)
    assert "epi.c_in (= store.c_stage, zero-copy)" in text
    assert placement.smem["epi.c_in"][0] == placement.smem["store.c_stage"][0]


@pytest.mark.parametrize("problem,placement", CASES, ids=PLACED.keys())
def test_svg_is_well_formed_complete_and_stable(problem: Problem, placement):
    picture = svg(problem, placement)
    root = ET.fromstring(picture)
    assert root.tag.endswith("svg")
    titles = [t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}title")]
    for name in (*placement.smem, *placement.roles):
        assert any(t.startswith(f"{name}:") for t in titles), name
    # Integer coordinates only: no float formatting to differ between machines.
    assert not re.search(r' (x|y|width|height|x1|x2|y1|y2)="-?\d+\.\d', picture)
    assert svg(problem, placement) == picture
    assert "/work/" not in picture


def test_report_does_not_need_the_solver_dict():
    problem, placement = PLACED["gemm_sm90"]
    bare = replace(placement, solver={})
    assert "solver:" not in explain(problem, bare)
    assert explain(problem, bare).splitlines()[0] == explain(problem, placement).splitlines()[0]
