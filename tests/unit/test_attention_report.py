"""bench/attention.py's report from JSON (CPU): cases SDPA has no counterpart for (a
score modifier) report against FlexAttention alone, with '-' where SDPA's numbers go."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from bench import attention  # noqa: E402


def _row(recipe: str, times: dict[str, float]) -> dict:
    return {"recipe": recipe, "B": 1, "H": 16, "S": 4096, "D": 128, "flops": 1e12,
            "floor_ms": 1.0, "events_ms": dict(times), "do_bench_ms": dict(times)}


ROWS = [_row("attn_causal", {"linked": 2.0, "mono": 2.0, "sdpa": 3.0, "flex": 4.0}),
        _row("attn_softcap", {"linked": 2.0, "mono": 2.5, "flex": 5.0})]


def test_summary_names_sdpa_only_where_it_has_the_case() -> None:
    causal, softcap = attention.summary_lines(ROWS, ("attn_causal", "attn_softcap"))
    assert "vs SDPA 1.50x (events), 1.50x (do_bench)" in causal
    assert "SDPA" not in softcap
    assert "vs FlexAttention 2.50x (events), 2.50x (do_bench); linked/mono 0.800" in softcap


def test_table_and_plot_leave_sdpa_out_of_a_scored_case() -> None:
    table = attention.table_lines(ROWS)
    causal, softcap = table[2].split(" | "), table[3].split(" | ")
    assert causal[7] == "3.000" and causal[9] == "1.50"
    assert softcap[7] == "-" and softcap[9] == "-" and softcap[10] == "2.50"
    assert len(causal) == len(softcap) == len(table[0].split(" | "))
    svg = attention.tflops_svg(ROWS, peak=800.0, what="forward")
    tips = re.findall(r"<title>([^<]*)</title>", svg)
    assert sum("attn_causal" in t for t in tips) == 3
    assert [t.split()[-3] for t in tips if "attn_softcap" in t] == ["linked:", "flex:"]
