"""Operand majorness: a loader and a mainloop each say whether A and B are K-major or
MN-major (params a_major, b_major), the ports' layouts follow ('sw128_{a_major}major'),
and the checker refuses a ring whose two ends disagree, naming both ports and both
layouts. The tensor maps' boxes follow the param too."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelink.contract import load_contract
from pipelink.errors import CheckError, ContractError

from ..conftest import check_repo_recipe

ROOT = Path(__file__).resolve().parents[2]


def _params(instance: str, **params: str):  # noqa: ANN202
    def edit(data: dict) -> None:
        data["instances"][instance].setdefault("params", {}).update(params)
    return edit


def test_mainloop_reading_mn_major_b_from_a_k_major_loader_is_refused(tmp_path: Path):
    with pytest.raises(CheckError) as err:
        check_repo_recipe(tmp_path, "gemm", edit=_params("mma", b_major="mn"))
    text = str(err.value)
    assert "'load.b' (tma_loader) -> 'mma.b' (wgmma_mainloop)" in text
    assert "sw128_kmajor" in text and "sw128_mnmajor" in text


def test_both_ends_mn_major_check(tmp_path: Path):
    def both(data: dict) -> None:
        _params("mma", a_major="mn", b_major="mn")(data)
        _params("load", a_major="mn", b_major="mn")(data)
    check_repo_recipe(tmp_path, "gemm", edit=both)
    check_repo_recipe(tmp_path / "b", "gemm", arch="sm_100a", edit=both)


@pytest.mark.parametrize(("major", "box_a", "box_b"), [
    ("k", [64, 128], [64, 256, 1]),     # (tile_k, rows)
    ("mn", [64, 64], [64, 64, 1]),      # (64 of M or N, tile_k), one box per 64
])
def test_loader_boxes_follow_the_majorness(major, box_a, box_b):
    bound = load_contract(ROOT / "components" / "tma_loader" / "contract.yaml") \
        .bind({"a_major": major, "b_major": major})
    args = bound.contract.data["args"]
    boxes = {a["name"]: [bound.eval(v, "box") for v in a["box"]] for a in args}
    assert boxes == {"tma_a": box_a, "tma_b": box_b}
    assert bound.layout("a") == f"sw128_{major}major"


def test_a_layout_naming_no_word_param_is_refused():
    contract = load_contract(ROOT / "components" / "tma_loader" / "contract.yaml")
    contract.ports["a"].spec["layout"] = "sw128_{a_majr}major"
    with pytest.raises(ContractError) as err:
        contract.bind({})
    assert "names no word param" in str(err.value) and "ports.a.layout" in str(err.value)
