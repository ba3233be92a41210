"""bench/RESULTS.md is generated section by section: each benchmark's --report writes
its own section from its JSON, in place, and leaves the others as they are. Also the
command line the newer benchmarks share (run on the GPU -> JSON; --report -> section)."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def put_section(heading: str, section: str, results: Path = RESULTS) -> None:
    """Replaces the section that starts with `heading` (a '## ...' line prefix) by
    `section`, where it stands, or appends it; the write is atomic."""
    text = results.read_text() if results.is_file() else "# Benchmark results\n"
    pattern = re.compile(re.escape(heading) + r".*?(?=\n## |\Z)", re.S)
    body = section.rstrip() + "\n"
    text = (pattern.sub(lambda _: body, text, count=1) if pattern.search(text)
            else text.rstrip() + "\n\n" + body)
    tmp = results.with_suffix(".md.tmp")
    tmp.write_text(text.rstrip() + "\n")
    tmp.replace(results)


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
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps({**data, "rows": rows}, indent=1) + "\n")
    tmp.replace(out)
