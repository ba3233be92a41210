"""bench/attention_sections.py on the CPU: the rebound copies of a built folder change
kernel.json's section bind and nothing else, the candidates a size can tell apart, and
the report from JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from bench import attention_sections as sections  # noqa: E402


def _built(tmp_path: Path) -> Path:
    folder = tmp_path / "built" / "attn_causal"
    for kernel in sections.KERNELS:
        (folder / kernel).mkdir(parents=True)
        meta = {"launch": {"bind": {"sched.section": "min(B * H, 32)", "sched.seq": "S"}}}
        (folder / kernel / "kernel.json").write_text(json.dumps(meta))
        (folder / kernel / "k.cubin").write_bytes(bytes(range(256)))
    (folder / "kernels.json").write_text("{}")
    return folder


def test_a_copy_rebinds_the_section_and_keeps_every_other_byte(tmp_path: Path) -> None:
    folder = _built(tmp_path)
    (tmp_path / "copies").mkdir()
    copy = sections.with_sections(folder, {"backward": sections.bind_text("backward", 8)},
                                  tmp_path / "copies")
    bind = json.loads((copy / "backward" / "kernel.json").read_text())["launch"]["bind"]
    assert bind == {"sched.section": "min(B * HKV, 8)", "sched.seq": "S"}
    for path in folder.rglob("*"):
        if path.is_file() and path != folder / "backward" / "kernel.json":
            assert (copy / path.relative_to(folder)).read_bytes() == path.read_bytes()
    original = json.loads((folder / "backward" / "kernel.json").read_text())
    assert original["launch"]["bind"]["sched.section"] == "min(B * H, 32)"


def test_a_folder_without_the_bind_is_refused(tmp_path: Path) -> None:
    folder = _built(tmp_path)
    (folder / "forward" / "kernel.json").write_text(json.dumps({"launch": {"bind": {}}}))
    with pytest.raises(SystemExit, match="forward/kernel.json: no sched.section bind"):
        sections.with_sections(folder, {"forward": "B * H"}, tmp_path)


def test_candidates_that_cap_nothing_are_one_section() -> None:
    assert sections.bind_text("forward", None) == "B * H"
    assert list(sections.variants(64, 32)) == ["all", "32", "16", "8", "4"]
    assert list(sections.variants(16, 32)) == ["all", "8", "4"]
    # attn_dense's L2-sized bind (12 pairs at S4096 D128) is timed as its own variant
    assert sections.variants(64, 12)["built"] == 12
    assert [sections.built_name(64, 32), sections.built_name(16, 32),
            sections.built_name(64, 12)] == ["32", "all", "built"]


def _row(kernel: str, pairs: int, built: int, times: dict[str, float]) -> dict:
    return {"recipe": "attn_causal", "kernel": kernel, "B": 4, "H": 16, "S": 4096, "D": 128,
            "pairs": pairs, "bind": "min(B * H, 32)", "built": built,
            "built_as": sections.built_name(pairs, built),
            "events_ms": dict(times), "do_bench_ms": {k: 2 * v for k, v in times.items()}}


ROWS = [_row("forward", 64, 32, {"all": 2.0, "32": 1.6, "16": 1.8, "8": 2.5}),
        _row("forward", 16, 32, {"all": 4.0, "8": 4.4}),
        _row("backward", 64, 32, {"all": 5.0, "32": 4.0, "16": 4.5, "8": 6.0})]


def test_the_table_marks_the_built_bind_and_leaves_missing_caps_empty() -> None:
    head, _, big, small, _ = sections.table_lines(ROWS)
    assert len(big.split(" | ")) == len(small.split(" | ")) == len(head.split(" | "))
    cells = big.split(" | ")
    assert cells[8:10] == ["2.000", "**0.800 / 0.800**"]
    assert cells[11] == "**0.800 / 0.800**" and cells[12] == "0.900 / 0.900"
    assert cells[-1] == "- |"
    small_cells = small.split(" | ")
    assert small_cells[9] == "**1.000 / 1.000**" and small_cells[10] == "-"
    assert small_cells[-2] == "1.100 / 1.100"


def test_gains_are_the_built_binds_over_one_section() -> None:
    forward, backward = sections.gain_lines(ROWS)
    gain = (2.0 / 1.6) ** 0.5     # geomean of 1.25 (capped) and 1.0 (one section anyway)
    assert f"geomean of 2 cases: {gain:.3f}x / {gain:.3f}x" in forward
    assert "geomean of 1 cases: 1.250x / 1.250x" in backward
