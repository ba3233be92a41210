"""bench/results_md.py, which every benchmark's --report writes RESULTS.md and its plots
through (CPU only: reports are generated from JSON)."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "results_md", Path(__file__).resolve().parents[2] / "bench" / "results_md.py")
results_md = importlib.util.module_from_spec(_SPEC)
sys.modules.setdefault("results_md", results_md)      # its dataclasses look themselves up
_SPEC.loader.exec_module(results_md)

LAYOUT = results_md.BarLayout(width=200, height=240, group=50, step=13, bar=12)


def _rects(svg: str) -> list[dict[str, float]]:
    return [{k: float(v) for k, v in re.findall(r'(x|y|height)="([\d.]+)"', m)}
            for m in re.findall(r"<rect ([^>]*)>", svg)]


def test_bars_stand_on_the_axis_in_proportion_and_empty_slots_stay_empty() -> None:
    Bar, BarGroup = results_md.Bar, results_md.BarGroup
    groups = [BarGroup([Bar(2.0, "red", "a: 2"), None, Bar(1.0, "blue", "c: 1")], ("one", "x")),
              BarGroup([Bar(4.0, "red", "d: 4")], ("two", "y"))]
    svg = results_md.bar_chart(groups, LAYOUT, title="t", top=4.0, reference=1.0)
    rects = _rects(svg)
    assert len(rects) == 3                               # the None slot draws nothing
    axis = LAYOUT.height - results_md.PAD
    plot = LAYOUT.height - 2 * results_md.PAD
    for r, value in zip(rects, (2.0, 1.0, 4.0), strict=True):
        assert r["y"] + r["height"] == pytest.approx(axis, abs=0.11)
        assert r["height"] == pytest.approx(plot * value / 4.0, abs=0.11)
    # The third bar of group one keeps its slot (two steps in); group two starts a group on.
    assert [r["x"] for r in rects] == [40, 40 + 2 * 13, 40 + 50]
    assert "<title>c: 1</title>" in svg and ">two</text>" in svg and ">y</text>" in svg
    line = re.search(r'<line [^>]*y1="([\d.]+)"', svg)
    assert float(line.group(1)) == pytest.approx(axis - plot / 4.0, abs=0.06)


def test_a_group_with_labels_the_layout_has_no_row_for_is_refused() -> None:
    group = results_md.BarGroup([results_md.Bar(1.0, "red", "a")], ("one", "two", "three"))
    with pytest.raises(ValueError):
        results_md.bar_chart([group], LAYOUT, title="t", top=2.0, reference=1.0)


def test_a_section_is_replaced_where_it_stands_and_a_new_one_appended(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n\n## A\n\nold a\n\n## B\n\nold b\n")
    results_md.put_section("## A", "## A\n\nnew a\n", results)
    results_md.put_section("## C", "## C\n\nnew c\n", results)
    text = results.read_text()
    assert text.index("new a") < text.index("old b") < text.index("new c")
    assert "old a" not in text
    assert [p.name for p in tmp_path.iterdir()] == ["RESULTS.md"]     # no temporary left


def test_a_partial_rerun_keeps_the_other_recipes_rows_of_the_same_gpu(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    order = ("r1", "r2")
    first = {"gpu": "H200", "torch": "2.11", "rows": [{"recipe": "r2", "v": 1},
                                                     {"recipe": "r1", "v": 2}]}
    results_md.write_rows(out, first, order)
    results_md.write_rows(out, {**first, "rows": [{"recipe": "r1", "v": 3}]}, order)
    assert json.loads(out.read_text())["rows"] == [{"recipe": "r1", "v": 3},
                                                   {"recipe": "r2", "v": 1}]
    # A run of every recipe cut short after r2: r1, not reached, keeps its rows.
    results_md.write_rows(out, {**first, "rows": [{"recipe": "r2", "v": 5}]}, order)
    assert json.loads(out.read_text())["rows"] == [{"recipe": "r1", "v": 3},
                                                   {"recipe": "r2", "v": 5}]
    # A recipe no longer in the bench's order leaves with the next run.
    results_md.write_rows(out, {**first, "rows": [{"recipe": "r2", "v": 6}]}, ("r2",))
    assert json.loads(out.read_text())["rows"] == [{"recipe": "r2", "v": 6}]
    # Rows of another GPU are not mixed in.
    results_md.write_rows(out, first, order)
    results_md.write_rows(out, {"gpu": "H100", "torch": "2.11",
                                "rows": [{"recipe": "r2", "v": 4}]}, order)
    assert json.loads(out.read_text())["rows"] == [{"recipe": "r2", "v": 4}]
