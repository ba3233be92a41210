"""bench/RESULTS.md is generated section by section: each benchmark's --report writes
its own section from its JSON, in place, and leaves the others as they are. Also the
command line the newer benchmarks share (run on the GPU -> JSON; --report -> section)."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
PAD = 40                           # a chart's margin, pixels


def put_section(heading: str, section: str, results: Path = RESULTS) -> None:
    """Replaces the section that starts with `heading` (a '## ...' line prefix) by
    `section`, where it stands, or appends it; the write is atomic."""
    text = results.read_text() if results.is_file() else "# Benchmark results\n"
    pattern = re.compile(re.escape(heading) + r".*?(?=\n## |\Z)", re.S)
    body = section.rstrip() + "\n"
    text = (pattern.sub(lambda _: body, text, count=1) if pattern.search(text)
            else text.rstrip() + "\n\n" + body)
    write_text(results, text.rstrip() + "\n")


def bench_main(run: Callable[..., object], report: Callable[[Path], None], rounds: int = 9,
               recipes: tuple[str, ...] | None = None) -> None:
    """`python bench/X.py [--build DIR] [--json OUT] [--rounds N]` times on the GPU;
    `--report JSON` writes X's RESULTS.md section from an earlier run's JSON. Where the
    benchmark names its `recipes`, `--recipes A B` times only those and merges their
    rows into OUT's (see write_rows)."""
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=str(RESULTS.parents[1] / "build" / "gpu"))
    p.add_argument("--json")
    p.add_argument("--report")
    p.add_argument("--rounds", type=int, default=rounds)
    if recipes:
        p.add_argument("--recipes", nargs="+", choices=recipes, default=list(recipes))
    a = p.parse_args()
    if a.report:
        report(Path(a.report))
        return
    extra = {"recipes": tuple(r for r in recipes if r in a.recipes)} if recipes else {}
    run(Path(a.build), a.rounds, Path(a.json) if a.json else None, **extra)


def write_rows(out: Path, data: dict, timed: tuple[str, ...], order: tuple[str, ...]) -> None:
    """Writes a run's JSON to `out` atomically. A run that timed only some recipes keeps
    the rows of the others from the file already there (same GPU and torch only), so a
    partial rerun refreshes its rows and leaves the rest of the report whole."""
    rows = list(data["rows"])
    if out.is_file() and set(timed) != set(order):
        old = json.loads(out.read_text())
        if (old.get("gpu"), old.get("torch")) == (data["gpu"], data["torch"]):
            rows += [r for r in old["rows"] if r["recipe"] not in timed]
    rows.sort(key=lambda r: order.index(r["recipe"]))     # stable: shapes keep their order
    write_text(out, json.dumps({**data, "rows": rows}, indent=1) + "\n")


@dataclass(frozen=True)
class Bar:
    value: float       # in the chart's unit (0 at the axis, `top` at the top)
    color: str
    tooltip: str


@dataclass(frozen=True)
class BarGroup:
    bars: Sequence[Bar | None]       # None keeps its slot empty
    labels: Sequence[str]            # one text line each under the group


@dataclass(frozen=True)
class BarLayout:
    """Pixels: the chart's size, a group's width, a bar's step and width, and where the
    label lines under a group sit below the axis."""

    width: int
    height: int
    group: int
    step: int
    bar: int
    label_rows: Sequence[int] = (12, 24)


def bar_chart(groups: Sequence[BarGroup], layout: BarLayout, *, title: str, top: float,
              reference: float) -> str:
    """A grouped bar chart as a standalone SVG (the RESULTS.md plots): the title, a red
    line at `reference`, each group's bars side by side with a tooltip each, its labels
    under it."""
    height = layout.height
    y = lambda v: height - PAD - (height - 2 * PAD) * v / top  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{layout.width}" '
           f'height="{height}" font-family="sans-serif" font-size="10">',
           f'<text x="{PAD}" y="14">{title}</text>',
           f'<line x1="{PAD}" x2="{layout.width}" y1="{y(reference):.1f}" '
           f'y2="{y(reference):.1f}" stroke="red"/>']
    for i, group in enumerate(groups):
        x = PAD + layout.group * i
        for j, bar in enumerate(group.bars):
            if bar is None:
                continue
            out.append(f'<rect x="{x + layout.step * j}" y="{y(bar.value):.1f}" '
                       f'width="{layout.bar}" height="{y(0) - y(bar.value):.1f}" '
                       f'fill="{bar.color}"><title>{bar.tooltip}</title></rect>')
        for dy, label in zip(layout.label_rows, group.labels, strict=True):
            out.append(f'<text x="{x}" y="{height - PAD + dy}">{label}</text>')
    return "\n".join(out + ["</svg>"]) + "\n"


def write_text(path: Path, text: str) -> None:
    """Writes a generated file atomically (RESULTS.md, a run's JSON, a plot): a reader
    or an interrupted run never sees it half-written."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
