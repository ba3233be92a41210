"""An argument's `max` (what a component's object was built to handle): a literal bind
above it is refused by the checker, naming the recipe key, the component and the bound;
a bind to an expression over sizes becomes a runtime condition in kernel.json, which
refuses a call whose sizes exceed it before anything launches."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelink.check import arg_requires
from pipelink.errors import CheckError, RuntimeLaunchError
from pipelink.link import launch_spec
from pipelink.runtime.spec import LaunchSpec

from ..conftest import check_repo_recipe


def _route_to(k: int | str):  # noqa: ANN202
    def edit(data: dict) -> None:
        data["launch"]["bind"]["router.top_k"] = k
    return edit


def test_a_literal_above_max_is_refused(tmp_path: Path):
    with pytest.raises(CheckError) as err:
        check_repo_recipe(tmp_path, "moe_layer", edit=_route_to(9))
    text = str(err.value)
    assert "launch.bind.router.top_k" in text
    assert "'moe_router' handles at most 8 (max: max_top_k), bound to 9" in text
    assert "moe_layer.yaml" in text


def test_an_expression_of_no_size_above_max_is_refused(tmp_path: Path):
    """'2 * 8' is one value for every call: above max, it used to become the runtime
    condition '2 * 8 <= 8', which refused every call after the build."""
    with pytest.raises(CheckError) as err:
        check_repo_recipe(tmp_path, "moe_layer", edit=_route_to("2 * 8"))
    assert "'moe_router' handles at most 8 (max: max_top_k), bound to '2 * 8', which is " \
           "16" in str(err.value)


def test_a_literal_within_max_checks(tmp_path: Path):
    kernel = check_repo_recipe(tmp_path, "moe_layer", edit=_route_to(8))
    assert "router.top_k" not in " ".join(arg_requires(kernel))


def test_an_expression_becomes_a_runtime_condition(tmp_path: Path):
    kernel = check_repo_recipe(tmp_path, "moe_forward")
    # dispatch.experts: E, with max: max_experts (64): the only place the bound is stated;
    # combine.top_k: K, with max 32 (a lane per choice)
    assert arg_requires(kernel) == ["K <= 32", "E <= 64"]
    launch = launch_spec(kernel.recipe.launch, arg_requires(kernel))
    assert launch["require"].count("E <= 64") == 1
    spec = LaunchSpec.from_meta({"launch": launch, "params": {"fields": []}})
    shapes = {"x": (16, 64), "topk_ids": (16, 2), "topk_w": (16, 2), "w1": (80, 32, 64),
              "w2": (80, 64, 16)}
    dtypes = {"x": "bf16", "topk_ids": "i32", "topk_w": "f32", "w1": "bf16", "w2": "bf16"}
    with pytest.raises(RuntimeLaunchError) as err:
        spec.sizes(shapes, dtypes)
    assert "E <= 64" in str(err.value) and "E = 80" in str(err.value)
