"""bench/compare_builds.py on the CPU: sizes parsed, inputs shaped from kernel.json (an
index input or an unbound size refused with the fix), and each case's line and verdict."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from bench import compare_builds as cb  # noqa: E402

GEMM_INPUTS = [{"name": "x", "dtype": "bf16", "shape": ["M", "K"]},
               {"name": "w", "dtype": "bf16", "shape": ["N", "K"]}]


def _kernel(tmp_path: Path, inputs: list[dict]) -> Path:
    folder = tmp_path / "gemm"
    folder.mkdir()
    outputs = [{"name": "c", "dtype": "bf16", "shape": ["M", "N"]}]
    (folder / "kernel.json").write_text(json.dumps({"launch": {"inputs": inputs,
                                                               "outputs": outputs}}))
    return folder


def test_sizes_parse_and_a_malformed_one_names_itself() -> None:
    assert cb.parse_sizes("B=4, S=4096,H=16") == {"B": 4, "S": 4096, "H": 16}
    with pytest.raises(cb.CompareError, match="'S:4096' is not NAME=INTEGER"):
        cb.parse_sizes("B=4,S:4096")


def test_inputs_take_their_shapes_from_kernel_json(tmp_path: Path) -> None:
    inputs = GEMM_INPUTS + [{"name": "bias", "dtype": "f32", "shape": ["N // 2"]}]
    shapes = cb.input_shapes(_kernel(tmp_path, inputs), {"M": 256, "N": 512, "K": 64})
    assert shapes == [("x", "bf16", (256, 64)), ("w", "bf16", (512, 64)),
                      ("bias", "f32", (256,))]


def test_an_unbound_size_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(cb.CompareError, match="--sizes binds no N") as e:
        cb.input_shapes(_kernel(tmp_path, GEMM_INPUTS), {"M": 256, "K": 64})
    assert "add them to --sizes" in str(e.value)


def test_an_index_input_is_refused(tmp_path: Path) -> None:
    inputs = GEMM_INPUTS + [{"name": "offsets", "dtype": "i32", "shape": ["G"]}]
    with pytest.raises(cb.CompareError, match="input 'offsets' is i32"):
        cb.input_shapes(_kernel(tmp_path, inputs), {"M": 1, "N": 1, "K": 1, "G": 1})


def test_a_folder_without_kernel_json_is_refused(tmp_path: Path) -> None:
    with pytest.raises(cb.CompareError, match="no kernel.json"):
        cb.input_shapes(tmp_path, {})


def _row(diff: float) -> dict:
    return {"sizes": {"M": 4096}, "events_ms": {"before": 1.1, "after": 1.0},
            "do_bench_ms": {"before": 0.9, "after": 1.0}, "relative_diff": {"c": diff}}


def test_a_case_line_gives_both_ratios_and_fails_on_a_mismatch() -> None:
    line, ok = cb.summary(_row(1e-3), cb.TOLERANCE)
    assert ok and "before/after 1.100x / 0.900x" in line and "1.100 -> 1.000 ms" in line
    assert not cb.summary(_row(0.5), cb.TOLERANCE)[1]
    line, ok = cb.summary(_row(float("nan")), cb.TOLERANCE)     # NaNs apart
    assert not ok and line.endswith("MISMATCH")


def test_do_bench_rounds_swap_which_kernel_goes_first(monkeypatch) -> None:
    """do_bench times one kernel after the other; over rounds each goes first as often,
    so neither always runs on the hotter GPU."""
    import types

    from bench.gemm_swiglu import flushed
    calls: list[str] = []
    fake = types.ModuleType("triton.testing")
    fake.do_bench = lambda fn, **_: calls.append(fn()) or 1.0
    monkeypatch.setitem(sys.modules, "triton", types.ModuleType("triton"))
    monkeypatch.setitem(sys.modules, "triton.testing", fake)
    times = flushed({"before": lambda: "before", "after": lambda: "after"}, rounds=4)
    assert times == {"before": 1.0, "after": 1.0}
    assert calls == ["before", "after", "after", "before"] * 2
