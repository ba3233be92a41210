"""launch.contents: rules on the values of index tensors (cu_seqlens, page tables),
checked before a launch. The device reductions run here on CPU tensors; each broken
rule is refused naming the tensor, the entry and the rule."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from pipelink.check import check
from pipelink.contract import load_contract
from pipelink.errors import CheckError, RuntimeLaunchError
from pipelink.recipe import load_recipe
from pipelink.runtime.contents import ContentRule
from pipelink.runtime.contents import check as check_contents
from pipelink.runtime.spec import evaluate

ROOT = Path(__file__).resolve().parents[2]
OFFSETS = ContentRule("cu_seqlens", ordered=True, first=0, last="T")
PAGES = ContentRule("block_table", min=0, max="NB - 1")


def run(rule: ContentRule, values: list[int], **sizes: int) -> None:
    check_contents((rule,), {rule.tensor: torch.tensor(values, dtype=torch.int32)}, sizes,
                   evaluate)


def test_good_indices_pass():
    run(OFFSETS, [0, 300, 300, 301, 1000], T=1000)
    run(PAGES, [[0, 7], [3, 2]], NB=8)
    run(OFFSETS, [], T=0)


@pytest.mark.parametrize("rule,values,sizes,needle", [
    (OFFSETS, [0, 300, 200, 1000], {"T": 1000}, "must not decrease, but entry 2 is 200 after 300"),
    (OFFSETS, [5, 300, 1000], {"T": 1000}, "its first entry must be 0 (0), got 5"),
    (OFFSETS, [0, 300, 999], {"T": 1000}, "its last entry must be 1000 (T), got 999"),
    (PAGES, [[0, 7], [8, 2]], {"NB": 8}, "entry 2 is 8, outside [0, 7]"),
    (PAGES, [[0, -1]], {"NB": 8}, "entry 1 is -1, outside [0, 7]"),
])
def test_broken_indices_are_refused(rule, values, sizes, needle):
    with pytest.raises(RuntimeLaunchError) as err:
        run(rule, values, **sizes)
    assert needle in str(err.value), str(err.value)
    assert f"launch.contents.{rule.tensor}" in str(err.value)


def _bound(path: Path):  # noqa: ANN202
    recipe = load_recipe(path).kernels()["forward"]
    return recipe, {n: load_contract(ROOT / "components" / i.component / "contract.yaml")
                    .bind(i.params) for n, i in recipe.instances("sm_90a").items()}


@pytest.mark.parametrize("rules,needle", [
    ({"cu_seqlen": {"ordered": True}}, "'cu_seqlen' is not an input of the launch"),
    ({"cu_seqlens": {"last": "TOTAL"}}, "names size TOTAL"),
])
def test_the_checker_refuses_rules_it_cannot_evaluate(tmp_path, rules, needle):
    data = yaml.safe_load((ROOT / "recipes" / "attn_document.yaml").read_text())
    base = yaml.safe_load((ROOT / "recipes" / "attn_causal.yaml").read_text())
    (tmp_path / "attn_causal.yaml").write_text(yaml.safe_dump(base))
    data["kernels"]["forward"]["launch"]["contents"] = rules
    path = tmp_path / "attn_document.yaml"
    path.write_text(yaml.safe_dump(data))
    recipe, bound = _bound(path)
    with pytest.raises(CheckError, match=needle):
        check(recipe, "sm_90a", bound)
