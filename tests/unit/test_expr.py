"""The contract expression language: what it computes, what it refuses, and that it
never reaches Python's eval."""

from __future__ import annotations

import ast
import builtins
import re

import pytest

from pipelink import expr
from pipelink.errors import ContractError

ENV = {"rows": 128, "cols": 64, "stages": 4, "dtype": "bf16", "wide": "f32", "zero": 0,
       "neg": -3, "flag": True}

EVALUATES = [
    ("42", 42),
    (42, 42),
    ("rows", 128),
    ("rows*cols", 8192),
    ("stages*rows*cols*sizeof(dtype)", 65536),
    ("rows*cols*sizeof(wide)", 32768),
    ("sizeof(bf16) + sizeof(e4m3) + sizeof(f32)", 7),
    ("rows // 32", 4),
    ("7 // 2", 3),
    ("-7 // 2", -4),
    ("rows % 48", 32),
    ("2**10", 1024),
    ("2**63 + (2**63 - 1)", 2**64 - 1),
    ("-rows", -128),
    ("+rows", 128),
    ("neg * neg", 9),
    ("(rows + cols) * 2", 384),
    ("min(rows, cols, 100)", 64),
    ("max(rows, cols)", 128),
    ("ceil_div(rows, 48)", 3),
    ("ceil_div(96, 48)", 2),
    ("align_up(100, 64)", 128),
    ("align_up(128, 64)", 128),
    ("pow2_ceil(192)", 256),
    ("pow2_ceil(128)", 128),
    ("pow2_ceil(1)", 1),
    ("  rows  ", 128),
    ("rows if dtype == 'bf16' else cols", 128),
    ("rows if dtype != 'bf16' else cols", 64),
    ("1 if rows == 128 else 2", 1),
    ("2 * (rows if dtype == 'f16' else 3)", 6),
]


@pytest.mark.parametrize(("text", "value"), EVALUATES, ids=[str(t) for t, _ in EVALUATES])
def test_evaluates(text, value):
    assert expr.evaluate(text, ENV, where="c.yaml: smem.a.bytes") == value


REFUSED = [
    # (text, substring of the message)
    ("rows.bit_length()", "'Call' is not allowed"),
    ("rows.real", "'Attribute' is not allowed"),
    ("__import__('os').system('true')", "'Call' is not allowed"),
    ("open('/etc/passwd')", "unknown function 'open'"),
    ("eval('1')", "unknown function 'eval'"),
    ("min(rows, key=abs)", "'Call' is not allowed"),
    ("(lambda: 1)()", "'Call' is not allowed"),
    ("lambda: 1", "'Lambda' is not allowed"),
    ("[rows][0]", "'Subscript' is not allowed"),
    ("rows if stages else cols", "a choice tests one == or != comparison"),
    ("rows if rows < cols else cols", "'Lt' is not allowed"),
    ("rows if 1 == rows == 1 else cols", "a choice tests one == or != comparison"),
    ("rows if dtype == 2 else cols", "compare a word with an integer"),
    ("rows if dtype != 'bf16' else 'x'", "literal 'x' is not an integer"),
    ("rows and cols", "'BoolOp' is not allowed"),
    ("not rows", "is not allowed"),
    ("~rows", "is not allowed"),
    ("rows / 2", "operator 'Div' is not allowed"),
    ("rows << 2", "operator 'LShift' is not allowed"),
    ("rows & 2", "operator 'BitAnd' is not allowed"),
    ("1.5", "literal 1.5 is not an integer"),
    ("'abc'", "literal 'abc' is not an integer"),
    ("True", "literal True is not an integer"),
    ("rowz", "unbound name 'rowz'"),
    ("dtype * 2", "'dtype' is 'bf16', not an integer"),
    ("flag + 1", "'flag' is True, not an integer"),
    ("rows // zero", "division by zero"),
    ("rows % zero", "division by zero"),
    ("ceil_div(rows, 0)", "ceil_div takes two arguments, the second non-zero"),
    ("align_up(rows)", "align_up takes two arguments"),
    ("pow2_ceil(0)", "pow2_ceil takes one argument of at least 1"),
    ("pow2_ceil(rows, cols)", "pow2_ceil takes one argument of at least 1"),
    ("min()", "min() needs arguments"),
    ("sizeof(rows)", "sizeof(rows): 128 is not a dtype"),
    ("sizeof(bf17)", "sizeof(bf17): 'bf17' is not a dtype"),
    ("sizeof(dtype, wide)", "sizeof takes one dtype name"),
    ("2**65", "exponent 65 out of range 0..64"),
    ("2**-1", "exponent -1 out of range 0..64"),
    ("9**9**9", "exponent 387420489 out of range"),
    ("(2**60)**60", "out of the 64-bit range"),
    ("rows**64", "out of the 64-bit range"),
    ("2**64", "out of the 64-bit range"),
    ("18446744073709551616", "out of the 64-bit range"),
    ("rows*rows*rows*rows*rows*rows*rows*rows*rows*rows", "out of the 64-bit range"),
    ("rows*", "cannot parse expression 'rows*'"),
    ("", "cannot parse expression"),
    ("1 +" + " 1 +" * 300 + " 1", "characters is longer than 500"),
    ("(" * 201 + "1" + ")" * 201, "cannot parse expression"),
]


@pytest.mark.parametrize(("text", "message"), REFUSED, ids=[t[:40] for t, _ in REFUSED])
def test_refuses(text, message):
    with pytest.raises(ContractError) as info:
        expr.evaluate(text, ENV, where="comp/contract.yaml: smem.a.bytes")
    assert message in str(info.value)
    assert str(info.value).startswith("comp/contract.yaml: smem.a.bytes: ")


def test_an_unbound_name_names_what_is_bound_not_where_to_declare_it():
    """The evaluator does not know whether its field may read tunables (a named barrier's
    when may not): the hint names what is bound, and the closest of it."""
    with pytest.raises(ContractError) as info:
        expr.evaluate("rowz == 128", {"rows": 128}, where="c.yaml: named_barriers.b.when",
                      condition=True)
    assert info.value.hint == "did you mean 'rows'? names bound here: rows"


@pytest.mark.parametrize("value", [True, None, 1.5, [1], {"a": 1}, 2**64])
def test_refuses_values_that_are_not_expressions(value):
    with pytest.raises(ContractError, match="smem.a.bytes"):
        expr.evaluate(value, ENV, where="c.yaml: smem.a.bytes")


@pytest.mark.parametrize(("text", "message"), [
    (text, message) for text, message in REFUSED
    if not any(s in message for s in ("unbound", "not an integer", "division", "not a dtype",
                                      "64-bit", "exponent", "takes two", "takes one",
                                      "needs arguments", "compare a word",
                                      "'Call' is not allowed"))])
def test_names_refuses_the_same_syntax_at_load_time(text, message):
    """What evaluation would refuse whatever the params are, loading refuses already."""
    with pytest.raises(ContractError, match="c.yaml: ports.a.count"):
        expr.names(text, where="c.yaml: ports.a.count")


@pytest.mark.parametrize(("text", "message"), [
    ("pow2_ceil(M)", "contract function pow2_ceil() is not allowed"),
    ("M * sizeof(bf16)", "contract function sizeof() is not allowed"),
    ("M if M == 1 else 2", "a choice (a if p == 'word' else b) is not allowed"),
    ("ceil_div(M)", "ceil_div() takes 2 arguments, given 1"),
    ("align_up(M, 16, 2)", "align_up() takes 2 arguments, given 3"),
    ("min()", "min() takes 1 or more arguments, given 0"),
    ("ceil_div(M, 0)", "division by zero"),
    ("align_up(M, 4 - 4)", "division by zero"),
    ("M // (2 * 0)", "division by zero"),
    ("M % 0", "division by zero"),
    ("M ** -1", "negative exponent -1"),
    ("M ** 99999999", "exponent 99999999 out of range 0..64"),
])
def test_host_names_refuses_what_the_host_cannot_evaluate(text, message):
    """A launch expression the runtime would fail on at every call (or never compute)
    is refused when the recipe is checked."""
    with pytest.raises(ContractError, match=re.escape(message)) as info:
        expr.host_names(text, where="r.yaml: launch.bind.a.b")
    assert "r.yaml: launch.bind.a.b" in str(info.value)


@pytest.mark.parametrize(("text", "message"), [
    ("M +", "cannot parse expression"), ("foo(M)", "unknown function 'foo'"),
    ("M.real", "'Attribute' is not allowed")])
def test_host_names_hints_at_launch_forms_only(text, message):
    """A launch expression that does not parse is told what a launch takes, not the
    contract's sizeof, pow2_ceil and choices, which it would refuse next."""
    with pytest.raises(ContractError, match=re.escape(message)) as info:
        expr.host_names(text, where="r.yaml: launch.grid[0]")
    assert info.value.where == "r.yaml: launch.grid[0]"
    assert "min/max/ceil_div/align_up" in info.value.hint
    assert "sizeof" not in info.value.hint and "pow2_ceil" not in info.value.hint


@pytest.mark.parametrize(("text", "names"), [
    ("ceil_div(M, 128) * align_up(N, 8)", {"M", "N"}), ("max(M, 8, K) % N", {"M", "K", "N"}),
    ("M ** 2 // (K - 1)", {"M", "K"}), (7, set())])
def test_host_names_reads_what_the_host_evaluates(text, names):
    assert expr.host_names(text) == names


@pytest.mark.parametrize(("text", "names", "sizeofs"), [
    ("stages*rows*cols*sizeof(dtype)", {"stages", "rows", "cols"}, {"dtype"}),
    ("min(rows, cols) + max(a, b)", {"rows", "cols", "a", "b"}, set()),
    ("ceil_div(rows, 32) * sizeof(bf16)", {"rows"}, {"bf16"}),
    ("min", {"min"}, set()),
    (64, set(), set()),
])
def test_names_and_sizeof_names(text, names, sizeofs):
    assert expr.names(text) == names
    assert expr.sizeof_names(text) == sizeofs


# A condition (a named barrier's when): one == or != comparison, worth 1 or 0.
CONDITIONS = [
    ("rows == 128", 1),
    ("rows == 192", 0),
    ("rows != 192", 1),
    ("rows // 2 == cols", 1),
    ("dtype == 'bf16'", 1),
    ("dtype != 'bf16'", 0),
    ("(rows if dtype == 'bf16' else cols) == 64", 0),
]

CONDITIONS_REFUSED = [
    # (value, substring of the message)
    ("rows", "'rows' is not a condition"),
    ("rows * 2", "is not a condition"),
    ("rows >= 128", "is not a condition"),
    ("rows == 128 == rows", "is not a condition"),
    ("1 if rows == 128 else 0", "is not a condition"),
    ("(rows == 128) == 1", "a comparison is a value only as a choice's test"),
    ("rows == 'bf16' + 1", "not an integer"),
    ("rows ==", "cannot parse"),
    (1, "expected a condition, got 1"),
    (True, "expected a condition, got True"),
]


@pytest.mark.parametrize(("text", "value"), CONDITIONS, ids=[t for t, _ in CONDITIONS])
def test_a_condition_is_one_or_zero(text, value):
    assert expr.evaluate(text, ENV, where="c.yaml: named_barriers.b.when",
                         condition=True) == value
    assert expr.names(text, condition=True) <= set(ENV)


@pytest.mark.parametrize(("value", "message"), CONDITIONS_REFUSED,
                         ids=[str(t) for t, _ in CONDITIONS_REFUSED])
def test_a_condition_is_one_comparison_and_nothing_else(value, message):
    for check in (lambda: expr.names(value, where="c.yaml: named_barriers.b.when",
                                     condition=True),
                  lambda: expr.evaluate(value, ENV, where="c.yaml: named_barriers.b.when",
                                        condition=True)):
        with pytest.raises(ContractError, match="c.yaml: named_barriers.b.when") as info:
            check()
        assert message in str(info.value)


def test_a_size_is_never_a_comparison():
    """Outside a condition a comparison is still only a choice's test."""
    with pytest.raises(ContractError, match="only as a choice's test"):
        expr.evaluate("rows == 128", ENV)
    with pytest.raises(ContractError, match="only as a choice's test"):
        expr.names("rows == 128")


@pytest.mark.parametrize("depth", [50, 150, 249])
def test_deep_nesting_evaluates_or_is_refused_never_overflows(depth):
    for text in ("-" * (2 * depth) + "1", "(" * min(depth, 199) + "1" + ")" * min(depth, 199),
                 "+".join(["1"] * depth)):
        try:
            value = expr.evaluate(text, ENV, where="c.yaml: k")
        except ContractError as exc:
            assert "c.yaml: k" in str(exc)
        else:
            assert value in (1, depth)


@pytest.mark.parametrize("depth", [50, 150, 249])
def test_a_deeply_nested_condition_evaluates_or_is_refused(depth):
    for text in ("-" * (2 * depth) + "1 == 1", "(" * min(depth, 199) + "1" + ")" * min(depth, 199)
                 + " == 1"):
        try:
            value = expr.evaluate(text, ENV, where="c.yaml: k", condition=True)
        except ContractError as exc:
            assert "c.yaml: k" in str(exc)
        else:
            assert value == 1


def test_never_calls_eval_or_exec(monkeypatch):
    """ast.parse compiles to a syntax tree only; nothing may compile to code or run it."""
    real_compile = builtins.compile

    def forbidden(*args, **kwargs):
        raise AssertionError("expressions must never reach eval or exec")

    def tree_only(source, filename, mode, flags=0, *args, **kwargs):
        assert flags & ast.PyCF_ONLY_AST, "expressions may be parsed, never compiled to code"
        return real_compile(source, filename, mode, flags, *args, **kwargs)

    monkeypatch.setattr(builtins, "eval", forbidden)
    monkeypatch.setattr(builtins, "exec", forbidden)
    monkeypatch.setattr(builtins, "compile", tree_only)
    for text, value in EVALUATES:
        assert expr.evaluate(text, ENV) == value
    for text, _ in REFUSED:
        with pytest.raises(ContractError):
            expr.evaluate(text, ENV)
