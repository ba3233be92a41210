"""`lane:` on an instance: its role runs in another instance's role's warps, after it in
the same loop, as a register hand-off would place it (no compiler)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from pipelink.check import check
from pipelink.contract import load_contract
from pipelink.errors import CheckError
from pipelink.recipe import load_recipe

from ..conftest import check_repo_recipe

ROOT = Path(__file__).resolve().parents[2]


def _backward(arch: str):  # noqa: ANN202
    recipe = load_recipe(ROOT / "recipes" / "attn_causal.yaml").select(["backward"])["backward"]
    bound = {name: load_contract(ROOT / "components" / i.component / "contract.yaml")
             .bind(i.params) for name, i in recipe.instances(arch).items()}
    return check(recipe, arch, bound)


def test_two_epilogues_share_one_warpgroup_in_order():
    """attn_causal's backward on sm_100a: dK's and dV's Tensor Memory epilogues in one
    lane, dK's first; on sm_90a they already share the core's warps (register
    hand-offs), and the lane: changes nothing there."""
    lanes = {lane.name: lane for lane in _backward("sm_100a").lanes}
    assert lanes["dk_store.store+dv_store.store"].members == (("dk_store", "store"),
                                                              ("dv_store", "store"))
    hopper = {lane.name for lane in _backward("sm_90a").lanes}
    assert "core.mma+dk_store.store+dv_store.store" in hopper


def _lane(instance: str, lane: str) -> Any:
    def edit(data: dict[str, Any]) -> None:
        spec = data["instances"][instance]
        data["instances"][instance] = {**({"component": spec} if isinstance(spec, str)
                                          else spec), "lane": lane}
    return edit


@pytest.mark.parametrize("edit,words", [
    (_lane("store", "nope"), ["instances.store.lane", "'nope'", "no other instance"]),
    (_lane("store", "store"), ["instances.store.lane", "no other instance"]),
    # One warp beside a warpgroup.
    (_lane("store", "load"), ["different warp counts", "store.store 4", "load.producer 1"]),
    # The MMA warp consumes the loader's ring, the epilogue the scheduler's: in one lane
    # the producer would wait forever.
    (_lane("mma", "load"), ["instances.mma.lane", "'load.a -> mma.a'", "runs after it"]),
    (_lane("store", "sched"), ["instances.store.lane", "'sched.work -> store.work'"]),
    # The loader's tiles reach the epilogue through the MMA warp: the loader, run after
    # the epilogue, would never feed the MMA warp the epilogue waits on.
    (_lane("load", "store"), ["instances.load.lane", "reaches 'store' through other",
                              "runs after it"]),
])
def test_lanes_that_cannot_be_are_refused(tmp_path, edit, words):
    with pytest.raises(CheckError) as err:
        check_repo_recipe(tmp_path, "gemm", "sm_100a", edit)
    text = str(err.value)
    assert "recipes/gemm.yaml" in text
    for word in words:
        assert word in text, text


def test_a_cycle_of_lanes_is_refused(tmp_path):
    """dV's store runs after dK's (the recipe's lane:); dK's after dV's too would leave
    no order to run them in: refused naming the cycle, not placed in recipe order."""
    data = yaml.safe_load((ROOT / "recipes" / "attn_causal.yaml").read_text())
    instances = data["kernels"]["backward"]["instances"]
    instances["dk_store"] = {**instances["dk_store"], "lane": "dv_store"}
    path = tmp_path / "recipes" / "attn_causal.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    recipe = load_recipe(path).select(["backward"])["backward"]
    bound = {name: load_contract(ROOT / "components" / i.component / "contract.yaml")
             .bind(i.params) for name, i in recipe.instances("sm_100a").items()}
    with pytest.raises(CheckError) as err:
        check(recipe, "sm_100a", bound)
    text = str(err.value)
    for words in ("instances.dk_store.lane", "dk_store -> dv_store -> dk_store",
                  "drop lane: from one of them"):
        assert words in text, text
