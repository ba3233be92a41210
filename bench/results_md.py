"""bench/RESULTS.md is generated section by section: each benchmark's --report writes
its own section from its JSON, in place, and leaves the others as they are. Also the
command line the newer benchmarks share (run on the GPU -> JSON; --report -> section)."""

from __future__ import annotations

import argparse
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


def bench_main(run: Callable[[Path, int, Path | None], object],
               report: Callable[[Path], None], rounds: int = 9) -> None:
    """`python bench/X.py [--build DIR] [--json OUT] [--rounds N]` times on the GPU;
    `--report JSON` writes X's RESULTS.md section from an earlier run's JSON."""
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=str(RESULTS.parents[1] / "build" / "gpu"))
    p.add_argument("--json")
    p.add_argument("--report")
    p.add_argument("--rounds", type=int, default=rounds)
    a = p.parse_args()
    if a.report:
        report(Path(a.report))
        return
    run(Path(a.build), a.rounds, Path(a.json) if a.json else None)
