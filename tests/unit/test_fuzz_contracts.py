"""Fuzzing the contract path: whatever a contract says, loading it, binding it and
generating its header either work or raise a PipeLinkError, never anything else.

Three sources of input: arbitrary nested data (keys mostly drawn from the schema's own
vocabulary, so the walk gets past the top level), random edits of contracts that fit
(a key replaced, dropped or added at any depth), and random expression text in the
fields that take expressions.
"""

from __future__ import annotations

import copy
import os
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelink import header
from pipelink.contract import contract_from_data
from pipelink.errors import PipeLinkError
from pipelink.schema import CONTRACT_SCHEMA, PORT

from ..conftest import consumer, epilogue, producer

# PIPELINK_FUZZ_EXAMPLES=5000 for a longer hunt; 300 keeps the suite fast.
FUZZ = settings(max_examples=int(os.environ.get("PIPELINK_FUZZ_EXAMPLES", "300")),
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# Keys the schema knows, so random mappings often look like contracts.
VOCABULARY = sorted({*CONTRACT_SCHEMA["properties"], *PORT["properties"], "warps", "registers",
                     "uses", "bytes", "align", "count", "threads", "fixed", "live", "columns",
                     "values", "name", "type", "box", "swizzle", "x", "tiles", "rows", "cols",
                     "stages", "dtype", "full", "empty", "producer", "reduce"})
WORDS = ["sm_90a", "sm_100a", "bf16", "f32", "e4m3", "in", "out", "smem_pipeline", "registers",
         "global", "row_major", "stages", "rows", "cols", "dtype", "args.k_tiles", "tma",
         "wgmma", "u32", "ptr", "tensormap", "scheduler", "stage", "loader\n", ""]

# What yaml.safe_load can hand over: also bytes (!!binary) and dates, and any of these
# as mapping keys.
scalars = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.integers(-3, 300)
           | st.floats(allow_nan=True) | st.text(max_size=12) | st.sampled_from(WORDS)
           | st.binary(max_size=4) | st.dates())
keys = (st.sampled_from(VOCABULARY) | st.text(max_size=8) | st.integers(-2, 2) | st.none()
        | st.booleans() | st.floats(allow_nan=False) | st.dates())
data = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(keys, inner, max_size=6), max_leaves=30)

# Expression-like text: names, operators, calls, and a few things that must be refused.
EXPR_TOKENS = ["rows", "cols", "stages", "dtype", "sizeof(dtype)", "sizeof(rows)", "min(",
               "max(", "ceil_div(", "align_up(", ",", ")", "(", "+", "-", "*", "//", "%", "**",
               "/", "0", "1", "2", "64", "99999999999", " ", ".real", "[0]", "lambda:", "if",
               "__import__('os')", "1.5", "not", "<", "'s'", "x", "rows.bit_length()"]
expressions = st.lists(st.sampled_from(EXPR_TOKENS), min_size=1, max_size=12).map("".join)

# Fields of the valid contracts that hold an expression.
EXPR_FIELDS = [("loader", "smem.tiles.bytes"), ("loader", "ports.tiles.tx_bytes"),
               ("loader", "mbarriers.full"), ("loader", "ports.tiles.stages"),
               ("loader", "roles.producer.warps"), ("loader", "args.0.box.0"),
               ("reducer", "ports.x.arrivals"), ("reducer", "ports.x.shape.1"),
               ("reducer", "ports.acc.count"), ("reducer", "roles.reduce.registers"),
               ("store", "named_barriers.done.threads"), ("store", "ports.acc.count")]
BASES = {"loader": producer, "reducer": consumer, "store": epilogue}


def exercise(contract: Any, overrides: Any = None) -> None:
    """Load, bind and generate a header; only PipeLinkError may escape."""
    try:
        c = contract_from_data(contract, "fuzz/contract.yaml")
        bound = c.bind(overrides)
        text = header.generate(bound)
    except PipeLinkError:
        return
    assert f"struct pl_place_{bound.name}_" in text


def _slots(node: Any) -> list[tuple[Any, Any]]:
    """(container, key) of every value in a nested structure, at every depth."""
    items = (list(node.items()) if isinstance(node, dict)
             else list(enumerate(node)) if isinstance(node, list) else [])
    out = []
    for key, value in items:
        out.append((node, key))
        out += _slots(value)
    return out


# Edits: mostly plausible values, so many edited contracts still load and reach the
# header generator; sometimes anything at all.
plausible = st.sampled_from(WORDS) | st.integers(-3, 300) | expressions | data


@st.composite
def edited_contracts(draw: st.DrawFn) -> dict[str, Any]:
    """A fitting contract with one to three edits, each at a uniformly chosen place."""
    contract = copy.deepcopy(BASES[draw(st.sampled_from(sorted(BASES)))]())
    for _ in range(draw(st.integers(1, 3))):
        slots = _slots(contract)
        if not slots:
            break
        parent, key = draw(st.sampled_from(slots))
        action = draw(st.sampled_from(["replace", "replace", "drop", "add"]))
        if action == "replace":
            parent[key] = draw(plausible)
        elif action == "drop":
            del parent[key]
        elif isinstance(parent, dict):
            parent[draw(keys)] = draw(plausible)
        else:
            parent.append(draw(plausible))
    return contract


@FUZZ
@given(data)
def test_arbitrary_data_is_refused_or_accepted_cleanly(value):
    exercise(value)


@FUZZ
@given(edited_contracts(), st.none() | st.dictionaries(
    st.sampled_from(["rows", "cols", "dtype", "nope"]),
    st.integers(-5, 5000) | st.sampled_from(["bf16", "f32", "bf17", "a\"b", ""]), max_size=3)
    | data)
def test_edited_contracts_are_refused_or_accepted_cleanly(contract, overrides):
    exercise(contract, overrides)


@FUZZ
@given(st.sampled_from(EXPR_FIELDS), expressions)
def test_random_expressions_are_refused_or_accepted_cleanly(field, text):
    name, path = field
    contract = BASES[name]()
    node: Any = contract
    parts = [int(p) if p.isdigit() else p for p in path.split(".")]
    for p in parts[:-1]:
        node = node[p]
    node[parts[-1]] = text
    exercise(contract)
