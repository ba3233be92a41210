"""Bad inputs, one per row: each is refused with PipeLink's own error type and a message
that names the file, the component or instance, the port or key, and the field.

Every row starts from three contracts that fit (``loader -> reducer -> store``, see
``tests/conftest.py``) and a recipe wiring them, breaks one thing, and runs what the
linker runs: load the recipe, bind each instance's contract with the recipe's params,
check. Object rows corrupt a packed object and read it back. No compiler is needed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from pipelink import cli
from pipelink.check import check
from pipelink.cli import UsageError
from pipelink.contract import contract_from_data
from pipelink.errors import (
    CheckError,
    ContractError,
    ObjectFormatError,
    PipeLinkError,
    RecipeError,
)
from pipelink.objfile import pack, read_object
from pipelink.place import DemandsDoNotFit, place
from pipelink.recipe import load_recipe

from ..conftest import Tree, consumer, epilogue, producer, toy_recipe

Mutation = Callable[[Any], Any]

LOADER = "components/loader/contract.yaml"
REDUCER = "components/reducer/contract.yaml"
STORE = "components/store/contract.yaml"
RECIPE = "recipes/r.yaml"
MAX_MESSAGE = 1500   # characters: a message names the place, it never echoes the input


# -- mutations of a contract or recipe dict ----------------------------------------------

def _walk(data: Any, path: str) -> tuple[Any, Any]:
    keys: list[Any] = [int(k) if k.isdigit() else k for k in path.split(".")]
    for k in keys[:-1]:
        data = data[k]
    return data, keys[-1]


def put(path: str, value: Any) -> Mutation:
    """Sets the dotted ``path`` (list indices as numbers) to ``value``."""
    def mutate(data: Any) -> Any:
        parent, key = _walk(data, path)
        parent[key] = value
        return data
    return mutate


def drop(path: str) -> Mutation:
    def mutate(data: Any) -> Any:
        parent, key = _walk(data, path)
        del parent[key]
        return data
    return mutate


def add(path: str, value: Any) -> Mutation:
    """Appends ``value`` to the list at ``path``."""
    def mutate(data: Any) -> Any:
        parent, key = _walk(data, path)
        parent[key].append(value)
        return data
    return mutate


def chain(*mutations: Mutation) -> Mutation:
    def mutate(data: Any) -> Any:
        for m in mutations:
            data = m(data)
        return data
    return mutate


# -- objects ----------------------------------------------------------------------------

def packed_loader(contract: dict[str, Any] | None = None) -> bytes:
    bound = contract_from_data(producer(), LOADER).bind()
    if contract is not None:
        bound = replace(bound, contract=replace(bound.contract, data=contract))
    return pack(bound, "sm_90a", b"\x00LTO-IR of a loader, bytes as nvcc writes them\x00" * 8,
                source_sha256="0" * 64, toolchain={"nvcc": "13.0.88", "nvjitlink": "13.0"})


def flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1:]


def header_end(data: bytes) -> int:
    return 12 + int.from_bytes(data[8:12], "little")


def gcc_object(tmp: Path) -> bytes:
    """A real ELF relocatable from the host C compiler (the Python binary without one)."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        return Path(sys.executable).resolve().read_bytes()
    source = tmp / "foreign.c"
    source.write_text("int foreign(int x) { return x + 1; }\n")
    subprocess.run([gcc, "-c", str(source), "-o", str(tmp / "foreign.o")], check=True)
    return (tmp / "foreign.o").read_bytes()


def edit_header(data: bytes, old: bytes, new: bytes) -> bytes:
    """Replaces the last ``old`` inside the JSON header (sorted keys: the header's own
    params come after the embedded contract's), keeping the recorded length right."""
    end = header_end(data)
    header = new.join(data[12:end].rsplit(old, 1))
    assert header != data[12:end]
    return data[:8] + len(header).to_bytes(4, "little") + header + data[end:]


ELF_BYTES = b"\x7fELF\x02\x01\x01\x00" + bytes(56) + b"\x01\x02\x03"
# Ten levels of ten aliases each: 10**10 values once expanded, a few hundred bytes written.
LAUGHS = ("{at}: {{l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol], "
          + ", ".join(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]"
                      for i in range(1, 10)) + "}}\n")


def packed_header(header: bytes) -> bytes:
    """An object whose header is ``header`` as is (length right, LTO-IR empty)."""
    return packed_loader()[:8] + len(header).to_bytes(4, "little") + header


# -- the table --------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    id: str
    error: type[PipeLinkError]
    must: tuple[str, ...]                           # substrings the message must hold
    loader: Mutation | str | None = None            # a mutation, or the file's whole text
    reducer: Mutation | str | None = None
    store: Mutation | str | None = None
    recipe: Mutation | str | None = None
    arch: str = "sm_90a"
    obj: Callable[[Path], bytes] | None = None      # bytes of a .o to read instead
    bound_check: bool = field(default=False)        # check an object's embedded contract
    place: bool = False                             # also place the checked kernel
    never: tuple[str, ...] = ()                     # substrings the message must not hold


CASES = [
    # Contract files: YAML and schema.
    Case("contract_malformed_yaml", ContractError,
         (f"{LOADER}:3:", "malformed YAML"),
         loader="component: loader\narch: [sm_90a\nroles: {producer: {warps: 1}}\n"),
    Case("contract_not_a_mapping", ContractError,
         (LOADER, "a contract is a mapping"), loader="- loader\n- sm_90a\n"),
    Case("contract_unknown_top_key", ContractError,
         (LOADER, "key 'smme': unknown key", "allowed keys here:", "smem"),
         loader=put("smme", {})),
    Case("contract_unknown_port_key", ContractError,
         (LOADER, "key 'ports.tiles.stagse': unknown key", "stages"),
         loader=put("ports.tiles.stagse", 4)),
    Case("contract_unknown_role_key", ContractError,
         (REDUCER, "key 'roles.reduce.warp': unknown key", "warps"),
         reducer=put("roles.reduce.warp", 4)),
    Case("contract_missing_arch", ContractError,
         (LOADER, "key 'arch': missing (required)"), loader=drop("arch")),
    Case("contract_arch_not_a_list", ContractError,
         (LOADER, "key 'arch'", "is not of type 'array'"), loader=put("arch", "sm_90a")),
    Case("contract_unknown_arch", ContractError,
         (LOADER, "key 'arch[0]'", "'sm_89' is not one of"), loader=put("arch", ["sm_89"])),
    Case("contract_port_dir_wrong_value", ContractError,
         (REDUCER, "key 'ports.x.dir'", "'inout' is not one of"),
         reducer=put("ports.x.dir", "inout")),
    Case("contract_smem_bytes_wrong_type", ContractError,
         (LOADER, "key 'smem.tiles.bytes'", "integer expression"),
         loader=put("smem.tiles.bytes", [1, 2])),
    Case("contract_bad_component_name", ContractError,
         (LOADER, "key 'component'", "Loader-1"), loader=put("component", "Loader-1")),
    Case("contract_name_with_trailing_newline", ContractError,
         (LOADER, "key 'component'", "'loader\\n'"), loader=put("component", "loader\n")),
    Case("contract_param_float", ContractError,
         (LOADER, "key 'params.rows'", "1.5 is neither integer nor string"),
         loader=put("params.rows", 1.5)),
    # Contract files: references and expressions.
    Case("contract_unbound_name", ContractError,
         (f"{LOADER}: smem.tiles.bytes", "unbound name 'rowz' in smem.tiles.bytes",
          "did you mean 'rows'?", "under params or tunables (known: cols, dtype, rows, "
                                  "stages)"),
         loader=put("smem.tiles.bytes", "stages*rowz*cols*sizeof(dtype)")),
    # A field fixed when the component compiles reads params only: the hint offers no
    # tunable, neither as a place to declare the name nor as the name meant.
    Case("contract_unbound_name_in_params_only_field", ContractError,
         (f"{LOADER}: ports.tiles.arrivals", "unbound name 'stagez'",
          "declare it under params: this field is fixed when the component compiles and "
          "reads no tunable (params: cols, dtype, rows)"),
         loader=put("ports.tiles.arrivals", "stagez"),
         never=("tunables (known", "stages", "did you mean")),
    Case("contract_arg_max_reads_tunable", ContractError,
         (f"{LOADER}: args[1].max", "reads tunable 'stages'", "use params only"),
         loader=put("args.1.max", "stages*64")),
    Case("contract_arg_max_unbound_name", ContractError,
         (f"{LOADER}: args[1].max", "unbound name 'rowz'", "did you mean 'rows'?",
          "(params: cols, dtype, rows)"),
         loader=put("args.1.max", "rowz"), never=("tunables (known", "stages")),
    Case("contract_unbound_name_in_shape", ContractError,
         (f"{REDUCER}: ports.x.shape[1]", "unbound name 'k'"),
         reducer=put("ports.x.shape", ["rows", "k"])),
    Case("contract_expression_syntax", ContractError,
         (f"{LOADER}: ports.tiles.tx_bytes", "cannot parse expression 'rows*'"),
         loader=put("ports.tiles.tx_bytes", "rows*")),
    Case("contract_expression_attribute_call", ContractError,
         (f"{LOADER}: smem.tiles.align", "'rows.bit_length()'"),
         loader=put("smem.tiles.align", "rows.bit_length()")),
    Case("contract_align_above_the_dynamic_base", ContractError,
         (f"{LOADER}: smem.tiles.align", "2048 is outside 1..1024", "1024 bytes"),
         loader=put("smem.tiles.align", 2048)),
    Case("contract_expression_huge_power", ContractError,
         (f"{LOADER}: smem.tiles.bytes", "out of the 64-bit range"),
         loader=put("smem.tiles.bytes", "(rows**9)**9")),
    Case("contract_tunable_in_compile_time_field", ContractError,
         (f"{LOADER}: roles.producer.warps", "reads tunable 'stages'"),
         loader=put("roles.producer.warps", "stages")),
    Case("contract_port_buffer_undeclared", ContractError,
         (f"{LOADER}: ports.tiles.buffer", "port 'tiles' names buffer 'tilez'", "smem: tiles"),
         loader=put("ports.tiles.buffer", "tilez")),
    Case("contract_port_full_barrier_undeclared", ContractError,
         (f"{LOADER}: ports.tiles.full", "mbarrier array 'ful' as full"),
         loader=put("ports.tiles.full", "ful")),
    Case("contract_port_role_undeclared", ContractError,
         (f"{REDUCER}: ports.acc.role", "port 'acc' names role 'epilogue'"),
         reducer=put("ports.acc.role", "epilogue")),
    Case("contract_port_missing_field", ContractError,
         (f"{REDUCER}: ports.x", "in smem_pipeline port 'x' needs 'arrivals'"),
         reducer=drop("ports.x.arrivals")),
    Case("contract_port_dtype_unknown", ContractError,
         (f"{LOADER}: ports.tiles.dtype", "'bf17' is neither a dtype nor a string param",
          "dtypes: f32"),
         loader=put("ports.tiles.dtype", "bf17")),
    Case("contract_per_tile_unknown_arg", ContractError,
         (f"{REDUCER}: ports.x.per_tile", "'args.k_tile'", "args: k_tiles"),
         reducer=put("ports.x.per_tile", "args.k_tile")),
    Case("contract_sizeof_not_a_dtype", ContractError,
         (f"{LOADER}: ports.tiles.tx_bytes", "sizeof(rows)"),
         loader=put("ports.tiles.tx_bytes", "rows*cols*sizeof(rows)")),
    Case("contract_tunable_empty_range", ContractError,
         (f"{LOADER}: tunables.stages", "empty range [8, 2]"),
         loader=put("tunables.stages", [8, 2])),
    # A ring's stages past its buffer or its barriers would land on the next ones.
    Case("contract_ring_buffer_holds_one_stage", ContractError,
         (f"{LOADER}: smem.tiles.bytes", "port 'tiles' rings 2 stages of 16384 bytes",
          "holds 16384 bytes", "stages*rows*cols*sizeof(dtype)"),
         loader=put("smem.tiles.bytes", "rows*cols*sizeof(dtype)")),
    Case("contract_ring_fewer_barriers_than_stages", ContractError,
         (f"{LOADER}: mbarriers.full", "port 'tiles' rings 3 stages", "number 2",
          "with stages=3", "one barrier per stage: stages"),
         loader=put("mbarriers.full", 2)),
    # A tensor map whose box cuTensorMapEncodeTiled refuses would fail every call.
    Case("contract_tensormap_without_box", ContractError,
         (f"{LOADER}: args[0]", "tensormap argument 'src' has no box", "1 to 5 dimensions"),
         loader=drop("args.0.box")),
    Case("contract_tensormap_box_of_six_dimensions", ContractError,
         (f"{LOADER}: args[0].box", "has a 6-D box"),
         loader=put("args.0.box", ["cols", "rows", 1, 1, 1, 1])),
    Case("contract_tensormap_box_wider_than_its_swizzle", ContractError,
         (f"{LOADER}: args[0].box[0]", "spans 256 bytes, more than its 128-byte swizzle",
          "at most 64 elements"),
         loader=chain(put("args.0.swizzle", 128), put("args.0.box", ["rows", "cols"]))),
    Case("contract_tensormap_box_row_not_16_bytes", ContractError,
         (f"{LOADER}: args[0].box[0]", "spans 6 bytes, not a multiple of 16",
          "multiple of 8 elements"),
         loader=put("args.0.box", [3, "rows"])),
    Case("contract_static_smem_over_the_block", CheckError,
         (f"{RECIPE}: instances.store", "static __shared__ memory alone needs 300000 B "
          "(store), more than the 232448 B a block gets on sm_90a",
          f"{STORE} (static_smem: states it)"),
         store=put("static_smem", 300000), never=(" -",)),
    Case("contract_tmem_without_sm100", ContractError,
         (f"{LOADER}: tmem.acc", "needs sm_100a"),
         loader=chain(put("arch", ["sm_90a"]), put("tmem", {"acc": {"columns": 128}}))),
    Case("contract_stage_without_roles", ContractError,
         (f"{LOADER}: roles", "component 'loader' declares no roles, so no role sees port "
          "'tiles'", "roles: {main: {warps: 1}}"), loader=put("roles", {})),
    Case("contract_two_roles_port_without_role", ContractError,
         (f"{REDUCER}: ports.x", "port 'x' of 'reducer' must say which role sees it"),
         reducer=put("roles.helper", {"warps": 1})),
    Case("contract_named_barrier_threads_not_warps", ContractError,
         (f"{STORE}: named_barriers.done.threads", "100 is not a multiple of 32",
          f"{RECIPE}: instances.store)"),
         store=put("named_barriers.done.threads", 100)),
    # A named barrier's when: one comparison over params (tests/unit/test_barrier_when.py).
    Case("contract_barrier_when_not_a_condition", ContractError,
         (f"{STORE}: named_barriers.done.when", "'rows // 64' is not a condition",
          "one == or != comparison over params"),
         store=put("named_barriers.done.when", "rows // 64")),
    Case("contract_barrier_when_unbound_name", ContractError,
         (f"{STORE}: named_barriers.done.when", "unbound name 'tile_m'", "params: rows"),
         store=put("named_barriers.done.when", "tile_m == 192"), never=("tunables",)),
    Case("contract_barrier_when_misspelt_param", ContractError,
         (f"{LOADER}: named_barriers.sync.when", "unbound name 'rowz'",
          "did you mean 'rows'?", "declare it under params:", "(params: cols, dtype, rows)"),
         loader=put("named_barriers", {"sync": {"threads": 32, "when": "rowz == 128"}}),
         never=("tunables (known", "stages")),
    Case("contract_barrier_when_reads_tunable", ContractError,
         (f"{LOADER}: named_barriers.sync.when", "reads tunable 'stages'",
          "use params only in this field"),
         loader=put("named_barriers", {"sync": {"threads": 32, "when": "stages == 2"}})),
    Case("contract_barrier_when_not_a_string", ContractError,
         (STORE, "key 'named_barriers.done.when'", "is not of type 'string'"),
         store=put("named_barriers.done.when", True)),
    Case("contract_barrier_when_word_against_integer", ContractError,
         (f"{LOADER}: named_barriers.sync.when", "compare a word with an integer",
          f"{RECIPE}: instances.load)"),
         loader=put("named_barriers", {"sync": {"threads": 32, "when": "dtype == 16"}})),
    # requires: rules on the params, checked as the recipe binds them (tests/unit/test_requires.py).
    Case("contract_requires_broken_by_recipe_params", ContractError,
         (f"{LOADER}: requires[0]", "'loader' requires rows % 256 == 0: a tile is whole "
          "256-row boxes", "rows=128", f"{RECIPE}: instances.load)",
          "set rows so that rows % 256 == 0"),
         loader=put("requires", [{"check": "rows % 256 == 0",
                                  "why": "a tile is whole 256-row boxes"}])),
    Case("contract_requires_value_not_listed", ContractError,
         (f"{STORE}: requires[1]", "'store' requires rows in (64, 256): one warp per 64 "
          "rows, at most four"),
         store=put("requires", [{"check": "rows >= 64", "why": "a warp at least"},
                                {"check": "rows in (64, 256)",
                                 "why": "one warp per 64 rows, at most four"}])),
    Case("contract_requires_not_a_comparison", ContractError,
         (f"{LOADER}: requires[0].check", "cannot read requirement 'rows // 64'",
          "head_dim in (64, 128)"),
         loader=put("requires", [{"check": "rows // 64", "why": "whole boxes"}])),
    Case("contract_requires_reads_tunable", ContractError,
         (f"{LOADER}: requires[0].check", "unbound name 'stages'", "reads no tunable"),
         loader=put("requires", [{"check": "stages >= 2", "why": "double buffering"}])),
    Case("contract_requires_without_why", ContractError,
         (LOADER, "key 'requires[0].why': missing (required)", "what the code needs"),
         loader=put("requires", [{"check": "rows % 64 == 0"}])),
    # Recipe files.
    Case("recipe_malformed_yaml", RecipeError,
         (f"{RECIPE}:2:", "malformed YAML"), recipe="recipe: toy\n  arch: [sm_90a]\n"),
    # A name longer than a file name may be failed the link's write, after every step.
    Case("recipe_name_too_long", RecipeError,
         (RECIPE, "key 'recipe'", "is 300 characters long, more than 64", "shorten it"),
         recipe=put("recipe", "r" * 300)),
    Case("recipe_unknown_key", RecipeError,
         (RECIPE, "key 'phasez': unknown key", "phases"), recipe=put("phasez", ["main"])),
    # A value of the one type a form takes is told that form's own fault, not that it
    # is "neither string nor object".
    Case("recipe_instance_misspelt_key", RecipeError,
         (RECIPE, "key 'instances.load.parms': unknown key", "params"),
         recipe=put("instances.load", {"component": "loader", "parms": {"rows": 64}}),
         never=("neither",)),
    Case("recipe_instance_pin_a_word", RecipeError,
         (RECIPE, "key 'instances.load.tunables.stages'", "'4' is neither integer nor array"),
         recipe=put("instances.load", {"component": "loader", "tunables": {"stages": "4"}})),
    Case("contract_tunable_no_values", ContractError,
         (LOADER, "key 'tunables.stages.values'", "[] should be non-empty"),
         loader=put("tunables.stages", {"values": []})),
    Case("contract_expression_empty", ContractError,
         (LOADER, "key 'smem.tiles.bytes'", "'' should be non-empty"),
         loader=put("smem.tiles.bytes", ""), never=("neither",)),
    Case("recipe_bad_connection_syntax", RecipeError,
         (RECIPE, "key 'connect[0]'", "load.tiles => reduce.x"),
         recipe=put("connect.0", "load.tiles => reduce.x")),
    Case("recipe_connection_unknown_instance", RecipeError,
         (f"{RECIPE}: connect[0]", "instance 'lod'"),
         recipe=put("connect.0", "lod.tiles -> reduce.x")),
    Case("recipe_unknown_component", RecipeError,
         (f"{RECIPE}: instances.reduce", "unknown component 'reducr'",
          "did you mean 'reducer'? known components: loader, reducer, store"),
         recipe=put("instances.reduce", "reducr")),
    Case("recipe_unknown_param", ContractError,
         (f"{RECIPE}: instances.load", "component 'loader' has no param 'rowz'",
          "params: cols, dtype, rows"),
         recipe=put("instances.load", {"component": "loader", "params": {"rowz": 64}})),
    Case("recipe_param_wrong_type", ContractError,
         (f"{RECIPE}: instances.load", "param 'rows' of 'loader' is int, got '128'"),
         recipe=put("instances.load", {"component": "loader", "params": {"rows": "128"}})),
    Case("recipe_param_not_a_dtype", ContractError,
         (f"{LOADER}: ports.tiles.dtype", "param 'dtype' is 'bf17', not a dtype",
          "params: cols=64, dtype=bf17, rows=128, set in ", f"{RECIPE}: instances.load)"),
         recipe=put("instances.load", {"component": "loader", "params": {"dtype": "bf17"}})),
    Case("recipe_param_makes_a_size_zero", ContractError,
         (f"{LOADER}: ports.tiles.shape[1]", "0 is less than 1", "cols=0",
          f"{RECIPE}: instances.load)"),
         recipe=put("instances.load", {"component": "loader", "params": {"cols": 0}})),
    Case("recipe_arch_not_targeted", RecipeError,
         (f"{RECIPE}: arch", "recipe 'toy' does not target sm_100a"), arch="sm_100a"),
    Case("recipe_pin_outside_range", CheckError,
         (f"{RECIPE}: instances.load.tunables.stages", "pins 16 outside loader's range"),
         recipe=put("instances.load", {"component": "loader", "tunables": {"stages": 16}})),
    # One value in the range would place it alone, as if the other were never written.
    Case("recipe_pin_list_partly_outside_range", CheckError,
         (f"{RECIPE}: instances.load.tunables.stages", "pins 16 outside loader's range"),
         recipe=put("instances.load", {"component": "loader",
                                       "tunables": {"stages": [3, 16]}})),
    Case("recipe_pin_unknown_tunable", CheckError,
         (f"{RECIPE}: instances.load.tunables.stage", "pins 'stage', which is not a tunable "
          "of 'loader'", "its tunables: stages"),
         recipe=put("instances.load", {"component": "loader", "tunables": {"stage": 4}})),
    Case("recipe_pin_on_component_without_tunables", CheckError,
         (f"{RECIPE}: instances.store.tunables.stages", "its tunables: none"),
         recipe=put("instances.store", {"component": "store", "tunables": {"stages": 4}})),
    Case("recipe_pins_of_one_ring_disagree", CheckError,
         (f"{RECIPE}: instances.reduce.tunables.stages", "'load.stages' may be [3] and "
          "'reduce.stages' [4]", "'load.tiles -> reduce.x', connect[0]", "pin both"),
         recipe=chain(put("instances.load", {"component": "loader", "tunables": {"stages": 3}}),
                      put("instances.reduce", {"component": "reducer",
                                               "tunables": {"stages": 4}}))),
    Case("recipe_bind_unknown_argument", CheckError,
         (f"{RECIPE}: launch.bind.load.k_tile", "component 'loader' (instance 'load') has no "
          "argument 'k_tile'", "its args: src, k_tiles"),
         recipe=put("launch", {"bind": {"load.k_tile": "K // 64"}})),
    Case("recipe_bind_unknown_instance", CheckError,
         (f"{RECIPE}: launch.bind.lod.k_tiles", "names instance 'lod'"),
         recipe=put("launch", {"bind": {"lod.k_tiles": "K // 64"}})),
    # The checker: connected ports.
    Case("check_dtype_mismatch", CheckError,
         (f"{RECIPE}: connect[0]", "'load.tiles' (loader) -> 'reduce.x' (reducer)",
          "field 'dtype' differs: e4m3 vs bf16"),
         recipe=put("instances.load", {"component": "loader", "params": {"dtype": "e4m3"}})),
    Case("check_shape_mismatch", CheckError,
         (f"{RECIPE}: connect[0]", "'load.tiles' (loader) -> 'reduce.x' (reducer)",
          "field 'shape' differs: [128, 64] vs [128, 32]"),
         recipe=put("instances.reduce", {"component": "reducer", "params": {"cols": 32}})),
    Case("check_layout_mismatch", CheckError,
         (f"{RECIPE}: connect[0]", "'reduce.x' (reducer)",
          "field 'layout' differs: row_major vs sw128_kmajor"),
         reducer=put("ports.x.layout", "sw128_kmajor")),
    Case("check_stage_mismatch", CheckError,
         (f"{RECIPE}: connect[0]", "'load.tiles' (loader) -> 'reduce.x' (reducer)",
          "field 'stages': [4] vs [2] have no value in common"),
         loader=chain(drop("tunables"), put("smem.tiles.bytes", "4*rows*cols*sizeof(dtype)"),
                      put("mbarriers", {"full": 4, "empty": 4}), put("ports.tiles.stages", 4)),
         reducer=chain(drop("tunables"), put("ports.x.stages", 2))),
    Case("check_conversion_into_fixed_stages", CheckError,
         (f"{RECIPE}: connect[0]", "'reduce.x'", "a ring of 2 stages, it takes [4]"),
         recipe=put("instances.load", {"component": "loader", "params": {"dtype": "f32"}}),
         reducer=chain(drop("tunables"), put("ports.x.stages", 4))),
    Case("check_tx_bytes_mismatch", CheckError,
         (f"{RECIPE}: connect[0]", "'reduce.x' (reducer)", "field 'tx_bytes' differs: 16384 vs 1"),
         reducer=put("ports.x.tx_bytes", 1)),
    Case("check_arrival_mismatch", CheckError,
         (f"{RECIPE}: connect[0]", "'load.tiles' (loader) expects 1 arrivals per stage",
          "its consumers make 128 (reduce.x 128)"),
         loader=put("ports.tiles.consumer_arrivals", 1)),
    Case("check_register_dtype_mismatch", CheckError,
         (f"{RECIPE}: connect[1]", "'reduce.acc' (reducer) -> 'store.acc' (store)",
          "field 'dtype' differs: f32 vs bf16"),
         store=put("ports.acc.dtype", "bf16")),
    Case("check_register_count_mismatch", CheckError,
         (f"{RECIPE}: connect[1]", "'store.acc' (store)", "field 'count' differs: 8 vs 16"),
         store=put("ports.acc.count", 16)),
    Case("check_register_warps_mismatch", CheckError,
         (f"{RECIPE}: connect", "different warp counts", "reduce.reduce 4", "store.store 8"),
         store=put("roles.store.warps", 8)),
    Case("check_port_kinds_differ", CheckError,
         (f"{RECIPE}: connect[1]", "'load.tiles' (loader) -> 'store.acc' (store)",
          "port kinds differ: smem_pipeline vs registers"),
         recipe=put("connect", ["load.tiles -> reduce.x", "load.tiles -> store.acc",
                                "reduce.acc -> store.acc"])),
    Case("check_connection_backwards", CheckError,
         (f"{RECIPE}: connect[0]", "'reduce.x' is an in port and 'load.tiles' an out port"),
         recipe=put("connect.0", "reduce.x -> load.tiles")),
    Case("check_unknown_port", CheckError,
         (f"{RECIPE}: connect[0]", "component 'loader' (instance 'load') has no port 'tilez'",
          "its ports: tiles"),
         recipe=put("connect.0", "load.tilez -> reduce.x")),
    Case("check_input_unconnected", CheckError,
         (f"{RECIPE}: instances.reduce", "input port 'reduce.x' (smem_pipeline, dtype) of "
          "component 'reducer' is not connected"),
         recipe=put("connect", ["reduce.acc -> store.acc"])),
    Case("check_input_connected_twice", CheckError,
         (f"{RECIPE}: connect[2]", "input port 'reduce.x' is connected twice "
          "(connect[0] and connect[2])"),
         recipe=chain(put("instances.load2", "loader"),
                      add("connect", "load2.tiles -> reduce.x"))),
    Case("check_fixed_barriers_collide", CheckError,
         (f"{RECIPE}: instances.store", "named barrier id 13 is fixed by both",
          "load.sync (loader, ", LOADER, "store.done (store, ", STORE),
         loader=put("named_barriers", {"sync": {"threads": 32, "fixed": 13}}),
         store=put("named_barriers.done.fixed", 13)),
    Case("check_disjoint_archs", CheckError,
         (f"{RECIPE}: instances.reduce", "component 'reducer' supports sm_100a, not sm_90a"),
         reducer=put("arch", ["sm_100a"])),
    Case("check_cluster_shapes_disagree", CheckError,
         (f"{RECIPE}: launch.cluster", "cluster shapes disagree", "load [2, 1, 1]",
          "reduce [1, 1, 1]"),
         loader=put("cluster", [2, 1, 1]), reducer=put("cluster", [1, 1, 1])),
    # Objects.
    Case("object_foreign_elf", ObjectFormatError,
         ("foreign.sm_90a.o", "not a PipeLink object (bad magic)"), obj=gcc_object),
    Case("object_empty", ObjectFormatError,
         ("foreign.sm_90a.o", "bad magic"), obj=lambda tmp: b""),
    Case("object_truncated_in_header", ObjectFormatError,
         ("foreign.sm_90a.o", "corrupted header"), obj=lambda tmp: packed_loader()[:200]),
    Case("object_truncated_in_ltoir", ObjectFormatError,
         ("foreign.sm_90a.o", "LTO-IR does not match its recorded hash"),
         obj=lambda tmp: packed_loader()[:-10]),
    Case("object_flipped_byte_in_ltoir", ObjectFormatError,
         ("foreign.sm_90a.o", "LTO-IR does not match its recorded hash"),
         obj=lambda tmp: flip(packed_loader(), header_end(packed_loader()) + 5)),
    Case("object_edited_contract", ObjectFormatError,
         ("foreign.sm_90a.o", "embedded contract does not match its recorded hash"),
         obj=lambda tmp: edit_header(packed_loader(), b'"registers":40', b'"registers":48')),
    Case("object_edited_params", ObjectFormatError,
         ("foreign.sm_90a.o", "symbols were not built with its params"),
         obj=lambda tmp: edit_header(packed_loader(), b'"rows":128}', b'"rows":256}')),
    Case("object_newer_format", ObjectFormatError,
         ("foreign.sm_90a.o", "object format 2, this PipeLink reads 1"),
         obj=lambda tmp: packed_loader()[:6] + b"\x02\x00" + packed_loader()[8:]),
    Case("object_embedded_contract_invalid", ContractError,
         ("foreign.sm_90a.o (embedded contract of 'loader')", "key 'roles.producer.warps'"),
         obj=lambda tmp: packed_loader(put("roles.producer.warps", [1])(producer())),
         bound_check=True),
    # Raw bytes and YAML the bounded reader refuses (contract files).
    Case("contract_binary_file", ContractError, (LOADER, "binary file, not YAML text"),
         loader=ELF_BYTES),
    Case("contract_latin1_text", ContractError, (LOADER, "not UTF-8 text (byte 0xe9"),
         loader="component: loader # café\n".encode("latin-1")),
    Case("contract_nested_100k_deep", ContractError,
         (f"{LOADER}:2:", "nested more than 64 levels deep"),
         loader="component: loader\nx: " + "[" * 100_000 + "]" * 100_000 + "\n"),
    Case("contract_nested_400_deep_short_message", ContractError,
         (f"{LOADER}:2:", "nested more than 64 levels deep"), never=("[[[[",),
         loader="component: loader\nx: " + "[" * 400 + "]" * 400 + "\n"),
    Case("contract_billion_laughs_in_params", ContractError,
         (LOADER, "expands to more than 200000 values", "aliases"),
         loader=LAUGHS.format(at="params:\n  rows")),
    Case("contract_recursive_alias", ContractError,
         (f"{LOADER}:2:", "alias *a refers to a value that contains it"),
         loader="component: loader\nx: &a [1, *a]\n"),
    Case("contract_duplicate_top_key", ContractError,
         (f"{LOADER}:3:1", "key 'arch' appears twice", "first at line 2"),
         loader="component: loader\narch: [sm_90a]\narch: [sm_100a]\n"),
    Case("contract_duplicate_nested_key", ContractError,
         (f"{LOADER}:", "key 'warps' appears twice"),
         loader="component: loader\narch: [sm_90a]\n"
                "roles: {producer: {warps: 1, warps: 2}}\n"),
    Case("contract_tab_indent", ContractError,
         (f"{LOADER}:3:1", "malformed YAML", "spaces"),
         loader="component: loader\narch: [sm_90a]\n\troles: {}\n"),
    Case("contract_over_one_mib", ContractError, (LOADER, "larger than 1048576 bytes"),
         loader="component: loader\n" + "#" * (1 << 20) + "\n"),
    Case("contract_empty_file", ContractError, (LOADER, "a contract is a mapping"),
         loader=""),
    Case("contract_only_a_comment", ContractError, (LOADER, "a contract is a mapping"),
         loader="# written later\n"),
    Case("contract_two_documents", ContractError,
         (f"{LOADER}:2:", "malformed YAML", "single document"),
         loader="component: loader\n---\ncomponent: reducer\n"),
    Case("contract_python_tag", ContractError,
         (f"{LOADER}:1:", "malformed YAML", "python/object"),
         loader="component: !!python/object/apply:os.getcwd []\n"),
    Case("contract_bad_int_tag", ContractError, (LOADER, "malformed YAML"),
         loader="component: loader\narch: [sm_90a]\nparams: {rows: !!int 0x}\n"),
    Case("contract_empty_int_tag", ContractError,
         (f"{LOADER}:3:", "cannot read '' as !!int"),
         loader="component: loader\narch: [sm_90a]\nparams: {rows: !!int }\n"),
    Case("contract_empty_timestamp_tag", ContractError,
         (f"{LOADER}:1:", "cannot read '' as !!timestamp"), loader="component: !!timestamp\n"),
    Case("contract_huge_integer", ContractError, (LOADER, "malformed YAML"),
         loader="component: loader\narch: [sm_90a]\nparams: {rows: 1" + "0" * 5000 + "}\n"),
    Case("contract_unhashable_key", ContractError,
         (f"{LOADER}:1:", "unhashable key"), loader="? [component]\n: loader\n"),
    Case("contract_control_character", ContractError,
         (LOADER, "malformed YAML", "special characters"), loader="component: loa\x07der\n"),
    Case("contract_unclosed_quote", ContractError, (LOADER, "malformed YAML"),
         loader='component: "loader\narch: [sm_90a]\n'),
    Case("contract_date_is_not_a_name", ContractError,
         (LOADER, "key 'component'", "'2024-13-01' is not a name"),
         loader=put("component", "2024-13-01")),
    Case("contract_entry_not_a_c_identifier", ContractError,
         (LOADER, "key 'roles.producer.entry'", "not a C identifier"), never=("^[",),
         loader=put("roles.producer.entry", "pl-load")),
    Case("contract_param_string_with_space", ContractError,
         (LOADER, "key 'params.dtype'", "not a param string"), never=("^[",),
         loader=put("params.dtype", "bf 16")),
    Case("contract_name_differs_from_folder", ContractError,
         (f"{LOADER}: component", "component 'row_loader' is in folder 'loader'",
          "rename the folder to 'row_loader'", "include pl_loader.h"),
         loader=put("component", "row_loader")),
    Case("contract_huge_list_short_message", ContractError, (LOADER, "key 'arch'", "more)"),
         loader=put("arch", ["sm_90a"] * 5000)),
    # Raw bytes and YAML the bounded reader refuses (recipe files).
    Case("recipe_binary_file", RecipeError, (RECIPE, "binary file, not YAML text"),
         recipe=ELF_BYTES),
    Case("recipe_utf16_file", RecipeError, (RECIPE, "binary file"),
         recipe="recipe: toy\n".encode("utf-16")),
    Case("recipe_cp1252_text", RecipeError, (RECIPE, "not UTF-8 text (byte 0x93"),
         recipe=b"recipe: toy\ndescription: \x93smart quotes\x94\n"),
    Case("recipe_nested_100k_deep", RecipeError,
         (f"{RECIPE}:2:", "nested more than 64 levels deep"),
         recipe="recipe: toy\nx: " + "{a: " * 100_000 + "1" + "}" * 100_000 + "\n"),
    Case("recipe_billion_laughs_in_instance_params", RecipeError,
         (RECIPE, "expands to more than 200000 values"),
         recipe=LAUGHS.format(at="instances:\n  load:\n    component: loader\n    params")),
    Case("recipe_recursive_alias", RecipeError, (f"{RECIPE}:", "refers to a value that"),
         recipe="recipe: toy\ninstances: &i {load: *i}\n"),
    Case("recipe_duplicate_instance", RecipeError,
         (f"{RECIPE}:5:", "key 'load' appears twice", "silently keep the last"),
         recipe="recipe: toy\narch: [sm_90a]\ninstances:\n  load: loader\n  load: reducer\n"),
    Case("recipe_tab_indent", RecipeError,
         (f"{RECIPE}:4:1", "spaces"),
         recipe="recipe: toy\narch: [sm_90a]\ninstances:\n\tload: loader\n"),
    Case("recipe_over_one_mib", RecipeError, (RECIPE, "larger than 1048576 bytes"),
         recipe="recipe: toy\ndescription: '" + "x" * (1 << 20) + "'\n"),
    Case("recipe_empty_file", RecipeError, (RECIPE, "a recipe is a mapping"), recipe=""),
    Case("recipe_a_list", RecipeError, (RECIPE, "a recipe is a mapping"),
         recipe="- load\n- reduce\n"),
    Case("recipe_two_documents", RecipeError, (f"{RECIPE}:", "single document"),
         recipe="recipe: toy\n---\nrecipe: other\n"),
    Case("recipe_wrong_arrow", RecipeError,
         (f"{RECIPE}: ", "key 'connect[0]'", "'load.tiles => reduce.x' is not a connection",
          "write 'producer.port -> consumer.port'"), never=("[a-z_]", "does not match"),
         recipe=put("connect.0", "load.tiles => reduce.x")),
    Case("recipe_reversed_arrow", RecipeError,
         ("key 'connect[1]'", "not a connection", "producer.port -> consumer.port"),
         recipe=put("connect.1", "store.acc <- reduce.acc")),
    Case("recipe_connection_without_port", RecipeError,
         ("key 'connect[0]'", "not a connection"), recipe=put("connect.0", "load -> reduce.x")),
    Case("recipe_name_not_a_name", RecipeError,
         (RECIPE, "key 'recipe'", "'Toy Kernel' is not a name", "lowercase"),
         never=("^[",), recipe=put("recipe", "Toy Kernel")),
    Case("recipe_objective_unknown_tunable", CheckError,
         (f"{RECIPE}: objective.maximize[0]", "'load_x.stagez' is not a tunable",
          "tunables: load.stages, reduce.stages"),
         recipe=put("objective", {"maximize": ["load_x.stagez"]})),
    Case("recipe_objective_second_name_unknown", CheckError,
         (f"{RECIPE}: objective.maximize[1]", "'reduce.stagez'"),
         recipe=put("objective", {"maximize": ["load.stages", "reduce.stagez"]})),
    # Objects: foreign, truncated, corrupted.
    Case("object_counting_bytes", ObjectFormatError, ("foreign.sm_90a.o", "bad magic"),
         obj=lambda tmp: bytes(range(256)) * 4),
    Case("object_yaml_text", ObjectFormatError, ("foreign.sm_90a.o", "bad magic"),
         obj=lambda tmp: b"component: loader\narch: [sm_90a]\n"),
    Case("object_magic_only", ObjectFormatError, ("foreign.sm_90a.o", "bad magic"),
         obj=lambda tmp: packed_loader()[:8]),
    Case("object_truncated_after_prefix", ObjectFormatError,
         ("foreign.sm_90a.o", "corrupted header"), obj=lambda tmp: packed_loader()[:12]),
    Case("object_header_length_too_long", ObjectFormatError,
         ("foreign.sm_90a.o", "corrupted"),
         obj=lambda tmp: packed_loader()[:8] + (1 << 30).to_bytes(4, "little")
         + packed_loader()[12:]),
    Case("object_header_not_utf8", ObjectFormatError, ("foreign.sm_90a.o", "corrupted header"),
         obj=lambda tmp: packed_loader()[:13] + b"\xff" + packed_loader()[14:]),
    Case("object_header_deeply_nested", ObjectFormatError,
         ("foreign.sm_90a.o", "corrupted header"),
         obj=lambda tmp: packed_header(b"[" * 200_000 + b"]" * 200_000)),
    Case("object_header_a_list", ObjectFormatError, ("foreign.sm_90a.o", "corrupted"),
         obj=lambda tmp: packed_header(b"[1, 2, 3]")),
    Case("object_header_missing_symbols", ObjectFormatError,
         ("foreign.sm_90a.o", "field 'symbols' is missing"),
         obj=lambda tmp: edit_header(packed_loader(), b'"symbols"', b'"symbolz"')),
    Case("object_header_wrong_component", ObjectFormatError,
         ("foreign.sm_90a.o", "component 'reader' but the embedded contract is of 'loader'"),
         obj=lambda tmp: edit_header(packed_loader(), b'"component":"loader","contract"',
                                     b'"component":"reader","contract"')),
    Case("object_ltoir_appended", ObjectFormatError,
         ("foreign.sm_90a.o", "LTO-IR does not match its recorded hash"),
         obj=lambda tmp: packed_loader() + b"\x00"),
    Case("object_is_a_folder", ObjectFormatError, ("cannot read",),
         obj=lambda tmp: None),
    # Placing: errors name the contract.yaml the user edits.
    Case("place_smem_does_not_fit", DemandsDoNotFit,
         (f"{LOADER}: smem.tiles", "load.tiles alone needs 2 x 128 KiB", "227 KiB"),
         recipe=chain(put("instances.load", {"component": "loader", "params": {"cols": 256,
                                                                               "rows": 256}}),
                      put("instances.reduce", {"component": "reducer",
                                               "params": {"cols": 256, "rows": 256}}),
                      put("instances.store", {"component": "store", "params": {"rows": 256}})),
         place=True),
    Case("place_pinned_stages_do_not_fit", DemandsDoNotFit,
         (f"{LOADER}: smem.tiles", "load.tiles alone needs 4 x 64 KiB",
          "fewer load.stages"),
         recipe=chain(put("instances.load", {"component": "loader", "params": {"cols": 256},
                                             "tunables": {"stages": 4}}),
                      put("instances.reduce", {"component": "reducer",
                                               "params": {"cols": 256}})),
         place=True),
]


def _write_tree(tree: Tree, case: Case) -> Path:
    for name, base, mutation in (("loader", producer, case.loader),
                                 ("reducer", consumer, case.reducer),
                                 ("store", epilogue, case.store)):
        if isinstance(mutation, bytes):
            tree.component(name, "").write_bytes(mutation)
        elif isinstance(mutation, str):
            tree.component(name, mutation)
        else:
            tree.component(name, mutation(base()) if mutation else base())
    recipe = case.recipe
    if isinstance(recipe, bytes):
        path = tree.recipe("")
        path.write_bytes(recipe)
        return path
    return tree.recipe(recipe if isinstance(recipe, str)
                       else recipe(toy_recipe()) if recipe else toy_recipe())


def _prepare(tree: Tree, case: Case) -> Callable[[], object]:
    """Writes the case's inputs; returns what the linker would run on them."""
    if case.obj is not None:
        path = tree.root / "obj" / "foreign.sm_90a.o"
        path.parent.mkdir(parents=True, exist_ok=True)
        data = case.obj(tree.root)
        if data is None:
            path.mkdir()
        else:
            path.write_bytes(data)
        return lambda: read_object(path).bound() if case.bound_check else read_object(path)
    recipe = _write_tree(tree, case)
    if case.place:
        return lambda: place(tree.check(recipe, case.arch).problem)
    return lambda: tree.check(recipe, case.arch)


def _run(tree: Tree, case: Case) -> None:
    _prepare(tree, case)()


def _files(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in sorted(root.rglob("*"))}


def test_the_table_is_long_enough():
    assert len(CASES) >= 30
    assert len({c.id for c in CASES}) == len(CASES)


def test_the_unbroken_tree_checks(tree):
    kernel = tree.check(_write_tree(tree, Case("ok", PipeLinkError, ())))
    assert [t.kind for t in kernel.transfers] == ["zero_copy", "registers"]
    assert kernel.warnings == ()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_bad_input_is_refused_naming_what_to_fix(tree, case):
    run = _prepare(tree, case)
    before = _files(tree.root)
    with pytest.raises(PipeLinkError) as info:
        run()
    assert type(info.value) is case.error, str(info.value)
    text = str(info.value)
    for part in case.must:
        assert part in text, f"{part!r} missing from:\n{text}"
    for part in case.never:
        assert part not in text, f"{part!r} in:\n{text}"
    assert len(text) < MAX_MESSAGE, f"{len(text)} characters:\n{text[:MAX_MESSAGE]}"
    assert _files(tree.root) == before   # nothing written, nothing half-written


def test_every_problem_of_a_recipe_is_reported_at_once(tree):
    """One run lists every mismatch, so a kernel author fixes them in one pass."""
    tree.toy()
    recipe = toy_recipe()
    recipe["instances"]["load"] = {"component": "loader", "params": {"dtype": "e4m3"}}
    tree.component("store", put("ports.acc.count", 16)(epilogue()))
    with pytest.raises(CheckError) as info:
        tree.check(tree.recipe(recipe))
    assert len(info.value.problems) == 2
    assert "connect[0]" in info.value.problems[0] and "connect[1]" in info.value.problems[1]


def test_a_conversion_pins_the_consumer_ring_to_the_converter_stages(tree):
    tree.toy()
    recipe = toy_recipe()
    recipe["instances"]["load"] = {"component": "loader", "params": {"dtype": "f32"}}
    kernel = tree.check(tree.recipe(recipe))
    assert kernel.transfers[0].kind == "conversion"
    tunables = {t.name: t.values for t in kernel.problem.tunables}
    assert tunables["reduce.stages"] == (2,)
    assert tunables["load.stages"] == tuple(range(2, 9))


def test_zero_copy_pins_a_tunable_to_the_other_side_constant(tree):
    tree.component("loader", producer())
    tree.component("reducer", chain(drop("tunables"), put("ports.x.stages", 4))(consumer()))
    tree.component("store", epilogue())
    kernel = tree.check(tree.recipe(toy_recipe()))
    assert {t.name: t.values for t in kernel.problem.tunables}["load.stages"] == (4,)


def test_check_refuses_objects_the_recipe_does_not_name(tree):
    tree.toy()
    recipe = load_recipe(tree.recipe(toy_recipe()))
    bound = tree.bind(recipe, "sm_90a")
    bound["extra"] = bound["load"]
    with pytest.raises(CheckError, match="'extra', which the recipe does not declare"):
        check(recipe, "sm_90a", bound)
    del bound["extra"], bound["store"]
    with pytest.raises(CheckError, match="no contract for instance 'store'"):
        check(recipe, "sm_90a", bound)


# -- the command line and scons -----------------------------------------------------------
# Rows run the real entry points in a subprocess (exit 2, one message, no traceback) and,
# for the CLI, the same command in-process for the error class. None of them reaches nvcc.

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Command:
    id: str
    args: tuple[str, ...]
    error: type[BaseException]      # SystemExit: refused by argparse before any command runs
    must: tuple[str, ...]
    case: Case = Case("inputs", PipeLinkError, ())   # the tree's contracts and recipe
    files: tuple[tuple[str, bytes], ...] = ()        # extra files, relative to the tree


R = ("--arch", "sm_90a")
COMPILE = ("compile", LOADER, "--arch", "sm_90a", "-o", "out/loader.o")
CLI = [
    Command("cli_check_binary_recipe", ("check", RECIPE, *R), RecipeError,
            (RECIPE, "binary file"), Case("", PipeLinkError, (), recipe=ELF_BYTES)),
    Command("cli_check_missing_recipe", ("check", "recipes/nope.yaml", *R), RecipeError,
            ("recipes/nope.yaml", "cannot read: No such file")),
    Command("cli_check_recipe_is_a_folder", ("check", "recipes", *R), RecipeError,
            ("recipes: cannot read: Is a directory",)),
    Command("cli_check_deep_recipe", ("check", RECIPE, *R), RecipeError,
            (RECIPE, "nested more than 64"),
            Case("", PipeLinkError, (), recipe="x: " + "[" * 100_000 + "\n")),
    Command("cli_check_dup_key_recipe", ("check", RECIPE, *R), RecipeError,
            (f"{RECIPE}:3:1", "key 'arch' appears twice"),
            Case("", PipeLinkError, (), recipe="recipe: r\narch: [sm_90a]\narch: [sm_100a]\n")),
    Command("cli_check_wrong_arrow", ("check", RECIPE, *R), RecipeError,
            ("key 'connect[0]'", "write 'producer.port -> consumer.port'"),
            Case("", PipeLinkError, (), recipe=put("connect.0", "load.tiles => reduce.x"))),
    Command("cli_check_arch_not_targeted", ("check", RECIPE, "--arch", "sm_100a"),
            RecipeError, (f"{RECIPE}: arch", "does not target sm_100a")),
    Command("cli_check_unknown_component", ("check", RECIPE, *R), RecipeError,
            (f"{RECIPE}: instances.load", "unknown component 'nope'"),
            Case("", PipeLinkError, (), recipe=put("instances.load", "nope"))),
    Command("cli_check_contract_tab", ("check", RECIPE, *R), ContractError,
            (f"{LOADER}:3:1", "spaces"),
            Case("", PipeLinkError, (), loader="component: loader\narch: [sm_90a]\n\tx: 1\n")),
    # A wiring mistake is found in the contracts' YAML, before a component compiles: the
    # build folder stays unwritten (the row's check that no file changed).
    Command("cli_check_miswired_before_compiling", ("check", RECIPE, *R), CheckError,
            (f"{RECIPE}: connect[0]", "field 'dtype' differs: e4m3 vs bf16"),
            Case("", PipeLinkError, (), recipe=put("instances.load", {
                "component": "loader", "params": {"dtype": "e4m3"}}))),
    Command("cli_check_build_is_a_file", ("check", RECIPE, *R, "--build", "afile"),
            UsageError, ("--build afile is a file, not a folder",), files=(("afile", b"x"),)),
    Command("cli_check_build_inside_a_file", ("check", RECIPE, *R, "--build", "afile/obj"),
            UsageError, ("--build afile/obj is inside afile, which is a file",),
            files=(("afile", b"x"),)),
    Command("cli_link_output_is_a_file", ("link", RECIPE, *R, "-o", "afile"), UsageError,
            ("--output afile is a file, not a folder",), files=(("afile", b"x"),)),
    Command("cli_explain_svg_is_a_folder", ("explain", RECIPE, *R, "--svg", "recipes"),
            UsageError, ("--svg recipes is a folder, not a file", "recipes/map.svg")),
    Command("cli_explain_svg_inside_a_file", ("explain", RECIPE, *R, "--svg", "afile/m.svg"),
            UsageError, ("--svg afile/m.svg is inside afile, which is a file",),
            files=(("afile", b"x"),)),
    Command("cli_place_workers_negative", ("place", RECIPE, *R, "--workers", "-3"),
            SystemExit, ("argument --workers", "whole number >= 1, got '-3'")),
    Command("cli_place_workers_zero", ("place", RECIPE, *R, "--workers", "0"), SystemExit,
            ("argument --workers", ">= 1")),
    Command("cli_explain_workers_word", ("explain", RECIPE, *R, "--workers", "two"),
            SystemExit, ("argument --workers", "got 'two'")),
    Command("cli_inspect_yaml_as_object", ("inspect", RECIPE), ObjectFormatError,
            (RECIPE, "not a PipeLink object (bad magic)")),
    Command("cli_inspect_missing_object", ("inspect", "obj/none.o"), ObjectFormatError,
            ("obj/none.o", "cannot read: No such file")),
    Command("cli_inspect_folder", ("inspect", "recipes"), ObjectFormatError,
            ("recipes", "cannot read: Is a directory")),
    Command("cli_inspect_truncated_object", ("inspect", "obj/x.o"), ObjectFormatError,
            ("obj/x.o", "corrupted header"), files=(("obj/x.o", b"PLOBJ\x00\x01\x00\xff\xff"
                                                    b"\x00\x00{\"format\""),)),
    Command("cli_compile_param_without_value", (*COMPILE, "-p", "rows"), UsageError,
            ("-p 'rows': write name=value",)),
    Command("cli_compile_unknown_param", (*COMPILE, "-p", "rowz=64"), ContractError,
            (LOADER, "component 'loader' has no param 'rowz'", "cols, dtype, rows")),
    Command("cli_compile_unsupported_arch", ("compile", LOADER, "--arch", "sm_120a", "-o",
                                             "out/x.o"), ContractError,
            (f"{LOADER}: arch", "does not support sm_120a")),
    Command("cli_compile_contract_binary", COMPILE, ContractError, (LOADER, "binary file"),
            Case("", PipeLinkError, (), loader=ELF_BYTES)),
    Command("cli_compile_contract_laughs", COMPILE, ContractError,
            (LOADER, "expands to more than"),
            Case("", PipeLinkError, (), loader=LAUGHS.format(at="params"))),
    Command("cli_compile_name_differs_from_folder", COMPILE, ContractError,
            (f"{LOADER}: component", "rename the folder to 'row_loader'"),
            Case("", PipeLinkError, (), loader=put("component", "row_loader"))),
]


def _command_tree(tree: Tree, command: Command) -> dict[str, str]:
    _write_tree(tree, command.case)
    for rel, data in command.files:
        (tree.root / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree.root / rel).write_bytes(data)
    stage = tree.root.parent / f"{tree.root.name}-stage"
    return {**os.environ, "PYTHONPATH": str(ROOT), "PIPELINK_STAGE": str(stage),
            "PIPELINK_COMPONENTS": str(tree.root / "components")}


def _one_message(proc: subprocess.CompletedProcess, must: tuple[str, ...]) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    for part in must:
        assert part in proc.stderr, f"{part!r} missing from:\n{proc.stderr}"
    assert len(proc.stderr) < MAX_MESSAGE + 400, proc.stderr[:MAX_MESSAGE]


@pytest.mark.parametrize("command", CLI, ids=lambda c: c.id)
def test_cli_refuses_bad_input_in_one_message(tree, monkeypatch, command):
    env = _command_tree(tree, command)
    before = _files(tree.root)
    proc = subprocess.run([sys.executable, "-m", "pipelink.cli", *command.args],
                          cwd=tree.root, env=env, capture_output=True, text=True, timeout=120)
    _one_message(proc, command.must)
    assert _files(tree.root) == before
    monkeypatch.chdir(tree.root)
    for key in ("PIPELINK_STAGE", "PIPELINK_COMPONENTS"):
        monkeypatch.setenv(key, env[key])
    with pytest.raises(command.error) as info:
        args = cli.parser().parse_args(list(command.args))
        args.func(args)
    assert type(info.value) is command.error


def test_cli_ctrl_c_exits_130_without_a_traceback(tree, monkeypatch, capsys):
    def interrupted(args: object) -> int:
        raise KeyboardInterrupt
    monkeypatch.setattr(cli, "cmd_schema", interrupted)
    assert cli.main(["schema"]) == 130
    assert capsys.readouterr().err == "pipelink: interrupted\n"


SCONS = [
    Command("scons_unknown_recipe", ("recipe=nope",), RecipeError,
            ("no recipe nope in recipes/", "recipes: r")),
    Command("scons_misspelt_recipe", ("recipe=rr",), RecipeError,
            ("no recipe rr in recipes/", "did you mean 'r'?")),
    Command("scons_binary_recipe", ("recipe=r",), RecipeError, (RECIPE, "binary file"),
            Case("", PipeLinkError, (), recipe=ELF_BYTES)),
    Command("scons_tab_in_recipe", ("recipe=r",), RecipeError, (f"{RECIPE}:4:1", "spaces"),
            Case("", PipeLinkError, (), recipe="recipe: r\narch: [sm_90a]\ninstances:\n"
                                               "\tload: loader\n")),
    Command("scons_wrong_arrow", ("recipe=r",), RecipeError,
            (RECIPE, "key 'connect[0]'", "producer.port -> consumer.port"),
            Case("", PipeLinkError, (), recipe=put("connect.0", "load.tiles => reduce.x"))),
    Command("scons_mode_unknown", ("recipe=r", "mode=fast"), PipeLinkError,
            ("pipelink: error:", "'mode': 'fast'", "dev", "scons -h lists the options")),
    Command("scons_verbose_not_a_bool", ("recipe=r", "VERBOSE=loud"), PipeLinkError,
            ("pipelink: error:", "'VERBOSE'", "'loud'")),
    Command("scons_arch_list_with_no_arch", ("recipe=r", "arch=sm_90a,sm_75"),
            PipeLinkError, ("arch=sm_90a,sm_75 names no arch sm_75", "sm_100a", "or all")),
    Command("scons_arch_empty", ("recipe=r", "arch="), PipeLinkError,
            ("arch= names no arch",)),
    # A list is read element by element: the toy recipe targets sm_90a alone.
    Command("scons_arch_list_not_targeted", ("recipe=r", "arch=sm_100a,sm_120a"),
            RecipeError, (f"{RECIPE}: arch", "does not target sm_100a")),
    Command("scons_arch_not_targeted", ("recipe=r", "arch=sm_100a"), RecipeError,
            (f"{RECIPE}: arch", "does not target sm_100a")),
    Command("scons_duplicate_key_in_contract", ("recipe=r",), ContractError,
            (f"{LOADER}:3:1", "key 'arch' appears twice"),
            Case("", PipeLinkError, (), loader="component: loader\narch: [sm_90a]\n"
                                               "arch: [sm_100a]\n")),
]


@pytest.mark.parametrize("command", SCONS, ids=lambda c: c.id)
def test_scons_refuses_bad_input_in_one_message(tree, command):
    env = _command_tree(tree, command)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copy(ROOT / "SConstruct", tree.root)
    shutil.copytree(ROOT / "site_scons", tree.root / "site_scons", ignore=ignore)
    shutil.copytree(ROOT / "pipelink", tree.root / "pipelink", ignore=ignore)
    before = _files(tree.root)
    env["PIPELINK_CACHE"] = str(tree.root.parent / f"{tree.root.name}-cache")
    del env["PIPELINK_COMPONENTS"]
    proc = subprocess.run([sys.executable, "-m", "SCons", "-Q", "-C", str(tree.root),
                           *command.args], env=env, capture_output=True, text=True,
                          timeout=300)
    _one_message(proc, command.must)
    after = {k: v for k, v in _files(tree.root).items()
             if not k.startswith(".sconsign") and "__pycache__" not in k}
    assert after == {k: v for k, v in before.items() if "__pycache__" not in k}


def test_the_corpus_is_long_enough():
    assert len(CASES) + len(CLI) + len(SCONS) >= 120
    ids = [c.id for c in CASES] + [c.id for c in CLI] + [c.id for c in SCONS]
    assert len(set(ids)) == len(ids)


@pytest.mark.parametrize("with_index", [True, False], ids=["index", "object_only"])
def test_placing_objects_names_the_contract_file_the_user_edits(tree, with_index):
    """Objects carry their contract; a placing error about one names the contract.yaml it
    was built from when the index finds it unchanged, else the object and its component."""
    from pipelink.link import bound_from_objects
    from pipelink.objfile import unpack
    tree.toy()
    recipe_data = toy_recipe()
    recipe_data["instances"]["load"] = {"component": "loader", "tunables": {"stages": 8},
                                        "params": {"cols": 256}}
    recipe_data["instances"]["reduce"] = {"component": "reducer", "params": {"cols": 256}}
    recipe = load_recipe(tree.recipe(recipe_data))
    objects = {}
    for inst, bound in tree.bind(recipe, "sm_90a").items():
        path = tree.root / "obj" / f"{bound.name}.sm_90a.o"
        data = pack(bound, "sm_90a", b"ltoir", source_sha256="0" * 64,
                    toolchain={"nvcc": "13.0", "nvjitlink": "13.0"})
        objects[inst] = unpack(data, str(path))
    bound = bound_from_objects(objects, tree.index if with_index else None)
    with pytest.raises(DemandsDoNotFit) as info:
        place(check(recipe, "sm_90a", bound).problem)
    text = str(info.value)
    if with_index:
        assert str(tree.root / LOADER) + ": smem.tiles" in text
        assert "embedded contract" not in text
    else:
        assert "obj/loader.sm_90a.o (embedded contract of 'loader'): smem.tiles" in text


def test_a_command_run_outside_the_project_says_where_it_looked(tmp_path, monkeypatch,
                                                                 capsys):
    """Run away from components/, every component was "unknown" with "known components:
    none (searched components)": the message now says what to change."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PIPELINK_COMPONENTS", raising=False)
    Tree(tmp_path).recipe(toy_recipe())
    assert cli.main(["check", "recipes/r.yaml", "--arch", "sm_90a"]) == cli.EXIT_USER
    err = capsys.readouterr().err
    assert "recipes/r.yaml: instances.load: unknown component 'loader'" in err, err
    assert f"no components at all under {tmp_path.resolve() / 'components'}" in err, err
    assert "run from the folder that holds components/, or set PIPELINK_COMPONENTS" in err
