"""Recipe ``constants:``: ``$name`` in a recipe's values reads one place, and a recipe
that ``extends:`` another changes it there. recipes/attn_causal_d64.yaml sets head_dim
64 for every instance and check of attn_causal; a bad constant or an unknown
reference is refused naming the file and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelink.contract import load_contract
from pipelink.errors import RecipeError
from pipelink.recipe import ComponentIndex, load_recipe, resolve_components
from pipelink.sconsrun import plans

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "recipes"
INDEX = ComponentIndex((ROOT / "components",))
HEAD_DIM_INSTANCES = {"forward": ("load", "core", "store"),
                      "backward": ("prep", "load", "core", "dk_store", "dv_store")}


# O's staging tiles (forward) and dK's and dV's (backward: one each at every head dim,
# which leaves attn_bwd_core room for dQ's staging).
@pytest.mark.parametrize(("name", "head_dim", "buffers"),
                         [("attn_causal", 128, {"forward": 2, "backward": 1}),
                          ("attn_causal_d64", 64, {"forward": 1, "backward": 1}),
                          ("attn_causal_d64_deterministic", 64, {"forward": 1, "backward": 1}),
                          ("attn_dense_d64", 64, {"forward": 1, "backward": 1})])
def test_one_constant_sets_every_instance_and_check(name, head_dim, buffers):
    kernels = load_recipe(RECIPES / f"{name}.yaml").kernels()
    for kernel, names in HEAD_DIM_INSTANCES.items():
        recipe = kernels[kernel]
        instances = recipe.instances("sm_90a")
        for inst in names:
            assert instances[inst].params["head_dim"] == head_dim, (kernel, inst)
        stores = [i for i in instances.values() if i.component == "attn_store_epilogue"]
        assert stores and all(i.params["buffers"] == buffers[kernel] for i in stores)
        assert f"D == {head_dim}" in recipe.launch["require"]


# recipe -> the instances of its forward, beyond the head-dim ones, that build objects
# of their own on sm_90a: a 192-row query tile gives the scheduler its own.
OWN_FORWARD_SM90 = {"attn_causal_d64": ("sched",)}


@pytest.mark.parametrize("name", sorted(OWN_FORWARD_SM90))
def test_head_dim_64_shares_no_object_with_128_but_the_head_dim_free_ones(name):
    """The _d64 recipes compile their own loader, core and stores; the mask is head-dim
    free and stays the very object attn_causal builds, and so is the scheduler where
    the query tile is the same: the backward's, on sm_100a the forward's, and on sm_90a
    the forward's but at q_tile 192."""
    for arch, own in (("sm_90a", {"forward": OWN_FORWARD_SM90[name], "backward": ()}),
                      ("sm_100a", {"forward": (), "backward": ()})):
        base = {p.recipe.kernel: p for p in plans(RECIPES / "attn_causal.yaml", arch, INDEX)}
        d64 = {p.recipe.kernel: p for p in plans(RECIPES / f"{name}.yaml", arch, INDEX)}
        for kernel, plan in d64.items():
            for inst, obj in plan.objects.items():
                same = obj.files == base[kernel].objects[inst].files and \
                    obj.embedded() == base[kernel].objects[inst].embedded()
                differs = inst in HEAD_DIM_INSTANCES[kernel] or inst in own[kernel]
                assert same != differs, (arch, kernel, inst)


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(text)
    return path


BASE = """recipe: base
description: costs $5, a dollar sign in free text stays
arch: [sm_90a]
constants: {width: 64, kind: bf16}
instances:
  a: {component: row_store, params: {tile: $width, dtype: $kind}}
launch:
  require: ["N % $width == 0"]
"""


def test_a_reference_takes_the_constants_type_and_text(tmp_path):
    recipe = load_recipe(_write(tmp_path, "base", BASE))
    assert recipe.data["instances"]["a"]["params"] == {"tile": 64, "dtype": "bf16"}
    assert recipe.data["launch"]["require"] == ["N % 64 == 0"]
    assert recipe.data["description"] == "costs $5, a dollar sign in free text stays"
    _write(tmp_path, "wide", "recipe: wide\nextends: base\nconstants: {width: 128}\n")
    wide = load_recipe(tmp_path / "wide.yaml")
    assert wide.data["instances"]["a"]["params"] == {"tile": 128, "dtype": "bf16"}
    assert wide.data["launch"]["require"] == ["N % 128 == 0"]


@pytest.mark.parametrize(("constants", "needle", "key"), [
    ("{width: 64}", "$kind names no constant of this recipe", "instances.a.params.dtype"),
    ("{width: 64, kind: bf16, x: [1]}", "constant 'x': [1] is not a name", "constants.x"),
    ("{width: 64, kind: 'two words'}", "constant 'kind'", "constants.kind"),
    ("{width: true, kind: bf16}", "constant 'width': True", "constants.width"),
    ("[64]", "constants: is a mapping", "constants"),
])
def test_bad_constants_are_refused_naming_the_key(tmp_path, constants, needle, key):
    path = _write(tmp_path, "base", BASE.replace("{width: 64, kind: bf16}", constants))
    with pytest.raises(RecipeError) as e:
        load_recipe(path)
    assert needle in str(e.value) and f"{path}: {key}" in str(e.value), str(e.value)


@pytest.mark.parametrize(("name", "text", "needle"), [
    # a variant's misspelt constant would leave the base's width in place
    ("wide", "recipe: wide\nextends: base\nconstants: {widht: 128}\n",
     "did you mean 'width'?"),
    ("base", BASE.replace("{width: 64, kind: bf16}", "{width: 64, kind: bf16, depth: 2}"),
     "constants read: kind, width"),
])
def test_a_constant_set_but_read_nowhere_is_refused(tmp_path, name, text, needle):
    _write(tmp_path, "base", BASE)
    path = _write(tmp_path, name, text)
    with pytest.raises(RecipeError, match="is set here but read nowhere") as e:
        load_recipe(path)
    assert needle in str(e.value) and f"{path}: constants." in str(e.value), str(e.value)


def test_a_constant_only_the_base_reads_in_a_kernel_the_variant_drops_is_allowed(tmp_path):
    """attn_paged drops attn_causal's backward, and with it the one reader of
    grad_store_buffers: the constant is the base's, not set by the variant."""
    _write(tmp_path, "base", BASE.replace("constants: {width: 64, kind: bf16}",
                                          "constants: {width: 64, kind: bf16, depth: 2}")
           .replace("require: [", "require: [\"N > $depth\", "))
    _write(tmp_path, "lean", "recipe: lean\nextends: base\nconstants: {width: 32}\n"
                             "launch: {require: ['N % $width == 0']}\n")
    assert load_recipe(tmp_path / "lean.yaml").data["launch"]["require"] == ["N % 32 == 0"]


PER_ARCH = """recipe: base
arch: [sm_90a, sm_100a]
instances:
  a: {component: row_store, params: {tile: {sm_90a: 192, sm_100a: 128}, dtype: bf16}}
"""


def test_a_param_takes_its_value_per_arch(tmp_path):
    """``{arch: value}`` for a param: each arch's instance gets its own value; a recipe
    that extends the base writes over one arch's and keeps the other's."""
    recipe = load_recipe(_write(tmp_path, "base", PER_ARCH))
    assert recipe.instances("sm_90a")["a"].params == {"tile": 192, "dtype": "bf16"}
    assert recipe.instances("sm_100a")["a"].params == {"tile": 128, "dtype": "bf16"}
    _write(tmp_path, "ext", "recipe: ext\nextends: base\n"
                            "instances:\n  a: {params: {tile: {sm_90a: 64}}}\n")
    ext = load_recipe(tmp_path / "ext.yaml")
    assert [ext.instances(a)["a"].params["tile"] for a in ("sm_90a", "sm_100a")] == [64, 128]


def test_a_per_arch_param_without_the_arch_built_is_refused_naming_it(tmp_path):
    """The arch's component takes the param, so a value for it was forgotten."""
    path = _write(tmp_path, "base", PER_ARCH.replace("tile: {sm_90a: 192, sm_100a: 128}",
                                                     "rows: {sm_90a: 192}"))
    recipe = load_recipe(path)
    assert resolve_components(recipe, "sm_90a", INDEX)["a"][0].params["rows"] == 192
    with pytest.raises(RecipeError) as e:
        resolve_components(recipe, "sm_100a", INDEX)
    text = str(e.value)
    assert "param 'rows' of instance 'a' has no value for sm_100a" in text, text
    assert "row_store takes it" in text, text
    assert f"{path}: instances.a.params.rows" in text and "add sm_100a:" in text, text


# A per_arch instance whose components take different params: tmem_swiglu_epilogue's
# acc_stages (its TMEM accumulator stages) is no param of swiglu_epilogue.
PER_ARCH_COMPONENTS = """recipe: base
arch: [sm_90a, sm_100a]
instances:
  a: {per_arch: {sm_90a: swiglu_epilogue, sm_100a: tmem_swiglu_epilogue},
      params: {tile_m: 128, acc_stages: {sm_100a: 1}}}
"""


def test_a_per_arch_param_goes_only_to_the_components_that_take_it(tmp_path):
    recipe = load_recipe(_write(tmp_path, "base", PER_ARCH_COMPONENTS))
    hopper = resolve_components(recipe, "sm_90a", INDEX)["a"][0]
    blackwell = resolve_components(recipe, "sm_100a", INDEX)["a"][0]
    assert (hopper.component, hopper.params) == ("swiglu_epilogue", {"tile_m": 128})
    assert blackwell.params == {"tile_m": 128, "acc_stages": 1}
    # Both bind: the Hopper object is built without the Blackwell component's knob.
    for arch in ("sm_90a", "sm_100a"):
        spec, path = resolve_components(recipe, arch, INDEX)["a"]
        assert load_contract(path).bind(spec.params).params["tile_m"] == 128


def test_a_per_arch_param_naming_an_unknown_arch_is_refused(tmp_path):
    path = _write(tmp_path, "base", PER_ARCH.replace("sm_100a: 128}", "sm_100: 128}"))
    with pytest.raises(RecipeError) as e:
        load_recipe(path)
    text = str(e.value)
    assert "gives a value for 'sm_100', which is not an arch" in text, text
    assert f"{path}: instances.a.params.tile" in text and "sm_100a" in text, text
