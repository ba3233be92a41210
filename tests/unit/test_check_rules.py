"""Checker rules that used to fire late (in glue, at launch, or never), one bad input
per row: a ring nobody consumes, arrival counts, a register port read twice, a launch
that names an unknown size or leaves an argument unbound, a global hand-off cycle.

Each row starts from the toy tree of ``tests/conftest.py`` (``loader -> reducer ->
store``) with a launch section that binds every argument, breaks one thing, and runs
the checker; nothing is placed or compiled. The message must name the recipe file,
the key, the instance or port, and what to change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from pipelink.check import check
from pipelink.contract import load_contract
from pipelink.errors import CheckError
from pipelink.recipe import load_recipe

from ..conftest import ROOT, Tree, consumer, epilogue, producer, toy_recipe
from .test_errors import Mutation, add, chain, put

RECIPE = "recipes/r.yaml"

# A stage that reads a global slot and publishes another: two of them make a cycle.
RELAY: dict[str, Any] = {
    "component": "relay",
    "arch": ["sm_90a", "sm_100a"],
    "roles": {"work": {"warps": 1, "registers": 32}},
    "ports": {"inp": {"dir": "in", "kind": "global", "dtype": "f32", "shape": [128],
                      "readers": 1},
              "out": {"dir": "out", "kind": "global", "dtype": "f32", "shape": [128],
                      "slots": 4}},
}
# Publishes only: where a chain of relays may start.
SOURCE: dict[str, Any] = {
    "component": "source",
    "arch": ["sm_90a", "sm_100a"],
    "roles": {"work": {"warps": 1, "registers": 32}},
    "ports": {"out": {"dir": "out", "kind": "global", "dtype": "f32", "shape": [128],
                      "slots": 4}},
}


def launched() -> dict[str, Any]:
    """The toy recipe with a launch that binds every argument of every instance."""
    recipe = toy_recipe()
    recipe["launch"] = {
        "inputs": {"x": {"dtype": "bf16", "shape": ["M", "K"]}},
        "outputs": {"sums": {"dtype": "f32", "shape": ["M"]}},
        "grid": ["M // 128"],
        "bind": {"load.src": "x", "load.k_tiles": "K // 64", "reduce.k_tiles": "K // 64",
                 "store.out": "sums"},
    }
    return recipe


def bind(key: str, value: str | int) -> Mutation:
    """Sets ``launch.bind[key]`` (bind keys hold a dot, which ``put`` would walk)."""
    def mutate(data: Any) -> Any:
        data["launch"]["bind"][key] = value
        return data
    return mutate


def unbind(key: str) -> Mutation:
    def mutate(data: Any) -> Any:
        del data["launch"]["bind"][key]
        return data
    return mutate


def relays(*connect: str) -> Mutation:
    """Replaces the recipe by relays a, b, c and a source s, wired by ``connect``."""
    def mutate(data: Any) -> Any:
        return {"recipe": "toy", "arch": ["sm_90a"],
                "instances": {"s": "source", "a": "relay", "b": "relay", "c": "relay"},
                "connect": list(connect)}
    return mutate


@dataclass(frozen=True)
class Case:
    id: str
    must: tuple[str, ...]                  # substrings the message must hold
    recipe: Mutation | None = None
    loader: Mutation | None = None
    reducer: Mutation | None = None


CASES = [
    # A ring nobody consumes: its producer waits forever for an empty stage.
    Case("ring_without_consumer",
         (f"{RECIPE}: instances.load2", "output ring 'load2.tiles' (loader) has no consumer",
          "add 'load2.tiles -> consumer.port' under connect:"),
         recipe=chain(put("instances.load2", "loader"), bind("load2.src", "x"),
                      bind("load2.k_tiles", "K // 64"))),
    Case("ring_only_consumer_connection_removed",
         (f"{RECIPE}: instances.load", "output ring 'load.tiles' (loader) has no consumer"),
         recipe=put("connect", ["reduce.acc -> store.acc"])),
    # Arrival counts, before anything is placed.
    Case("arrivals_do_not_add_up",
         (f"{RECIPE}: connect[0]", "'load.tiles' (loader) expects 64 arrivals per stage",
          "its consumers make 128 (reduce.x 128)", "consumer_arrivals"),
         loader=put("ports.tiles.consumer_arrivals", 64)),
    Case("consumer_arrives_more_than_its_threads",
         (f"{RECIPE}: instances.reduce", "port 'reduce.x' (reducer) makes 256 arrivals",
          "empty barrier", "role 'reduce' runs 128 threads (4 warps)",
          "ports.x.arrivals at most 128"),
         reducer=put("ports.x.arrivals", 256)),
    Case("producer_arrives_more_than_its_threads",
         (f"{RECIPE}: instances.load", "port 'load.tiles' (loader) makes 64 arrivals",
          "full barrier", "runs 32 threads (1 warps)"),
         loader=put("ports.tiles.arrivals", 64)),
    Case("mbarrier_states_other_arrivals_than_its_port",
         (f"{RECIPE}: instances.load", "arrives 1 time(s) per stage on mbarrier 'full'",
          "states arrivals: 2", "mbarriers.full.arrivals and ports.tiles.arrivals agree"),
         loader=put("mbarriers.full", {"count": "stages", "arrivals": 2})),
    # One register fragment, two readers: glue used to fail on a redeclared array.
    Case("register_port_fanned_out",
         (f"{RECIPE}: connect[2]", "register port 'reduce.acc' (reducer) feeds 'store.acc' "
          "(connect[1]) and 'store2.acc' (connect[2])", "keep one of the two connections"),
         recipe=chain(put("instances.store2", "store"), add("connect", "reduce.acc -> store2.acc"),
                      bind("store2.out", "sums"))),
    # The launch, as kernel.json will carry it to the runtime.
    Case("bind_names_unknown_size",
         (f"{RECIPE}: launch.bind.load.k_tiles", "'Kk // 64' names size Kk",
          "which no input's shape binds", "sizes here: K, M", "num_sms, l2_bytes"),
         recipe=bind("load.k_tiles", "Kk // 64")),
    Case("scalar_shadows_an_input_dimension",
         (f"{RECIPE}: launch.scalars.K", "scalar 'K' has the name of an input dimension",
          "rename the scalar"),
         recipe=put("launch.scalars", {"K": 64})),
    Case("scalar_shadows_a_tensor",
         (f"{RECIPE}: launch.scalars.sums", "scalar 'sums' has the name of a tensor"),
         recipe=put("launch.scalars", {"sums": 1})),
    Case("output_has_the_name_of_an_input",
         (f"{RECIPE}: launch.outputs.x", "output 'x' has the name of an input",
          "rename the output"),
         recipe=put("launch.outputs.x", {"dtype": "f32", "shape": ["M"]})),
    Case("tensor_has_the_name_of_a_host_size",
         (f"{RECIPE}: launch.outputs.num_sms", "output 'num_sms' has the name of a size the "
          "runtime gives", "rename the tensor"),
         recipe=put("launch.outputs.num_sms", {"dtype": "f32", "shape": ["M"]})),
    Case("tensor_has_the_name_of_an_input_dimension",
         (f"{RECIPE}: launch.inputs.n", "input 'n' has the name of an input dimension"),
         recipe=put("launch.inputs.n", {"dtype": "f32", "shape": ["n"]})),
    Case("grid_names_unknown_size",
         (f"{RECIPE}: launch.grid[0]", "'Mm // 128' names size Mm"),
         recipe=put("launch.grid", ["Mm // 128"])),
    Case("grid_dimension_zero",
         (f"{RECIPE}: launch.grid[1]", "the grid's y dimension is 0 for every call",
          "refused as an empty grid"),
         recipe=put("launch.grid", ["M // 128", "1 - 1"])),
    # Launch expressions the runtime could never evaluate, refused before anything builds.
    Case("bind_calls_a_contract_function",
         (f"{RECIPE}: launch.bind.load.k_tiles", "contract function pow2_ceil() is not "
          "allowed", "min/max/ceil_div/align_up"),
         recipe=bind("load.k_tiles", "pow2_ceil(K) // 64")),
    Case("bind_divides_by_a_constant_zero",
         (f"{RECIPE}: launch.bind.reduce.k_tiles", "division by zero in expression "
          "'ceil_div(K, 64 * 0)'"),
         recipe=bind("reduce.k_tiles", "ceil_div(K, 64 * 0)")),
    Case("output_shape_with_a_choice",
         (f"{RECIPE}: launch.outputs.sums.shape[0]", "a choice (a if p == 'word' else b)"),
         recipe=put("launch.outputs.sums.shape", ["M if M == 1 else 2"])),
    Case("require_calls_ceil_div_with_one_argument",
         (f"{RECIPE}: launch.require[0]", "ceil_div() takes 2 arguments, given 1"),
         recipe=put("launch.require", ["ceil_div(K) <= 64"])),
    # A require that names no size holds for every call or for none: for none, every
    # call was refused at the call, after the build.
    Case("require_of_constants_that_is_false",
         (f"{RECIPE}: launch.require[1]", "require '128 <= 64' names no size and is false "
          "(128 <= 64): every call would be refused", "or the constants it is written with"),
         recipe=chain(put("constants", {"rows": 128}),
                      put("launch.require", ["K % 64 == 0", "$rows <= 64"]))),
    # nvcc compiles a cluster of any size; one past the portable 8 CTAs needs an
    # attribute the runtime does not set, and failed at every launch.
    Case("cluster_past_the_portable_size",
         (f"{RECIPE}: launch.cluster", "the kernel runs in a cluster of [16, 1, 1], 16 CTAs, "
          "more than the 8 a cluster holds portably on sm_90a", "non-portable cluster size",
          "use at most 8 CTAs in all (x * y * z) under launch.cluster"),
         recipe=put("launch.cluster", [16, 1, 1])),
    Case("cluster_past_the_portable_size_in_two_dimensions",
         (f"{RECIPE}: launch.cluster", "a cluster of [4, 4, 1], 16 CTAs"),
         recipe=put("launch.cluster", [4, 4, 1])),
    Case("component_cluster_past_the_portable_size",
         (f"{RECIPE}: instances.load", "load (loader) runs in a cluster of [2, 2, 4], 16 CTAs",
          "components/loader/contract.yaml: cluster, or its params"),
         loader=put("cluster", [2, 2, 4]), recipe=put("launch.cluster", [2, 2, 4])),
    Case("bind_key_without_a_dot",
         (f"{RECIPE}: launch.bind.k_tiles", "bind key 'k_tiles' names no argument",
          "instance.argument", "e.g. load.src"),
         recipe=bind("k_tiles", "K // 64")),
    Case("persistent_launch_with_a_grid",
         (f"{RECIPE}: launch.grid", "this grid would be ignored", "drop launch.grid"),
         recipe=put("launch.persistent", True)),
    # No argument writes it: every call returned whatever the allocator left there.
    Case("output_bound_to_no_argument",
         (f"{RECIPE}: launch.outputs.means", "output 'means' is bound to no argument",
          "uninitialised memory", "(<instance>.<argument>: means), or remove the output"),
         recipe=put("launch.outputs.means", {"dtype": "f32", "shape": ["M"]})),
    Case("input_dimension_zero",
         (f"{RECIPE}: launch.inputs.x.shape[0]", "input 'x' has dimension 0",
          "integer >= 1"),
         recipe=put("launch.inputs.x.shape", [0, "K"])),
    Case("output_dimension_negative",
         (f"{RECIPE}: launch.outputs.sums.shape[0]", "output 'sums' has dimension -4"),
         recipe=put("launch.outputs.sums.shape", [-4])),
    Case("output_shape_names_unknown_sizes",
         (f"{RECIPE}: launch.outputs.sums.shape[0]", "'P * Q' names sizes P, Q"),
         recipe=put("launch.outputs.sums.shape", ["P * Q"])),
    Case("bind_expression_does_not_parse",
         (f"{RECIPE}: launch.bind.reduce.k_tiles", "cannot parse expression 'K //'"),
         recipe=bind("reduce.k_tiles", "K //")),
    Case("required_argument_unbound",
         (f"{RECIPE}: launch.bind", "argument 'store.out' (ptr) of component 'store' is "
          "not bound", "add 'store.out: <tensor>' under launch.bind"),
         recipe=unbind("store.out")),
    Case("scalar_argument_unbound",
         (f"{RECIPE}: launch.bind", "argument 'reduce.k_tiles' (u32)",
          "add 'reduce.k_tiles: <expression>'"),
         recipe=unbind("reduce.k_tiles")),
    Case("tensor_argument_bound_to_an_expression",
         (f"{RECIPE}: launch.bind.load.src", "argument 'load.src' is a tensormap",
          "bind it to a tensor, not 'M * K'", "tensors: x, sums"),
         recipe=bind("load.src", "M * K")),
    Case("scalar_argument_bound_to_a_tensor",
         (f"{RECIPE}: launch.bind.load.k_tiles", "'load.k_tiles' is a u32 scalar, bound to "
          "tensor 'x'"),
         recipe=bind("load.k_tiles", "x")),
    Case("scalar_argument_bound_to_a_negative_literal",
         (f"{RECIPE}: launch.bind.load.k_tiles", "argument 'load.k_tiles' is a u32, which "
          "holds 0..4294967295; bound to -4"),
         recipe=bind("load.k_tiles", -4)),
    Case("scalar_argument_bound_past_its_type",
         (f"{RECIPE}: launch.bind.reduce.k_tiles", "is a u32", "bound to 4294967296"),
         recipe=bind("reduce.k_tiles", 1 << 32)),
    Case("tensor_dtype_differs_from_the_argument",
         (f"{RECIPE}: launch.bind.store.out", "argument 'store.out' (ptr) takes f32 elements, "
          "tensor 'sums' is bf16", "make launch.outputs.sums.dtype f32"),
         recipe=put("launch.outputs.sums.dtype", "bf16")),
    Case("input_dtype_unknown",
         (f"{RECIPE}: launch.inputs.x.dtype", "input 'x' has dtype 'bf17'",
          "use one of f32, tf32, bf16"),
         recipe=put("launch.inputs.x.dtype", "bf17")),
    Case("output_dtype_unknown",
         (f"{RECIPE}: launch.outputs.sums.dtype", "output 'sums' has dtype 'float'"),
         recipe=put("launch.outputs.sums.dtype", "float")),
    # Global hand-offs that wait on each other.
    Case("global_handoff_cycle_of_two",
         (f"{RECIPE}: connect[0]", "dependency cycle through a global hand-off: a -> b -> a",
          "a.out -> b.inp (connect[0], global)", "b.out -> a.inp (connect[1], global)",
          "remove one of these connections"),
         recipe=relays("a.out -> b.inp", "b.out -> a.inp", "s.out -> c.inp")),
    Case("global_handoff_cycle_of_three",
         (f"{RECIPE}: connect[0]", "a -> b -> c -> a", "c.out -> a.inp (connect[2], global)"),
         recipe=relays("a.out -> b.inp", "b.out -> c.inp", "c.out -> a.inp")),
]


def _write(tree: Tree, case: Case) -> Any:
    tree.component("loader", case.loader(producer()) if case.loader else producer())
    tree.component("reducer", case.reducer(consumer()) if case.reducer else consumer())
    tree.component("store", epilogue())
    tree.component("relay", RELAY)
    tree.component("source", SOURCE)
    return tree.recipe(case.recipe(launched()) if case.recipe else launched())


def test_the_launched_toy_checks(tree):
    kernel = tree.check(_write(tree, Case("ok", ())))
    assert [t.kind for t in kernel.transfers] == ["zero_copy", "registers"]
    assert kernel.warnings == ()


def test_a_chain_of_global_handoffs_is_no_cycle(tree):
    kernel = tree.check(_write(tree, Case("chain", (), recipe=relays(
        "s.out -> a.inp", "a.out -> b.inp", "b.out -> c.inp"))))
    assert [t.kind for t in kernel.transfers] == ["global"] * 3


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_rule_refuses_naming_what_to_fix(tree, case):
    with pytest.raises(CheckError) as info:
        tree.check(_write(tree, case))
    text = str(info.value)
    for part in case.must:
        assert part in text, f"{part!r} missing from:\n{text}"


def test_a_kernel_cluster_past_the_portable_size_names_the_kernel(tmp_path):
    """A kernel of a multi-kernel recipe: the key names it."""
    data = yaml.safe_load((ROOT / "recipes" / "gemm_auto.yaml").read_text())
    data["kernels"]["short"]["launch"]["cluster"] = [16, 1, 1]
    path = tmp_path / "recipes" / "gemm_auto.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    kernel = load_recipe(path).kernels()["short"]
    bound = {inst: load_contract(ROOT / "components" / i.component / "contract.yaml")
             .bind(i.params) for inst, i in kernel.instances("sm_90a").items()}
    with pytest.raises(CheckError) as info:
        check(kernel, "sm_90a", bound)
    assert f"{path}: kernels.short.launch.cluster: the kernel runs in a cluster of " \
           "[16, 1, 1]" in str(info.value)


def test_the_same_cycle_is_reported_once(tree):
    with pytest.raises(CheckError) as info:
        tree.check(_write(tree, Case("two", (), recipe=relays(
            "a.out -> b.inp", "b.out -> a.inp", "s.out -> c.inp"))))
    assert sum("dependency cycle" in p for p in info.value.problems) == 1
