"""bench/gemm_raster.py on the CPU: a rebound copy of a built folder changes
kernel.json's group_m bind and nothing else, a non-constant bind is refused, and the
report from JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from bench import gemm_raster as raster  # noqa: E402


def _built(tmp_path: Path, group_m: str = "8") -> Path:
    folder = tmp_path / "built" / "gemm"
    folder.mkdir(parents=True)
    meta = {"launch": {"bind": {"sched.group_m": group_m, "sched.k_tiles": "ceil_div(K, 64)"}}}
    (folder / "kernel.json").write_text(json.dumps(meta))
    (folder / "gemm.cubin").write_bytes(bytes(range(256)))
    return folder


def test_a_copy_rebinds_group_m_and_keeps_every_other_byte(tmp_path: Path) -> None:
    folder = _built(tmp_path)
    copy = raster.with_group(folder, 16, tmp_path)
    bind = json.loads((copy / "kernel.json").read_text())["launch"]["bind"]
    assert bind == {"sched.group_m": "16", "sched.k_tiles": "ceil_div(K, 64)"}
    assert (copy / "gemm.cubin").read_bytes() == (folder / "gemm.cubin").read_bytes()
    assert raster.built_group(folder) == 8       # the built folder is untouched


def test_a_group_m_that_is_not_a_constant_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="sched.group_m is 'M // 128', not a constant"):
        raster.built_group(_built(tmp_path, "M // 128"))


def test_the_report_puts_each_candidate_over_the_built_bind(tmp_path: Path) -> None:
    rows = [{"recipe": "gemm", "M": 4096, "N": 22016, "K": 4096, "built": 8,
             "events_ms": {"4": 1.1, "8": 1.0, "16": 0.9, "32": 0.95},
             "do_bench_ms": {"4": 1.2, "8": 1.0, "16": 0.8, "32": 1.0}}]
    data = tmp_path / "gemm_raster.json"
    data.write_text(json.dumps({"gpu": "G", "torch": "T", "rows": rows}))
    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n")
    raster.report(data, results)
    text = results.read_text()
    assert "## GEMM raster groups (G)" in text
    assert "group_m 16 1.111x / 1.250x" in text          # built 1.0 over 0.9, 1.0 over 0.8
    assert "| gemm | 4096 | 22016 | 4096 | 8 | 1.000 | 1.100 / 1.200 | 1.000 / 1.000 | " \
           "**0.900 / 0.800** | 0.950 / 1.000 |" in text
