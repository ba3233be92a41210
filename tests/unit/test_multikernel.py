"""Multi-kernel recipes without a compiler: the recipe model (one view per kernel), the
autograd section's checks (one bad input per row), kernels.json, and the checker on
each kernel with keys that say which kernel."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from pipelink.check import check, check_autograd, check_dispatch
from pipelink.errors import CheckError, PipeLinkError, RecipeError
from pipelink.link import cubin_name, kernels_index
from pipelink.recipe import MAIN, load_recipe
from pipelink.sconsrun import arch_summary

from ..conftest import ROOT, Tree, toy_recipe
from .test_check_rules import launched
from .test_errors import Mutation, chain, drop, put

RECIPE = "recipes/r.yaml"


def _gemm_like(a: str, b: str, c: str, shapes: tuple[list, list, list]) -> dict[str, Any]:
    """A kernel whose launch takes tensors a, b and writes c (the checks read launches)."""
    return {"instances": {"load": "loader"},
            "launch": {"inputs": {a: {"dtype": "bf16", "shape": shapes[0]},
                                  b: {"dtype": "bf16", "shape": shapes[1]}},
                       "outputs": {c: {"dtype": "bf16", "shape": shapes[2]}}}}


_LINEAR: dict[str, Any] = {
    "recipe": "lin",
    "arch": ["sm_90a"],
    "kernels": {
        "forward": _gemm_like("x", "w", "y", (["M", "K"], ["N", "K"], ["M", "N"])),
        "dgrad": _gemm_like("dy", "wt", "dx", (["M", "N"], ["K", "N"], ["M", "K"])),
        "wgrad": _gemm_like("dyt", "xt", "dw", (["N", "M"], ["K", "M"], ["N", "K"])),
    },
    "autograd": {"forward": "forward",
                 "grads": {"w": {"kernel": "wgrad", "inputs": ["grad.y.T", "x.T"]},
                           "x": {"kernel": "dgrad", "inputs": ["grad.y", "w.T"]}}},
}


def linear() -> dict[str, Any]:
    return copy.deepcopy(_LINEAR)


def with_scratch() -> dict[str, Any]:
    """linear() whose forward also keeps 'keep' [M, K], which dgrad writes into (its
    scratch) and wgrad then reads: wgrad is listed first, dgrad must launch first."""
    data = linear()
    data["kernels"]["forward"]["launch"]["outputs"]["keep"] = {"dtype": "bf16",
                                                               "shape": ["M", "K"]}
    data["kernels"]["dgrad"]["launch"]["inputs"]["k"] = {"dtype": "bf16", "shape": ["M", "K"],
                                                         "writes": True}
    data["kernels"]["wgrad"]["launch"]["inputs"]["k"] = {"dtype": "bf16", "shape": ["M", "K"]}
    data["autograd"] = {"forward": "forward", "returns": ["y"], "scratch": ["keep"],
                        "grads": {"w": {"kernel": "wgrad", "inputs": ["grad.y.T", "x.T", "keep"]},
                                  "x": {"kernel": "dgrad", "inputs": ["grad.y", "w.T", "keep"]}}}
    return data


def two_toys() -> dict[str, Any]:
    """The launched toy kernel twice, as kernels 'a' and 'b' of one recipe."""
    kernel = {k: v for k, v in launched().items() if k in ("instances", "connect", "launch")}
    return {"recipe": "toy", "arch": ["sm_90a"],
            "kernels": {"a": kernel, "b": copy.deepcopy(kernel)}}


def _write(tree: Tree, data: dict[str, Any]) -> Any:
    tree.toy()
    return load_recipe(tree.recipe(data))


# -- the model -------------------------------------------------------------------------------

def test_a_single_kernel_recipe_is_its_own_main_kernel(tree):
    recipe = _write(tree, toy_recipe())
    assert not recipe.multi and recipe.kernels() == {MAIN: recipe}
    assert (recipe.name, recipe.recipe_name, recipe.folder) == ("toy", "toy", "")
    assert recipe.where("connect[0]").endswith(f"{RECIPE}: connect[0]")
    assert cubin_name(recipe) == "toy.cubin"


def test_each_kernel_is_a_recipe_of_its_own(tree):
    recipe = _write(tree, two_toys())
    kernels = recipe.kernels()
    assert list(kernels) == ["a", "b"]
    b = kernels["b"]
    assert (b.name, b.recipe_name, b.kernel, b.folder) == ("toy_b", "toy", "b", "b")
    assert [str(c.src) for c in b.connections] == ["load.tiles", "reduce.acc"]
    assert b.where("launch.bind").endswith(f"{RECIPE}: kernels.b.launch.bind")
    assert b.where("arch").endswith(f"{RECIPE}: arch")  # shared keys stay at the top
    assert list(b.instances("sm_90a")) == ["load", "reduce", "store"]
    assert cubin_name(b) == "toy_b.cubin"
    assert list(recipe.select(["b"])) == ["b"] and list(recipe.select(None)) == ["a", "b"]


def test_every_kernel_checks_and_errors_name_the_kernel(tree):
    data = two_toys()
    for kernel in _write(tree, data).kernels().values():
        kinds = [t.kind for t in check(kernel, "sm_90a", tree.bind(kernel, "sm_90a")).transfers]
        assert kinds == ["zero_copy", "registers"]
    data["kernels"]["b"]["launch"]["bind"]["load.k_tiles"] = "Kk // 64"
    b = load_recipe(tree.recipe(data)).kernels()["b"]
    with pytest.raises(CheckError, match=r"kernels\.b\.launch\.bind\.load\.k_tiles: 'Kk // 64'"):
        check(b, "sm_90a", tree.bind(b, "sm_90a"))


def test_the_whole_recipe_is_not_one_kernel(tree):
    recipe = _write(tree, two_toys())
    with pytest.raises(RecipeError, match="defines several kernels; pick one"):
        recipe.instances("sm_90a")
    with pytest.raises(RecipeError, match="has no kernel 'c'.*\n.*its kernels: a, b"):
        recipe.select(["c"])


def test_the_linear_recipe_has_three_kernels_and_their_gradients():
    recipe = load_recipe(ROOT / "recipes" / "linear.yaml")
    assert list(recipe.kernels()) == ["forward", "dgrad", "wgrad"]
    assert check_autograd(recipe) == {
        "forward": "forward",
        "grads": {"x": {"kernel": "dgrad", "inputs": ["grad.y", "w"], "output": "dx"},
                  "w": {"kernel": "wgrad", "inputs": ["grad.y", "x"], "output": "dw"}}}
    # The kernels share the scheduler and epilogue; dgrad's and wgrad's loader and
    # mainloop read operands MN-major.
    instances = [k.data["instances"] for k in recipe.kernels().values()]
    for name in ("sched", "store"):
        assert instances[0][name] == instances[1][name] == instances[2][name]
    majors = [(i["load"]["params"].get("a_major", "k"), i["load"]["params"].get("b_major", "k"))
              for i in instances]
    assert majors == [("k", "k"), ("k", "mn"), ("mn", "mn")]


# -- kernels.json ----------------------------------------------------------------------------

def test_kernels_json_indexes_the_kernels_with_the_checked_autograd(tree):
    recipe = _write(tree, linear())
    text = kernels_index(recipe, "sm_90a")
    assert text == kernels_index(load_recipe(tree.recipe(linear())), "sm_90a")
    doc = json.loads(text)
    assert doc == {"format": 1, "recipe": "lin", "arch": "sm_90a",
                   "kernels": {"forward": "forward", "dgrad": "dgrad", "wgrad": "wgrad"},
                   "autograd": {"forward": "forward", "grads": {
                       "x": {"kernel": "dgrad", "inputs": ["grad.y", "w.T"], "output": "dx"},
                       "w": {"kernel": "wgrad", "inputs": ["grad.y.T", "x.T"],
                             "output": "dw"}}}}
    assert text == json.dumps(doc, sort_keys=True, indent=1) + "\n"


def test_scratch_orders_the_launches_writer_first(tree):
    doc = json.loads(kernels_index(_write(tree, with_scratch()), "sm_90a"))
    assert doc["autograd"]["scratch"] == ["keep"]
    assert doc["autograd"]["launches"] == [
        {"kernel": "dgrad", "inputs": ["grad.y", "w.T", "keep"]},
        {"kernel": "wgrad", "inputs": ["grad.y.T", "x.T", "keep"]}]


def two_archs() -> dict[str, Any]:
    """linear() for sm_90a and sm_100a, its gradient kernels for sm_90a only."""
    data = linear()
    data["arch"] = ["sm_90a", "sm_100a"]
    for name in ("dgrad", "wgrad"):
        data["kernels"][name]["arch"] = ["sm_90a"]
    return data


def test_a_kernel_may_build_for_some_of_the_archs(tree):
    recipe = _write(tree, two_archs())
    assert recipe.kernels()["dgrad"].archs == ("sm_90a",)
    assert recipe.kernels()["forward"].archs == ("sm_90a", "sm_100a")
    assert list(recipe.select(None, "sm_100a")) == ["forward"]
    assert list(recipe.select(None, "sm_90a")) == ["forward", "dgrad", "wgrad"]
    assert recipe.elsewhere("sm_100a") == {"dgrad": ("sm_90a",), "wgrad": ("sm_90a",)}
    with pytest.raises(RecipeError, match=r"kernels\.dgrad\.arch.*\n.*builds for sm_90a"):
        recipe.select(["dgrad"], "sm_100a")
    with pytest.raises(RecipeError, match=r"does not target sm_120a"):
        recipe.select(None, "sm_120a")
    # kernels.json says which kernels were built elsewhere (only where some were).
    blackwell = json.loads(kernels_index(recipe, "sm_100a"))
    assert blackwell["kernels"] == {"forward": "forward"}
    assert blackwell["elsewhere"] == {"dgrad": ["sm_90a"], "wgrad": ["sm_90a"]}
    assert "elsewhere" not in json.loads(kernels_index(recipe, "sm_90a"))
    # scons -h lists the narrowed kernels beside the recipe's archs.
    assert arch_summary(tree.recipe(two_archs())) == \
        "sm_90a, sm_100a (dgrad: sm_90a; wgrad: sm_90a)"
    assert arch_summary(tree.recipe(linear())) == "sm_90a"


def test_a_multi_kernel_recipe_without_autograd_indexes_null(tree):
    doc = json.loads(kernels_index(_write(tree, two_toys()), "sm_90a"))
    assert doc["autograd"] is None and doc["kernels"] == {"a": "a", "b": "b"}


# -- bad input, one per row --------------------------------------------------------------------

def grad(x: str, key: str, value: Any) -> Mutation:
    return put(f"autograd.grads.{x}.{key}", value)


@dataclass(frozen=True)
class Case:
    id: str
    error: type[PipeLinkError]
    must: tuple[str, ...]
    recipe: Mutation
    base: Any = linear
    check: Any = check_autograd      # the section's checker


CASES = [
    # The recipe's shape.
    Case("kernels_and_top_level_instances", RecipeError,
         (f"{RECIPE}: instances", "defines kernels: and also top-level instances",
          "move instances under one kernel"),
         put("instances", {"load": "loader"})),
    Case("kernels_and_top_level_launch", RecipeError,
         (f"{RECIPE}: launch", "top-level launch"), put("launch", {"persistent": True})),
    Case("kernel_name_not_an_identifier", RecipeError,
         (RECIPE, "key 'kernels'", "'Forward'"),
         chain(put("kernels.Forward", {"instances": {"load": "loader"}}))),
    Case("no_kernels_at_all", RecipeError, (RECIPE, "key 'kernels'"), put("kernels", {})),
    Case("kernel_without_instances", RecipeError,
         (RECIPE, "key 'kernels.dgrad.instances': missing"), drop("kernels.dgrad.instances")),
    Case("neither_instances_nor_kernels", RecipeError,
         (RECIPE, "key 'instances': missing", "or define kernels:"),
         chain(drop("kernels"), drop("autograd"))),
    Case("autograd_without_kernels", RecipeError,
         (f"{RECIPE}: autograd", "autograd: needs kernels:"),
         lambda d: {**toy_recipe(), "autograd": d["autograd"]}),
    Case("connection_names_an_instance_of_another_kernel", RecipeError,
         (f"{RECIPE}: kernels.dgrad.connect[0]", "instance 'mma'", "instances: load"),
         put("kernels.dgrad.connect", ["load.tiles -> mma.a"])),
    Case("launch_tensor_without_shape", RecipeError,
         (RECIPE, "kernels.forward.launch.inputs.x.shape", "missing"),
         drop("kernels.forward.launch.inputs.x.shape")),
    Case("grad_input_malformed", RecipeError,
         (RECIPE, "key 'autograd.grads.x.inputs[1]'", "'w.T.T'"), grad("x", "inputs",
                                                                   ["grad.y", "w.T.T"])),
    # No gradient at all: every input's would silently be None.
    Case("autograd_without_grads", RecipeError,
         (RECIPE, "key 'autograd.grads'", "should be non-empty"), put("autograd.grads", {})),
    # The autograd section against the kernels' launches.
    Case("forward_kernel_unknown", CheckError,
         (f"{RECIPE}: autograd.forward", "names kernel 'fwd'",
          "kernels: forward, dgrad, wgrad"), put("autograd.forward", "fwd")),
    Case("grad_of_a_non_input", CheckError,
         (f"{RECIPE}: autograd.grads.b", "'b' is not an input of kernel 'forward'",
          "its inputs: x, w"), put("autograd.grads.b", {"kernel": "dgrad",
                                                        "inputs": ["grad.y", "w.T"]})),
    Case("grad_kernel_unknown", CheckError,
         (f"{RECIPE}: autograd.grads.x.kernel", "names kernel 'xgrad'"),
         grad("x", "kernel", "xgrad")),
    Case("grad_of_an_input", CheckError,
         (f"{RECIPE}: autograd.grads.x.inputs[0]", "'grad.x' is the gradient of 'x', which "
          "is not an output of kernel 'forward'", "outputs: y"),
         grad("x", "inputs", ["grad.x", "w.T"])),
    Case("reference_to_an_unknown_tensor", CheckError,
         (f"{RECIPE}: autograd.grads.x.inputs[1]", "'v.T' names no input or output",
          "x, w, y"), grad("x", "inputs", ["grad.y", "v.T"])),
    Case("transpose_of_a_vector", CheckError,
         (f"{RECIPE}: autograd.grads.x.inputs[1]", "'w.T' transposes 'w', which has 1 "
          "dimensions", "'.T' takes a 2-D tensor"),
         put("kernels.forward.launch.inputs.w.shape", ["N"])),
    Case("too_few_inputs", CheckError,
         (f"{RECIPE}: autograd.grads.x.inputs", "lists 1 inputs, kernel 'dgrad' takes 2 "
          "(dy, wt)"), grad("x", "inputs", ["grad.y"])),
    Case("grad_kernel_with_two_outputs", CheckError,
         (f"{RECIPE}: autograd.grads.x.kernel", "gradient kernel 'dgrad' has 2 outputs",
          "say which is the gradient of 'x'", "add output: <one of dx, extra>"),
         put("kernels.dgrad.launch.outputs.extra", {"dtype": "f32", "shape": ["M"]})),
    Case("grad_output_unknown", CheckError,
         (f"{RECIPE}: autograd.grads.x.output", "kernel 'dgrad' has no output 'dz'",
          "its outputs: dx"), grad("x", "output", "dz")),
    Case("returns_unknown", CheckError,
         (f"{RECIPE}: autograd.returns", "'z' is not an output of kernel 'forward'"),
         put("autograd.returns", ["z"])),
    Case("grad_kernel_without_outputs", CheckError,
         (f"{RECIPE}: autograd.grads.w.kernel", "gradient kernel 'wgrad' has 0 outputs"),
         drop("kernels.wgrad.launch.outputs")),
    Case("grad_dtype_differs_from_the_input", CheckError,
         (f"{RECIPE}: autograd.grads.x.kernel", "the gradient of 'x' is bf16 with 2 "
          "dimensions, output 'dx' of kernel 'dgrad' is f32 with 2 dimensions"),
         put("kernels.dgrad.launch.outputs.dx.dtype", "f32")),
    Case("grad_input_rank_differs", CheckError,
         (f"{RECIPE}: autograd.grads.x.inputs[0]", "'grad.y' is bf16 with 2 dimensions, "
          "input 'dy' of kernel 'dgrad' is bf16 with 3 dimensions"),
         put("kernels.dgrad.launch.inputs.dy.shape", ["M", "N", "P"])),
    # Scratch: what a gradient kernel may write into.
    Case("scratch_that_the_call_returns", CheckError,
         (f"{RECIPE}: autograd.scratch", "'y' is not a kept output of kernel 'forward'",
          "kept outputs: none"), put("autograd.scratch", ["y"])),
    Case("written_input_that_is_not_scratch", CheckError,
         (f"{RECIPE}: autograd.grads.x.inputs[1]", "kernel 'dgrad' writes into its input "
          "'wt', and 'w.T' is not scratch", "autograd.scratch"),
         put("kernels.dgrad.launch.inputs.wt.writes", True)),
    Case("scratch_written_by_two_launches", CheckError,
         (f"{RECIPE}: autograd.scratch", "'keep' is written by two gradient launches"),
         put("kernels.wgrad.launch.inputs.k.writes", True), with_scratch),
    Case("scratch_writes_read_in_a_cycle", CheckError,
         (f"{RECIPE}: autograd.scratch", "in a cycle"),
         chain(put("kernels.forward.launch.outputs.keep2", {"dtype": "bf16", "shape": ["M"]}),
               put("autograd.scratch", ["keep", "keep2"]),
               put("kernels.dgrad.launch.inputs.k2", {"dtype": "bf16", "shape": ["M"]}),
               put("kernels.wgrad.launch.inputs.k2", {"dtype": "bf16", "shape": ["M"],
                                                      "writes": True}),
               grad("x", "inputs", ["grad.y", "w.T", "keep", "keep2"]),
               grad("w", "inputs", ["grad.y.T", "x.T", "keep", "keep2"])), with_scratch),
]





# -- dispatch: one op over kernels of one signature ---------------------------------------------

_DISPATCHED: dict[str, Any] = {
    "recipe": "mm",
    "arch": ["sm_90a"],
    "kernels": {"short": _gemm_like("a", "b", "c", (["M", "K"], ["N", "K"], ["M", "N"])),
                "tall": _gemm_like("a", "b", "c", (["M", "K"], ["N", "K"], ["M", "N"]))},
    "dispatch": [{"kernel": "short", "when": "M <= 512"}, {"kernel": "tall"}],
}


def dispatched() -> dict[str, Any]:
    return copy.deepcopy(_DISPATCHED)


def test_kernels_json_carries_the_dispatch_with_conditions_as_lists(tree):
    data = dispatched()
    data["kernels"]["tiny"] = copy.deepcopy(data["kernels"]["tall"])
    data["dispatch"].insert(0, {"kernel": "tiny", "when": ["M <= 64", "N % 8 == 0"]})
    doc = json.loads(kernels_index(_write(tree, data), "sm_90a"))
    assert doc["dispatch"] == [{"kernel": "tiny", "when": ["M <= 64", "N % 8 == 0"]},
                               {"kernel": "short", "when": ["M <= 512"]},
                               {"kernel": "tall"}]
    assert "dispatch" not in json.loads(kernels_index(_write(tree, linear()), "sm_90a"))


def test_kernels_json_drops_the_entries_of_kernels_not_built_for_its_arch(tree):
    """A kernel with conditions may be built for some archs only (a tile width one arch's
    MMA has): each arch's kernels.json lists the entries a call there can take."""
    data = dispatched()
    data["arch"] = ["sm_90a", "sm_100a"]
    data["kernels"]["short"]["arch"] = ["sm_90a"]
    path = _write(tree, data)
    assert [e["kernel"] for e in json.loads(kernels_index(path, "sm_90a"))["dispatch"]] == \
        ["short", "tall"]
    doc = json.loads(kernels_index(path, "sm_100a"))
    assert doc["dispatch"] == [{"kernel": "tall"}] and doc["elsewhere"] == {"short": ["sm_90a"]}


def entry(i: int, key: str, value: Any) -> Mutation:
    return put(f"dispatch.{i}.{key}", value)


DISPATCH_CASES = [
    Case("dispatch_without_kernels", RecipeError,
         (f"{RECIPE}: dispatch", "dispatch: needs kernels:"),
         lambda d: {**toy_recipe(), "dispatch": d["dispatch"]}, dispatched, check_dispatch),
    Case("dispatch_of_one_kernel", RecipeError, (RECIPE, "key 'dispatch'"),
         put("dispatch", [{"kernel": "tall"}]), dispatched, check_dispatch),
    Case("dispatch_kernel_unknown", CheckError,
         (f"{RECIPE}: dispatch[0].kernel", "names kernel 'small'", "kernels: short, tall"),
         put("dispatch.0", {"kernel": "small", "when": "M <= 512"}), dispatched, check_dispatch),
    Case("dispatch_kernel_twice", CheckError,
         (f"{RECIPE}: dispatch[1].kernel", "kernel 'short' is listed twice"),
         put("dispatch.1", {"kernel": "short"}), dispatched, check_dispatch),
    Case("dispatch_last_entry_has_conditions", CheckError,
         (f"{RECIPE}: dispatch[1].when", "a call none of the entries takes would have no "
          "kernel", "drop when: from the last entry ('tall')"),
         put("dispatch.1", {"kernel": "tall", "when": "M > 512"}), dispatched, check_dispatch),
    Case("dispatch_entry_before_the_last_without_conditions", CheckError,
         (f"{RECIPE}: dispatch[0]", "entry 'short' has no when: and is not last"),
         put("dispatch.0", {"kernel": "short"}), dispatched, check_dispatch),
    Case("dispatch_inputs_differ", CheckError,
         (f"{RECIPE}: dispatch[1].kernel", "input 'b' is bf16 ['K', 'N'] in kernel 'tall', "
          "bf16 ['N', 'K'] in kernel 'short'", "make kernels.tall.launch.inputs.b the same"),
         put("kernels.tall.launch.inputs.b.shape", ["K", "N"]), dispatched, check_dispatch),
    Case("dispatch_outputs_differ", CheckError,
         (f"{RECIPE}: dispatch[1].kernel", "kernel 'tall' has launch outputs d; kernel "
          "'short' has c"),
         chain(drop("kernels.tall.launch.outputs.c"),
               put("kernels.tall.launch.outputs.d", {"dtype": "bf16", "shape": ["M", "N"]})),
         dispatched, check_dispatch),
    Case("dispatch_condition_names_an_unknown_size", CheckError,
         (f"{RECIPE}: dispatch[0].when[0]", "'T' names size T, which no input's shape "
          "binds", "sizes here: K, M, N (from launch.inputs shapes"),
         entry(0, "when", "T <= 512"), dispatched, check_dispatch),
    Case("dispatch_condition_unreadable", CheckError,
         (f"{RECIPE}: dispatch[0].when[1]", "cannot read condition 'M'",
          "write one comparison"), entry(0, "when", ["N >= 8", "M"]), dispatched, check_dispatch),
    Case("kernel_arch_outside_the_recipe", RecipeError,
         (f"{RECIPE}: kernels.dgrad.arch", "kernel 'dgrad' builds for sm_100a, which the "
          "recipe does not target", "some of the recipe's: sm_90a"),
         put("kernels.dgrad.arch", ["sm_100a"])),
    Case("forward_narrower_than_the_recipe", CheckError,
         (f"{RECIPE}: autograd.forward", "kernel 'forward' is not built for sm_100a",
          "kernels.forward.arch"),
         chain(put("arch", ["sm_90a", "sm_100a"]), put("kernels.forward.arch", ["sm_90a"]))),
    # An entry with conditions may be narrower (skipped elsewhere); the fallback may not.
    Case("dispatch_fallback_narrower_than_the_recipe", CheckError,
         (f"{RECIPE}: dispatch[1].kernel", "kernel 'small' is not built for sm_100a"),
         lambda d: chain(put("arch", ["sm_90a", "sm_100a"]), put("kernels.small.arch", ["sm_90a"]),
                         put("dispatch", [{"kernel": "forward", "when": "M <= 64"},
                                          {"kernel": "small"}]))(with_small_forward(d)),
         check=check_dispatch),
    Case("autograd_forward_not_dispatched", CheckError,
         (f"{RECIPE}: autograd.forward", "kernel 'forward' is not one dispatch: lists",
          "list the forward kernel under dispatch:"),
         lambda d: {**with_small_forward(d), "dispatch": [
             {"kernel": "small", "when": "M <= 64"}, {"kernel": "dgrad"}]},
         check=check_dispatch),
]


def with_small_forward(data: dict[str, Any]) -> dict[str, Any]:
    """linear() with a second forward kernel, 'small', of the forward's signature."""
    data["kernels"]["small"] = copy.deepcopy(data["kernels"]["forward"])
    return data


def test_a_dispatched_forward_takes_the_gradients(tree):
    """dispatch: beside autograd: the forward is one of the dispatched kernels."""
    data = with_small_forward(linear())
    data["dispatch"] = [{"kernel": "small", "when": "M <= 64"}, {"kernel": "forward"}]
    doc = json.loads(kernels_index(_write(tree, data), "sm_90a"))
    assert doc["dispatch"] == [{"kernel": "small", "when": ["M <= 64"]}, {"kernel": "forward"}]
    assert doc["autograd"]["forward"] == "forward"


@pytest.mark.parametrize("case", CASES + DISPATCH_CASES, ids=lambda c: c.id)
def test_bad_multi_kernel_input_is_refused(tree, case):
    tree.toy()
    path = tree.recipe(case.recipe(case.base()))
    with pytest.raises(PipeLinkError) as info:
        case.check(load_recipe(path))
    assert type(info.value) is case.error, str(info.value)
    for part in case.must:
        assert part in str(info.value), f"{part!r} missing from:\n{info.value}"


def test_the_table_rows_differ():
    cases = CASES + DISPATCH_CASES
    assert len({c.id for c in cases}) == len(cases) >= 30
    for case in cases:  # no row mutates the shared bases
        case.recipe(case.base())
    assert yaml.safe_dump(linear()) == yaml.safe_dump(_LINEAR)
    assert yaml.safe_dump(dispatched()) == yaml.safe_dump(_DISPATCHED)
