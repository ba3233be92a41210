"""JSON Schemas of contracts and recipes: the one definition of what a file may say.

Validation (jsonschema) and the generated contract reference (docs/contract-reference.md,
``pipelink schema --markdown``) both read these dicts, so the docs cannot drift.
"""

from __future__ import annotations

import re
from typing import Any

import jsonschema

from .interfaces import INTERFACES
from .work import RECORDS

# Names become file names and symbols (<recipe>.cubin and its temporary beside it,
# pl_<recipe>_<kernel>, <component>-<hash>.<arch>.o): far below 255 bytes.
MAX_NAME = 64
IDENT = {"type": "string", "pattern": "^[a-z_][a-z0-9_]*$", "maxLength": MAX_NAME}
ARCHS = ["sm_90a", "sm_100a", "sm_120a"]
DTYPES = ["f32", "tf32", "bf16", "f16", "e4m3", "e5m2", "i32", "u32", "i8", "u8"]
C_IDENT = {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"}
PARAM_STRING = {"type": "string", "pattern": "^[A-Za-z0-9_.+-]+$",
                "description": "a dtype, or a word the source reads as a C string"}
EXPR = {"description": "integer, or an integer expression over params and tunables",
        "oneOf": [{"type": "integer"}, {"type": "string", "minLength": 1}]}
DTYPE_REF = {"type": "string", "pattern": "^[a-z_][a-z0-9_]*$",
             "description": "a dtype (" + ", ".join(DTYPES) + ") or a param naming one"}
LIVE = {"description": "[first, last) phase indices of the recipe's phases; default: all",
        "type": "array", "items": {"type": "integer", "minimum": 0},
        "minItems": 2, "maxItems": 2}


def _obj(props: dict[str, Any], required: list[str] | None = None,
         description: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "properties": props,
                           "additionalProperties": False}
    if required:
        out["required"] = required
    if description:
        out["description"] = description
    return out


def _map(value: dict[str, Any], description: str) -> dict[str, Any]:
    return {"type": "object", "description": description,
            "propertyNames": IDENT, "additionalProperties": value}


PORT = _obj({
    "dir": {"enum": ["in", "out"], "description": "out: this component produces"},
    "kind": {"enum": ["smem_pipeline", "tmem", "registers", "global", "work", "function"],
             "description": "smem_pipeline: staged buffers with full/empty mbarriers; "
                            "tmem: accumulator buffers in Tensor Memory (sm_100a) with "
                            "full/empty mbarriers, full completed by tcgen05.commit; "
                            "registers: a fragment handed over in the same warps; "
                            "global: a workspace slot with a release/acquire counter; "
                            "work: the kernel's work ring (a scheduler's records, read by "
                            "every looping role); function: device functions of an "
                            "interface, called (in) or provided (out), inlined across "
                            "objects by LTO"},
    "role": {**IDENT, "description": "the role whose entry sees this port (default: the only "
                                     "one; a work in port without one is read by every role)"},
    "dtype": {**DTYPE_REF, "description": DTYPE_REF["description"] + " (every kind "
                                                                     "but work)"},
    "record": {"oneOf": [{"enum": sorted(RECORDS)},
                         {"type": "array", "items": {"enum": sorted(RECORDS)}, "minItems": 1,
                          "uniqueItems": True}],
               "description": "work: the record type (defined in pipelink/types.cuh); an in "
                              "port may list every type it handles"},
    "interface": {"enum": sorted(INTERFACES),
                  "description": "function: the interface (pipelink/interfaces.py) whose "
                                 "functions this port calls (in) or defines (out)"},
    "fields": {"type": "array", "items": IDENT, "minItems": 1, "uniqueItems": True,
               "description": "work in: the record fields this role reads, instead of "
                              "naming a record type"},
    "shape": {"type": "array", "items": EXPR, "minItems": 1, "maxItems": 4,
              "description": "tile shape of one stage (smem_pipeline, global); work: the "
                             "tile whose partials split_tile pieces exchange"},
    "layout": {"type": "string", "description": "row_major, col_major, sw128_kmajor, "
                                                "or a named fragment layout"},
    "count": {**EXPR, "description": "registers: elements per thread"},
    "stages": {**EXPR, "description": "smem_pipeline, tmem, work out: ring depth"},
    "buffer": {**IDENT, "description": "out smem_pipeline: the smem entry holding the stages; "
                                       "out tmem: the tmem entry holding the buffers"},
    "full": {**IDENT, "description": "out smem_pipeline/tmem: the mbarrier array signalling "
                                     "full"},
    "empty": {**IDENT, "description": "out smem_pipeline/tmem: the mbarrier array signalling "
                                      "empty"},
    "arrivals": {**EXPR, "description": "arrivals per stage this side makes (out: on full, "
                                        "in: on empty)"},
    "consumer_arrivals": {**EXPR, "description": "out: arrivals on empty this producer "
                                                 "expects from all consumers together"},
    "tx_bytes": {**EXPR, "description": "bytes a TMA lands per stage (expect_tx)"},
    "multicast": {**EXPR, "description": "smem_pipeline: the CTAs of the cluster that fill each "
                                         "stage together by TMA multicast (default 1); the "
                                         "readers of each release it in all; both ends agree"},
    "cta_group": {**EXPR, "description": "tmem: 2 when the buffers are a CTA pair's (a "
                                         "cta_group::2 MMA): the readers of both CTAs "
                                         "release the leader's buffer; both ends agree"},
    "per_tile": {"description": "stages handed over per work tile: an expression, "
                                "'args.NAME' for a runtime argument, or 'work' for the "
                                "record's k range (k_end - k_begin)",
                 "oneOf": [{"type": "integer"}, {"type": "string"}]},
    "slots": {**EXPR, "description": "global: number of slots in the workspace"},
    "readers": {**EXPR, "description": "global in: publishes a consumer waits for per slot"},
}, ["dir", "kind"])

ARG = _obj({
    "name": {**IDENT, "description": "the field's name in the pl_args_<component> struct"},
    "type": {"enum": ["u32", "i32", "u64", "f32", "ptr", "tensormap"],
             "description": "ptr: a global pointer to dtype; tensormap: a TMA descriptor the "
                            "host builds, seen as const pl::TensorMap*"},
    "dtype": {**DTYPE_REF, "description": "ptr/tensormap: element type (or a param)"},
    "box": {"type": "array", "items": EXPR, "description": "tensormap: box (inner first)"},
    "swizzle": {**EXPR, "description": "tensormap: swizzle bytes, 0, 32, 64 or 128 (or an "
                                       "expression over params: a store whose staging rows "
                                       "narrow with a param)"},
    "align": {"enum": [1, 2, 4, 8, 16], "description": "ptr: byte alignment the code needs "
                                                      "of the address (default 16)"},
    "max": {**EXPR, "description": "u32/i32: the largest value the code handles (an "
                                   "expression over params, e.g. a param that sizes a "
                                   "table); pipelink check refuses a larger literal bind, "
                                   "the runtime a larger value"},
    "description": {"type": "string", "description": "free text (shape, units)"},
}, ["name", "type"])

CONTRACT_SCHEMA: dict[str, Any] = _obj({
    "component": {**IDENT,
                  "description": "the component's name; entries are pl_<component>_<role>"},
    "kind": {"enum": ["stage", "scheduler", "function"],
             "description": "scheduler: produces the kernel's work records (a work out "
                            "port); function: runs in no warps of its own, only provides "
                            "device functions (function out ports) that LTO inlines into "
                            "their callers"},
    "description": {"type": "string", "description": "free text: what the component does"},
    "arch": {"type": "array", "items": {"enum": ARCHS}, "minItems": 1, "uniqueItems": True,
             "description": "the archs the component compiles for"},
    "source": {"type": "string", "description": "source file (default <component>.cu)"},
    "sources": {"type": "object", "propertyNames": {"enum": ARCHS},
                "additionalProperties": {"type": "string"},
                "description": "per-arch source overrides"},
    "includes": {"type": "array", "items": {"enum": ["cutlass"]},
                 "description": "extra header sets (cutlass: the nvidia-cutlass wheel)"},
    "params": _map({"oneOf": [{"type": "integer"}, PARAM_STRING]},
                   "compile-time parameters and their defaults: one object per value set"),
    "tunables": _map({"oneOf": [
        {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2},
        _obj({"values": {"type": "array", "items": {"type": "integer"}, "minItems": 1}},
             ["values"])]}, "link-time choices: [min, max] or {values: [...]}"),
    "requires": {"type": "array", "items": _obj({
        "check": {"type": "string", "minLength": 1,
                  "description": "one comparison of two integer expressions over params "
                                 "(< <= > >= == !=), e.g. head_dim % 64 == 0; a word param "
                                 "against a quoted word (dtype == 'bf16'); or "
                                 "'expression in (a, b, ...)'"},
        "why": {"type": "string", "minLength": 1,
                "description": "what the code needs, shown when a recipe's params break "
                               "the rule"}}, ["check", "why"]),
        "description": "rules the params must keep: checked when a recipe (or pipelink "
                       "compile) binds them, before anything compiles"},
    "roles": _map(_obj({
        "warps": EXPR,
        "registers": {**EXPR, "description": "registers per thread this role needs"},
        "uses": {"type": "array",
                 "items": {"enum": ["wgmma", "setmaxnreg", "tma", "umma", "tcgen05",
                                    "tmem_load", "tmem_alloc"]},
                 "description": "wgmma/setmaxnreg/umma/tmem_load make the role "
                                "warpgroup-aligned (tmem_load: its warps read Tensor Memory "
                                "lanes by warp % 4); tcgen05: one warp issues tcgen05 MMAs; "
                                "tmem_alloc: the role's first warp allocates and frees the "
                                "kernel's Tensor Memory"},
        "entry": {**C_IDENT, "description": "the role's entry (default pl_<component>_<role>)"},
        "init": {"type": "boolean", "description": "declare pl_<c>_<role>_init, run once"},
        "tail": {"type": "boolean", "description": "declare pl_<c>_<role>_tail, run once"},
        "state": {"type": "array", "items": IDENT, "uniqueItems": True,
                  "description": "rings between this component's own roles (e.g. Tensor "
                                 "Memory buffers an MMA warp and its softmax warps hand each "
                                 "other): a pl::PipeState each in the role's state, kept by "
                                 "the glue across records like a port's"},
    }, ["warps"]), "warp roles this component runs"),
    "smem": _map(_obj({"bytes": EXPR, "align": EXPR, "live": LIVE}, ["bytes"]),
                 "shared-memory buffers"),
    "mbarriers": _map({"oneOf": [EXPR, _obj({"count": EXPR, "arrivals": EXPR, "live": LIVE},
                                            ["count"])]},
                      "mbarrier arrays: count, or {count, arrivals}"),
    "named_barriers": _map(_obj({
        "threads": EXPR,
        "fixed": {"type": "integer", "minimum": 1, "maximum": 15,
                  "description": "a hard-coded id (third-party code); omit to let the "
                                 "linker place it"},
        "live": LIVE,
        "when": {"type": "string", "minLength": 1,
                 "description": "a condition over params (one == or != comparison, e.g. "
                                "tile_m == 192): where it is false the barrier is not "
                                "placed, and its at.bar field holds an id no barrier has"}},
        ["threads"]), "named barriers (bar.sync ids)"),
    "tmem": _map(_obj({"columns": EXPR,
                       "cta_group": {**EXPR, "description": "2: the allocation spans a CTA "
                                                           "pair (a cta_group::2 MMA's "
                                                           "accumulator); needs a cluster "
                                                           "of 2"}}, ["columns"]),
                 "Tensor Memory allocations (sm_100a)"),
    "static_smem": {**EXPR, "description": "bytes of static __shared__ variables the source "
                                           "declares (not placed, but counted against the "
                                           "block's limit; the linker checks the code)"},
    "scratch": _map(EXPR, "bytes of global workspace this component owns, not zeroed "
                          "(a split-K scheduler's partial tiles); the placement gives its "
                          "byte offset, at.scratch.<name>"),
    "counters": _map(EXPR, "uint32 counters in the global workspace, zeroed before every "
                           "launch (a dynamic scheduler's tile counter); the placement gives "
                           "each one's byte offset"),
    "cluster": {"type": "array", "items": EXPR, "minItems": 3, "maxItems": 3,
                "description": "the thread-block cluster shape [x, y, z] the component needs "
                               "(expressions over params, e.g. [cta_group, 1, 1])"},
    "ports": _map(PORT, "what this component consumes and produces"),
    "args": {"type": "array", "items": ARG, "description": "runtime arguments"},
}, ["component", "arch"])

CONNECTION = {"type": "string", "pattern": r"^[a-z_][a-z0-9_]*\.[a-z_][a-z0-9_]*\s*->\s*"
                                           r"[a-z_][a-z0-9_]*\.[a-z_][a-z0-9_]*$"}

TENSOR = _obj({
    "dtype": {"type": "string", "description": "element type: " + ", ".join(DTYPES)},
    "shape": {"type": "array", "items": {"oneOf": [{"type": "integer"}, {"type": "string"}]},
              "minItems": 1, "description": "sizes: a name binds a size on first use (inputs), "
                                           "an expression over the sizes elsewhere"},
}, ["dtype", "shape"])

INPUT_TENSOR = _obj({
    **TENSOR["properties"],
    "writes": {"type": "boolean",
               "description": "the kernel writes into this input (a gradient kernel reusing "
                              "a forward output's memory, say): its torch op declares the "
                              "input mutated"},
}, ["dtype", "shape"])

LAUNCH = _obj(description="how the host launches the kernel", props={
    "grid": {"description": "host-side grid: integers or expressions over sizes",
             "type": "array", "items": {"oneOf": [{"type": "integer"}, {"type": "string"}]},
             "minItems": 1, "maxItems": 3},
    "persistent": {"type": "boolean",
                   "description": "grid = number of SMs (no grid: beside it)"},
    "cluster": {"type": "array", "items": {"type": "integer", "minimum": 1},
                "minItems": 3, "maxItems": 3,
                "description": "cluster shape [x, y, z], at most 8 CTAs in all (the "
                               "portable cluster size); components that state one agree"},
    "inputs": _map(INPUT_TENSOR, "call(x, w): the op's positional inputs, name -> {dtype, "
                                 "shape, writes}"),
    "scalars": {"type": "object",
                "propertyNames": {"type": "string", "pattern": r"^[A-Za-z_][A-Za-z0-9_]*$"},
                "additionalProperties": {"type": "integer"},
                "description": "call(x, w, k=6): the op's keyword integer arguments, name -> "
                               "default; each is a size that shapes, binds and require "
                               "may name (state its bounds under require)"},
    "outputs": _map(TENSOR, "allocated outputs: name -> {dtype, shape}"),
    "bind": {"type": "object", "description": "instance.arg -> a tensor's name or a host "
                                              "expression over sizes (and the host's "
                                              "num_sms, l2_bytes)"},
    "require": {"type": "array", "items": {"type": "string"},
                "description": "conditions on sizes every call must meet, each one "
                               "comparison ('E <= 64', 'D % 8 == 0'): a call that breaks "
                               "one is refused before launch, naming it"},
    "contents": _map(_obj({
        "ordered": {"type": "boolean", "description": "entries never decrease"},
        "first": {**EXPR, "description": "the first entry equals this size expression"},
        "last": {**EXPR, "description": "the last entry equals this size expression"},
        "min": {**EXPR, "description": "every entry is at least this"},
        "max": {**EXPR, "description": "every entry is at most this"},
    }, []), "rules on the values of index inputs (offsets, page tables), name -> rules: "
            "checked on the device before every launch (one synchronisation), a call that "
            "breaks one refused naming the entry"),
    "workspace": {"type": "string", "description": "reserved"},
})

INSTANCES = _map({"oneOf": [
    {"type": "string"},
    _obj({"component": {"type": "string", "description": "the component, for every arch"},
          "per_arch": {"type": "object", "propertyNames": {"enum": ARCHS},
                       "additionalProperties": {"type": "string"},
                       "description": "arch -> component, where an arch needs another"},
          "params": {"type": "object", "propertyNames": IDENT,
                     "additionalProperties": {"oneOf": [
                         {"type": "integer"}, PARAM_STRING,
                         {"type": "object", "propertyNames": {"enum": ARCHS}, "minProperties": 1,
                          "additionalProperties": {"oneOf": [{"type": "integer"}, PARAM_STRING]},
                          "description": "arch -> value, where the value differs per arch"}]},
                     "description": "compile-time params of the component; a value written "
                                    "{arch: value} differs per arch (an arch left out: that "
                                    "arch's component must not take the param, as where "
                                    "per_arch picks components with other params)"},
          "tunables": {"type": "object", "additionalProperties": {"oneOf": [
              {"type": "integer"},
              {"type": "array", "items": {"type": "integer"}}]},
              "description": "pins: tunable -> a value, or the values allowed"},
          "loop": {"enum": ["cooperative", "pingpong"],
                   "description": "how the warps of this instance's lane share work: "
                                  "cooperative (all of them on every record, the default) "
                                  "or pingpong (two teams of them on alternate records)"},
          "lane": {**IDENT, "description": "another instance of the kernel (one role) "
                                           "whose warps this one's role runs in, after it "
                                           "in the same loop, as if it handed it "
                                           "registers: two epilogues of one warpgroup, "
                                           "say, where a warpgroup each would not leave "
                                           "the others their registers"},
          })]}, "instance name -> component (or {component, per_arch, params})")

CONNECT = {"type": "array", "items": CONNECTION,
           "description": "'producer.port -> consumer.port'"}

PHASES = {**_map(_obj({
    "instances": {"type": "array", "items": IDENT, "minItems": 1, "uniqueItems": True,
                  "description": "the instances whose roles run in this phase"},
    "after": {"type": "array", "items": IDENT, "uniqueItems": True,
              "description": "phases every CTA must have finished, grid-wide, before any "
                             "CTA starts this one (their results are read here)"},
}, ["instances"], "one phase"), "phase name -> {instances, after}: the kernel's roles run "
                                "phase by phase on shared warps, in an order that puts each "
                                "phase after the ones it names"), "minProperties": 1}

KERNEL = _obj({"like": {**IDENT, "description": "another kernel of the recipe this one is "
                                                "written over (as extends: writes a recipe "
                                                "over its base): a variant in a few lines"},
               "instances": INSTANCES, "connect": CONNECT, "launch": LAUNCH, "phases": PHASES,
               "arch": {"type": "array", "items": {"enum": ARCHS}, "minItems": 1,
                        "uniqueItems": True,
                        "description": "the archs this kernel builds, some of the recipe's "
                                       "(default: all of them); e.g. a backward kernel whose "
                                       "components exist for sm_90a only"}},
              ["instances"], "one kernel: the keys a single-kernel recipe has at the top level")

# grad.<forward output> or <forward input or output>, '.T' for a transposed 2-D copy
GRAD_INPUT = {"type": "string", "pattern": r"^(grad\.)?[a-z_][a-z0-9_]*(\.T)?$",
              "description": "grad.<forward output>, or a forward input or output; "
                             "'.T' appended: a transposed contiguous copy of a 2-D tensor"}

AUTOGRAD = _obj({
    "forward": {**IDENT, "description": "the kernel op(*inputs) runs"},
    "grads": {**_map(_obj({
        "kernel": {**IDENT, "description": "the kernel computing this input's gradient"},
        "inputs": {"type": "array", "items": GRAD_INPUT, "minItems": 1,
                   "description": "the gradient kernel's launch inputs, in order"},
        "output": {**IDENT, "description": "the gradient kernel's output that is this "
                                           "gradient (needed when it has several: one "
                                           "launch then gives every gradient it lists)"},
    }, ["kernel", "inputs"]), "forward input -> how its gradient is computed"),
        "minProperties": 1},
    "returns": {"type": "array", "items": IDENT, "minItems": 1,
                "description": "the forward outputs the differentiable call returns "
                               "(default: all of them); the others are kept for the "
                               "backward"},
    "scratch": {"type": "array", "items": IDENT, "minItems": 1, "uniqueItems": True,
                "description": "kept forward outputs the gradient kernels may write into "
                               "(inputs marked writes:) and that are released once no "
                               "later gradient launch reads them: the backward then runs "
                               "once per forward"},
}, ["forward", "grads"], "a torch autograd op over the kernels (multi-kernel recipes)")

CONDITION = {"type": "string", "description": "one comparison of two size expressions, "
                                             "e.g. 'M <= 512'"}

DISPATCH = {"type": "array", "minItems": 2, "items": _obj({
    "kernel": {**IDENT, "description": "the kernel this entry runs"},
    "when": {"oneOf": [CONDITION, {"type": "array", "items": CONDITION, "minItems": 1}],
             "description": "conditions on the call's sizes, all of which must hold; the "
                            "last entry has none (it takes every other call)"},
}, ["kernel"]), "description": "one op over kernels of the same launch signature: a call "
                               "runs the first entry whose conditions hold (e.g. a tile "
                               "shape and schedule per range of M)"}

RECIPE_SCHEMA: dict[str, Any] = _obj({
    "recipe": {**IDENT, "description": "the recipe's name (the kernel's entry is pl_<recipe>, "
                                       "or pl_<recipe>_<kernel> under kernels:)"},
    "description": {"type": "string", "description": "free text: what the kernel computes"},
    "extends": {**IDENT, "description": "another recipe of the same folder this one is "
                                        "written over: its document, with this one's keys "
                                        "merged in (mappings key by key, a key set to "
                                        "~ removed, anything else replaced), e.g. one "
                                        "instance swapped"},
    "arch": {"type": "array", "items": {"enum": ARCHS}, "minItems": 1, "uniqueItems": True,
             "description": "the archs the recipe builds"},
    "constants": {"type": "object", "propertyNames": IDENT,
                  "additionalProperties": {"oneOf": [{"type": "integer"}, PARAM_STRING]},
                  "description": "name -> integer or word; `$name` anywhere in the recipe's "
                                 "values (params, binds, checks, shapes) reads it, so a "
                                 "recipe that extends this one changes a value in one place"},
    "phases": PHASES,
    "instances": INSTANCES,
    "connect": CONNECT,
    "launch": LAUNCH,
    "kernels": {**_map(KERNEL, "several kernels sharing components and objects: name -> "
                               "{instances, connect, launch}; instead of the top-level keys"),
                "minProperties": 1},
    "autograd": AUTOGRAD,
    "dispatch": DISPATCH,
    "objective": {"description": "what the placer optimises (default "
                                 "max_tunables_then_min_smem)", "oneOf": [
        {"enum": ["max_tunables_then_min_smem", "min_smem"]},
        _obj({"maximize": {"type": "array", "items": {"type": "string"},
                           "description": "instance.tunable names to maximise; the others "
                                          "are left to minimise shared memory"}})]},
}, ["recipe", "arch"])


def _full_pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Any:
    """Every ``pattern`` here matches the whole string: Python's ``$`` also matches
    before a trailing newline, which would let a name ending in one into generated C++."""
    del validator, schema
    if isinstance(instance, str) and not re.fullmatch(pattern, instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


Validator = jsonschema.validators.extend(jsonschema.Draft202012Validator,
                                         {"pattern": _full_pattern})


def markdown_reference(schema: dict[str, Any], title: str) -> str:
    """Renders a schema as a Markdown reference (one row per key, nested keys dotted,
    ``<name>`` for a key the author chooses, ``[]`` for a list's items)."""
    lines = [f"# {title}", "", "Generated from `pipelink/schema.py`; do not edit.", "",
             "| key | type | required | meaning |", "| --- | --- | --- | --- |"]
    _rows(schema, "", lines, set(schema.get("required", [])))
    return "\n".join(lines) + "\n"


def _type_of(node: dict[str, Any]) -> str:
    if "enum" in node:
        return " \\| ".join(f"`{v}`" for v in node["enum"])
    if "oneOf" in node:
        return " or ".join(_type_of(n) for n in node["oneOf"])
    kind = node.get("type", "any")
    if kind == "array" and "items" in node:
        return f"list of {_type_of(node['items'])}"
    if kind == "object" and "additionalProperties" in node \
            and isinstance(node["additionalProperties"], dict):
        return "map"
    return str(kind)


def _rows(node: dict[str, Any], prefix: str, lines: list[str], required: set[str]) -> None:
    for key, sub in node.get("properties", {}).items():
        path = f"{prefix}{key}"
        lines.append(f"| `{path}` | {_type_of(sub)} | {'yes' if key in required else ''} | "
                     f"{_cell(sub.get('description', ''))} |")
        _descend(sub, path, lines)


def _cell(text: str) -> str:
    """Table-cell text: a '|' would end the cell and '<name>' would vanish as HTML."""
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _descend(sub: dict[str, Any], path: str, lines: list[str]) -> None:
    if sub.get("type") == "object" and "properties" in sub:
        _rows(sub, path + ".", lines, set(sub.get("required", [])))
    for alt in sub.get("oneOf", []):
        if alt.get("type") == "object" and "properties" in alt:
            _rows(alt, path + ".", lines, set(alt.get("required", [])))
    extra = sub.get("additionalProperties")
    if isinstance(extra, dict) and extra.get("type") == "object":
        _rows(extra, path + ".<name>.", lines, set(extra.get("required", [])))
    elif isinstance(extra, dict) and "oneOf" in extra:
        for alt in extra["oneOf"]:
            if alt.get("type") == "object" and "properties" in alt:
                _rows(alt, path + ".<name>.", lines, set(alt.get("required", [])))
    items = sub.get("items")
    if isinstance(items, dict) and items.get("type") == "object":
        _rows(items, path + "[].", lines, set(items.get("required", [])))
