"""A recipe written over another (``extends:``): recipes/moe_train_simt.yaml swaps
moe_train's router and nothing else, so every other object is the very object moe_train
builds (same component, params, contract and arch: same compile, taken from the cache)
and the backward kernel's recipe content is moe_train's but for its name. Mistakes in
``extends:`` are refused naming the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipelink.errors import RecipeError
from pipelink.recipe import ComponentIndex, load_recipe
from pipelink.sconsrun import plans

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "recipes"
INDEX = ComponentIndex((ROOT / "components",))


def test_swapped_router_is_the_only_change():
    base, swapped = load_recipe(RECIPES / "moe_train.yaml"), load_recipe(
        RECIPES / "moe_train_simt.yaml")
    assert swapped.recipe_name == "moe_train_simt"
    b, s = base.data, swapped.data
    assert s["kernels"]["forward"]["instances"]["router"] == {"component": "moe_router_simt"}
    s["kernels"]["forward"]["instances"]["router"] = b["kernels"]["forward"]["instances"]["router"]
    assert {k: v for k, v in s.items() if k not in ("recipe", "description")} == \
        {k: v for k, v in b.items() if k not in ("recipe", "description")}


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_swap_recompiles_only_the_router(arch):
    base = {p.recipe.kernel: p for p in plans(RECIPES / "moe_train.yaml", arch, INDEX)}
    swapped = {p.recipe.kernel: p for p in plans(RECIPES / "moe_train_simt.yaml", arch, INDEX)}
    for kernel, plan in swapped.items():
        for inst, obj in plan.objects.items():
            same = obj.embedded() == base[kernel].objects[inst].embedded() and \
                obj.files == base[kernel].objects[inst].files
            assert same == ((kernel, inst) != ("forward", "router")), (kernel, inst)
    backward = [json.loads(p.recipe_content()) for p in (base["backward"],
                                                          swapped["backward"])]
    for doc in backward:
        doc.pop("recipe"), doc.pop("description")
    assert backward[0] == backward[1]


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(("text", "needle"), [
    ("recipe: a\nextends: nowhere\n", "extends names recipe 'nowhere', which is not in"),
    ("recipe: a\nextends: b\n", "recipes extend each other in a cycle: a -> b -> a"),
    ("recipe: b2\nextends: moe\n", "are both named 'moe'"),
    ("recipe: a\nextends: [moe]\n", "is not a recipe name"),
])
def test_bad_extends_is_refused(tmp_path, text, needle):
    _write(tmp_path, "b", "recipe: b\nextends: a\n")
    _write(tmp_path, "moe", "recipe: moe\narch: [sm_90a]\ninstances: {}\n")
    _write(tmp_path, "b2", "recipe: moe\nextends: moe\n")
    path = _write(tmp_path, "a", text)
    if "b2" in text:
        path = tmp_path / "b2.yaml"
    with pytest.raises(RecipeError) as err:
        load_recipe(path)
    assert needle in str(err.value), str(err.value)
    assert str(tmp_path) in str(err.value)      # names the recipe file


def test_a_null_key_removes_what_the_base_set():
    """attn_document drops the base's sched.seq and sched.batch binds (its scheduler
    has no such arguments: the documents come from its docs instance); attn_paged drops
    the base's backward kernel and its autograd section."""
    paged = load_recipe(ROOT / "recipes" / "attn_paged.yaml")
    assert list(paged.data["kernels"]) == ["forward"] and "autograd" not in paged.data
    recipe = load_recipe(ROOT / "recipes" / "attn_document.yaml")
    bind = recipe.data["kernels"]["forward"]["launch"]["bind"]
    assert "sched.seq" not in bind and "sched.batch" not in bind
    assert bind["docs.batch"] == "N - 1" and bind["load.tma_q"] == "q"


def test_a_component_written_over_a_per_arch_choice_replaces_it(tmp_path):
    """A base that picks an instance's component per arch, extended by a recipe that
    names one component: the extension's component on every arch (deep-merged, the
    base's per_arch would otherwise win), its params merged as before."""
    (tmp_path / "base.yaml").write_text(
        "recipe: base\narch: [sm_90a, sm_100a]\ninstances:\n"
        "  store: {per_arch: {sm_90a: a_store, sm_100a: b_store}, params: {tile_m: 128}}\n")
    (tmp_path / "ext.yaml").write_text(
        "recipe: ext\nextends: base\ninstances:\n"
        "  store: {component: c_store, params: {buffers: 1}}\n")
    recipe = load_recipe(tmp_path / "ext.yaml")
    for arch in ("sm_90a", "sm_100a"):
        store = recipe.instances(arch)["store"]
        assert store.component == "c_store"
        assert store.params == {"tile_m": 128, "buffers": 1}
    assert load_recipe(tmp_path / "base.yaml").instances("sm_100a")["store"].component == \
        "b_store"


# -- a kernel like another (kernels.<name>.like) -------------------------------------------

def test_a_kernel_like_another_is_written_over_it():
    """attn_cp_ring's forward_later is forward_earlier (itself attn_causal's forward with
    zigzag_mask) but for the mask's relation: every other instance, connection, bind and
    require is the forward's."""
    data = load_recipe(RECIPES / "attn_cp_ring.yaml").data["kernels"]
    forward, earlier, later = data["forward"], data["forward_earlier"], data["forward_later"]
    assert "like" not in later
    assert later["instances"]["mask"] == {"component": "zigzag_mask", "params": {"relation": 2}}
    assert earlier["instances"]["mask"]["params"] == {"relation": 1}
    assert {n: i for n, i in later["instances"].items() if n != "mask"} == \
        {n: i for n, i in forward["instances"].items() if n != "mask"}
    assert later["connect"] == forward["connect"]
    assert later["launch"]["bind"] == {**forward["launch"]["bind"], "mask.half": "S // 2"}
    assert "S % 2 == 0" in later["launch"]["require"]
    backward = data["backward_later"]
    assert backward["phases"] == data["backward"]["phases"]
    assert backward["instances"]["mask"]["params"] == {"relation": 2}


@pytest.mark.parametrize("kernels,words", [
    ({"a": {"like": "b", "instances": {}}}, ["kernel 'a' is like 'b', which is not a kernel",
                                              "kernels.a.like", "its kernels: a"]),
    ({"a": {"like": "b"}, "b": {"like": "a"}}, ["cycle: a -> b -> a", "kernels.b.like"]),
    ({"a": {"like": "a"}}, ["cycle: a -> a"]),
])
def test_bad_likes_are_refused_naming_the_kernel(tmp_path, kernels, words):
    import yaml
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"recipe": "r", "arch": ["sm_90a"], "kernels": kernels}))
    with pytest.raises(RecipeError) as err:
        load_recipe(path)
    text = str(err.value) + " " + (err.value.where or "") + " " + (err.value.hint or "")
    for word in words:
        assert word in text, text
