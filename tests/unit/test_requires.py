"""A contract's `requires`: rules on its params, checked when a recipe binds them.

Params a component's code cannot take are refused before anything compiles, naming the
rule, why it holds and the recipe's instance; rules that hold leave the binding as it
was. The toy tree of ``tests/conftest.py`` (the loader's rows 128, cols 64) and the
repository's components and recipes. No compiler, no GPU (the table of refusals is in
tests/unit/test_errors.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipelink.build import bind_components, default_index
from pipelink.errors import ContractError
from pipelink.recipe import load_recipe

from ..conftest import producer, toy_recipe
from .test_errors import put

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("check", ["rows % 64 == 0", "rows in (64, 128)", "rows >= 2 * cols",
                                   "(rows if dtype == 'bf16' else 64) == 128",
                                   "cols != rows", "dtype == 'bf16'", "dtype != 'f32'"])
def test_a_rule_that_holds_binds(tree, check):
    tree.toy()
    tree.component("loader", put("requires", [{"check": check, "why": "a reason"}])(producer()))
    tree.check(tree.recipe(toy_recipe()))


@pytest.mark.parametrize("check", ["rows % 256 == 0", "rows in (64, 256)", "rows < cols",
                                   "(rows if dtype == 'bf16' else 64) == 64",
                                   "dtype == 'f32'"])
def test_a_rule_the_params_break_is_refused(tree, check):
    tree.toy()
    tree.component("loader", put("requires", [{"check": check, "why": "a reason"}])(producer()))
    with pytest.raises(ContractError, match="requires .*: a reason"):
        tree.check(tree.recipe(toy_recipe()))


def _attention(tmp_path: Path, **constants: int) -> Path:
    """recipes/attn_causal.yaml with some constants changed, written under tmp_path."""
    data = yaml.safe_load((ROOT / "recipes" / "attn_causal.yaml").read_text())
    data["constants"].update(constants)
    path = tmp_path / "attn_x.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize("constants,instance,rule", [
    ({"head_dim": 96}, "load", "'attn_loader' requires head_dim % 64 == 0"),
    ({"head_dim": 256}, "core", "'attn_fwd_core' requires head_dim in (64, 128)"),
    ({"q_tile": 192}, "core", "'attn_fwd_core' requires (head_dim if tile_m == 192 else 64)"),
])
def test_attention_params_the_components_cannot_take_fail_before_nvcc(tmp_path, constants,
                                                                     instance, rule):
    recipe = load_recipe(_attention(tmp_path, **constants))
    with pytest.raises(ContractError) as info:
        bind_components(recipe.select(["forward"])["forward"], "sm_90a", default_index(ROOT))
    text = str(info.value)
    assert rule in text
    assert f"attn_x.yaml: kernels.forward.instances.{instance})" in text
    assert "hint: set " in text


@pytest.mark.parametrize("instance,params,rule", [
    ("mma", {"tile_k": 32}, "'wgmma_mainloop' requires tile_k * sizeof(dtype) == 128"),
    ("mma", {"tile_n": 200}, "'wgmma_mainloop' requires tile_n in (64, 128, 168, 192, 256)"),
    ("load", {"tile_m": 100}, "'tma_loader' requires tile_m % 8 == 0"),
])
def test_gemm_tiles_the_components_cannot_take_fail_before_nvcc(tmp_path, instance, params,
                                                                 rule):
    data = yaml.safe_load((ROOT / "recipes" / "gemm.yaml").read_text())
    data["instances"][instance]["params"].update(params)
    path = tmp_path / "gemm_x.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(ContractError) as info:
        (kernel,) = load_recipe(path).select(None).values()
        bind_components(kernel, "sm_90a", default_index(ROOT))
    assert rule in str(info.value)
    assert f"gemm_x.yaml: instances.{instance})" in str(info.value)


def test_the_shipped_recipes_keep_their_rules():
    """Every recipe binds on its archs: the rules say what the code takes."""
    for path in sorted((ROOT / "recipes").glob("*.yaml")):
        recipe = load_recipe(path)
        for kernel in recipe.select(None).values():
            for arch in kernel.archs:
                bind_components(kernel, arch, default_index(ROOT))
