"""bench/RESULTS.md is generated section by section: each benchmark's --report writes
its own section from its JSON, in place, and leaves the others as they are."""

from __future__ import annotations

import re
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
