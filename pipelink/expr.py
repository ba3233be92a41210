"""Integer expressions over a component's params and tunables, evaluated safely.

Contracts write sizes such as ``stages*tile_m*tile_k*2``. They are parsed with
:mod:`ast` and only a small whitelist of nodes is walked: integer literals, names,
unary ``+ -``, ``+ - * // % **`` and calls to ``min``, ``max``, ``ceil_div``,
``align_up``, ``pow2_ceil`` and ``sizeof``, and one choice form, ``a if p == 'word' else b``, where
``p`` is a param holding a word (``==`` or ``!=`` against a quoted word or an integer):
a contract's sizes may follow a word param such as a loader's operand majorness.
A *condition* (``condition=True``: a named barrier's ``when``) is that comparison alone,
``tile_m == 192``, worth 1 or 0. Other comparisons, chained ones, attributes, subscripts and
lambdas are refused.
Nothing is ever passed to ``eval``. Values stay within 64 bits
(:data:`MAX_MAGNITUDE`) and expressions are short (:data:`MAX_EXPR_CHARS`), so no
contract can make the linker compute for long.
"""

from __future__ import annotations

import ast
import operator
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from .errors import ContractError, did_you_mean

# Bytes per element of each dtype a port or a param may name.
DTYPE_BYTES: dict[str, int] = {
    "f32": 4, "tf32": 4, "bf16": 2, "f16": 2, "e4m3": 1, "e5m2": 1,
    "i32": 4, "u32": 4, "i8": 1, "u8": 1,
}

_BINOPS: dict[type, Callable[[int, int], int]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _align_up(a: int, b: int) -> int:
    return _ceil_div(a, b) * b


def _pow2_ceil(a: int) -> int:
    """The least power of two >= a (Tensor Memory allocations and their strides)."""
    return 1 << max(a - 1, 0).bit_length()


_FUNCS: dict[str, Callable[..., int]] = {
    "min": min, "max": max, "ceil_div": _ceil_div, "align_up": _align_up,
    "pow2_ceil": _pow2_ceil,
}

Value = int | str

# Longest expression text accepted: contract sizes are a few names and operators.
MAX_EXPR_CHARS = 500
# Largest magnitude of any literal, name or intermediate result: sizes fit 64 bits.
MAX_MAGNITUDE = 2**64
MAX_EXPONENT = 64                   # a larger power of any size above 1 leaves 64 bits
_ALLOWED_NODES = (ast.Expression, ast.Constant, ast.Name, ast.Load, ast.BinOp, ast.UnaryOp,
                  ast.Call, ast.USub, ast.UAdd, ast.IfExp, ast.Compare, ast.Eq, ast.NotEq,
                  *_BINOPS)
_SYNTAX_HINT = ("use integers, names, + - * // % ** and "
                "min/max/ceil_div/align_up/pow2_ceil/sizeof, "
                "or a if p == 'word' else b")
_CONDITION_HINT = ("write one == or != comparison over params, e.g. tile_m == 192 "
                   "or dtype != 'f32'")


def names(text: str | int, *, where: str = "", condition: bool = False) -> set[str]:
    """The free names an expression (or, with ``condition``, a condition) reads, dtype
    names inside sizeof() excluded.

    Also refuses, naming ``where``, any syntax :func:`evaluate` would refuse whatever
    the names are bound to, so a contract fails when it is loaded, not when it is used.
    """
    if isinstance(text, int) and not isinstance(text, bool) and not condition:
        return set()
    tree = _parse_condition(text, where) if condition else _parse(text, where)
    for node in ast.walk(tree):
        _check_node(node, text, where)
    _check_choices(tree, text, where, condition=condition)
    found: set[str] = set()
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            skip.add(id(node.func))
            if node.func.id == "sizeof":
                skip.update(id(a) for a in node.args)
        if isinstance(node, ast.Name) and id(node) not in skip:
            found.add(node.id)
    return found


def _check_choices(tree: ast.Expression, text: object, where: str, *,
                   words: bool = True, condition: bool = False) -> None:
    """Comparisons only as a choice's test (or as the whole of a condition), quoted words
    only as a comparison's operand, whatever the names are bound to."""
    tests = {id(n.test) for n in ast.walk(tree) if isinstance(n, ast.IfExp)}
    if condition:
        tests.add(id(tree.body))
    operands = {id(o) for n in ast.walk(tree) if isinstance(n, ast.Compare)
                for o in (n.left, *n.comparators)}
    for node in ast.walk(tree):
        if isinstance(node, ast.IfExp) and not (isinstance(node.test, ast.Compare)
                                                and len(node.test.ops) == 1):
            raise ContractError(f"a choice tests one == or != comparison in expression "
                                f"{text!r}", where=where, hint="write a if p == 'word' else b")
        if isinstance(node, ast.Compare) and id(node) not in tests:
            raise ContractError(f"a comparison is a value only as a choice's test in "
                                f"expression {text!r}", where=where,
                                hint="write a if p == 'word' else b")
        if words and isinstance(node, ast.Constant) and type(node.value) is str \
                and id(node) not in operands:
            raise ContractError(f"literal {node.value!r} is not an integer in expression "
                                f"{text!r}", where=where,
                                hint="quoted words appear only in a choice's test: "
                                     "a if p == 'word' else b")


# What the host evaluates a launch expression with (pipelink.runtime.spec): sizes are
# integers, with no dtype to take sizeof of and no word to choose by. Function -> (least,
# most) arguments, None for any number.
HOST_FUNCS: dict[str, tuple[int, int | None]] = {
    "min": (1, None), "max": (1, None), "ceil_div": (2, 2), "align_up": (2, 2)}
_HOST_HINT = ("a launch expression uses integers, sizes, + - * // % ** and "
              "min/max/ceil_div/align_up")


def host_names(text: str | int, *, where: str = "") -> set[str]:
    """:func:`names` of a launch expression (a shape, bind, grid, condition or contents
    bound), also refusing what the host could never evaluate, whatever the sizes: a
    contract's own forms (sizeof, pow2_ceil, a choice), a call with the wrong number of
    arguments, and a division by, or a power of, a constant that fails every call."""
    try:
        found = names(text, where=where)
    except ContractError as exc:
        # names() hints at a contract's forms (sizeof, pow2_ceil, choices): the very
        # ones refused below, so a launch says what it takes instead.
        raise ContractError(exc.message, where=exc.where, hint=_HOST_HINT) from None
    if isinstance(text, int):
        return found

    def fail(message: str, hint: str = _HOST_HINT) -> ContractError:
        return ContractError(f"{message} in expression {text!r}", where=where, hint=hint)

    def constant_part(node: ast.AST) -> int | None:
        return constant(ast.unparse(node), where=where)

    for node in ast.walk(_parse(text, where)):
        if isinstance(node, (ast.IfExp, ast.Compare)):
            raise fail("a choice (a if p == 'word' else b) is not allowed",
                       "a choice tests a contract's word params, and a launch has none; "
                       + _HOST_HINT)
        divisor = None
        if isinstance(node, ast.Call):
            name = node.func.id
            if name not in HOST_FUNCS:
                raise fail(f"contract function {name}() is not allowed")
            least, most = HOST_FUNCS[name]
            if not least <= len(node.args) <= (most or len(node.args)):
                takes = f"{least}" if least == most else f"{least} or more"
                raise fail(f"{name}() takes {takes} arguments, given {len(node.args)},")
            if name in ("ceil_div", "align_up"):
                divisor = node.args[1]
        elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.FloorDiv, ast.Mod)):
            divisor = node.right
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            power = constant_part(node.right)
            if power is not None and power < 0:
                raise fail(f"negative exponent {power} (not an integer power)")
            if power is not None and power > MAX_EXPONENT:
                # Any size above 1 overflows 64 bits, and Python would spend minutes
                # (and gigabytes) on the power before the launch could refuse it.
                raise fail(f"exponent {power} out of range 0..{MAX_EXPONENT}")
        if divisor is not None and constant_part(divisor) == 0:
            raise fail("division by zero")
    return found


def constant(text: str | int, *, where: str = "") -> int | None:
    """The value of an expression that reads no name; None where it reads one."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    return None if names(text, where=where) else evaluate(text, {}, where=where)


def sizeof_names(text: str | int) -> set[str]:
    """The names inside sizeof(): each must be a dtype or a param naming one."""
    if isinstance(text, int):
        return set()
    return {node.args[0].id for node in ast.walk(_parse(text, ""))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "sizeof" and len(node.args) == 1
            and isinstance(node.args[0], ast.Name)}


def _check_node(node: ast.AST, text: object, where: str) -> None:
    def fail(message: str, hint: str = _SYNTAX_HINT) -> ContractError:
        return ContractError(f"{message} in expression {text!r}", where=where, hint=hint)
    if not isinstance(node, _ALLOWED_NODES):
        raise fail(f"'{type(node).__name__}' is not allowed")
    if isinstance(node, ast.Constant) and type(node.value) not in (int, str):
        raise fail(f"literal {node.value!r} is not an integer")
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.keywords:
            raise fail("only plain calls of min/max/ceil_div/align_up/pow2_ceil/sizeof "
                       "are allowed")
        if node.func.id not in _FUNCS and node.func.id != "sizeof":
            raise fail(f"unknown function '{node.func.id}'",
                       "available: " + ", ".join(sorted([*_FUNCS, "sizeof"])))
        if node.func.id == "sizeof" and (len(node.args) != 1
                                         or not isinstance(node.args[0], ast.Name)):
            raise fail("sizeof takes one dtype name")


def evaluate(text: str | int, env: Mapping[str, Value], *, where: str = "",
             condition: bool = False) -> int:
    """Evaluate ``text`` with names bound by ``env`` (a condition to 1 or 0); raise
    ContractError naming ``where`` on anything else (unbound names, division by zero, odd
    syntax)."""
    if isinstance(text, bool) and not condition:
        raise ContractError(f"expected an integer expression, got {text!r}", where=where)
    if isinstance(text, int) and not condition:
        if abs(text) >= MAX_MAGNITUDE:
            raise ContractError(f"{text} is out of the 64-bit range", where=where)
        return text
    try:
        tree = _parse_condition(text, where) if condition else _parse(text, where)
        # A quoted word fails where visited.
        _check_choices(tree, text, where, words=False, condition=condition)
        return _Evaluator(env, str(text), where).visit(tree.body)
    except RecursionError:
        raise ContractError(f"expression {text!r} is nested too deeply", where=where,
                            hint=_SYNTAX_HINT) from None


def _parse(text: object, where: str) -> ast.Expression:
    if not isinstance(text, str):
        raise ContractError(f"expected an integer expression, got {text!r}", where=where,
                            hint=_SYNTAX_HINT)
    if len(text) > MAX_EXPR_CHARS:
        raise ContractError(f"expression of {len(text)} characters is longer than "
                            f"{MAX_EXPR_CHARS}", where=where,
                            hint="name the parts as params, or compute the value")
    try:
        with warnings.catch_warnings():  # '1if x' warns before it fails: say it once, below
            warnings.simplefilter("ignore", SyntaxWarning)
            return ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise ContractError(f"cannot parse expression {text!r}: {exc.msg}", where=where,
                            hint=_SYNTAX_HINT) from None
    except (RecursionError, MemoryError, ValueError):  # nesting, or a 4300-digit literal
        raise ContractError(f"cannot parse expression {text!r}: too deep or too large",
                            where=where, hint=_SYNTAX_HINT) from None


def _parse_condition(text: object, where: str) -> ast.Expression:
    """A condition parsed: one == or != comparison, nothing around it."""
    if not isinstance(text, str):
        raise ContractError(f"expected a condition, got {text!r}", where=where,
                            hint=_CONDITION_HINT)
    tree = _parse(text, where)
    body = tree.body
    if not (isinstance(body, ast.Compare) and len(body.ops) == 1
            and isinstance(body.ops[0], (ast.Eq, ast.NotEq))):
        raise ContractError(f"{text!r} is not a condition", where=where,
                            hint=_CONDITION_HINT)
    return tree


class _Evaluator(ast.NodeVisitor):
    def __init__(self, env: Mapping[str, Value], text: str, where: str) -> None:
        self.env, self.text, self.where = env, text, where

    def fail(self, message: str, hint: str | None = None) -> ContractError:
        return ContractError(f"{message} in expression {self.text!r}", where=self.where,
                             hint=hint)

    def generic_visit(self, node: ast.AST) -> int:
        raise self.fail(f"'{type(node).__name__}' is not allowed", _SYNTAX_HINT)

    def bounded(self, value: int) -> int:
        if abs(value) >= MAX_MAGNITUDE:
            raise self.fail("value out of the 64-bit range",
                            "contract sizes are bytes, counts and ids: check the formula")
        return value

    def visit_Constant(self, node: ast.Constant) -> int:
        if type(node.value) is not int:
            raise self.fail(f"literal {node.value!r} is not an integer",
                            "quoted words appear only in a choice's test: "
                            "a if p == 'word' else b")
        return self.bounded(node.value)

    def visit_IfExp(self, node: ast.IfExp) -> int:
        return self.visit(node.body if self.visit(node.test) else node.orelse)

    def visit_Compare(self, node: ast.Compare) -> int:
        """1 or 0: a word param against a quoted word, or two integers."""
        if not isinstance(node.ops[0], (ast.Eq, ast.NotEq)):
            raise self.fail(f"'{type(node.ops[0]).__name__}' is not allowed", _SYNTAX_HINT)
        left, right = self._operand(node.left), self._operand(node.comparators[0])
        if type(left) is not type(right):
            raise self.fail(f"{left!r} and {right!r} compare a word with an integer")
        return int((left == right) == isinstance(node.ops[0], ast.Eq))

    def _operand(self, node: ast.AST) -> Value:
        if isinstance(node, ast.Constant) and type(node.value) is str:
            return node.value
        if isinstance(node, ast.Name) and isinstance(self.env.get(node.id), str):
            return self.env[node.id]
        return self.visit(node)

    def visit_Name(self, node: ast.Name) -> int:
        if node.id not in self.env:
            known = ", ".join(sorted(self.env)) or "none"
            # The field decides what it may read (some take params only): name what is
            # bound here rather than guess where the name should be declared.
            raise self.fail(f"unbound name '{node.id}'",
                            f"{did_you_mean(node.id, self.env)}names bound here: {known}")
        value = self.env[node.id]
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(f"'{node.id}' is {value!r}, not an integer",
                            f"use sizeof({node.id}) for the bytes of a dtype")
        return self.bounded(value)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> int:
        if isinstance(node.op, ast.USub):
            return -self.visit(node.operand)
        if isinstance(node.op, ast.UAdd):
            return self.visit(node.operand)
        return self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> int:
        op = _BINOPS.get(type(node.op))
        if op is None:
            raise self.fail(f"operator '{type(node.op).__name__}' is not allowed",
                            "integer arithmetic uses // for division")
        left, right = self.visit(node.left), self.visit(node.right)
        if isinstance(node.op, (ast.FloorDiv, ast.Mod)) and right == 0:
            raise self.fail("division by zero")
        if isinstance(node.op, ast.Pow) and (right < 0 or right > MAX_EXPONENT):
            raise self.fail(f"exponent {right} out of range 0..{MAX_EXPONENT}")
        if isinstance(node.op, ast.Pow) and abs(left) > 1 \
                and (abs(left).bit_length() - 1) * right > MAX_MAGNITUDE.bit_length():
            raise self.fail("value out of the 64-bit range",
                            "contract sizes are bytes, counts and ids: check the formula")
        return self.bounded(op(left, right))

    def visit_Call(self, node: ast.Call) -> int:
        if not isinstance(node.func, ast.Name) or node.keywords:
            return self.generic_visit(node)
        name = node.func.id
        if name == "sizeof":
            return self._sizeof(node)
        func = _FUNCS.get(name)
        if func is None:
            raise self.fail(f"unknown function '{name}'",
                            "available: " + ", ".join(sorted([*_FUNCS, "sizeof"])))
        args = [self.visit(a) for a in node.args]
        if name in ("ceil_div", "align_up") and (len(args) != 2 or args[1] == 0):
            raise self.fail(f"{name} takes two arguments, the second non-zero")
        if name == "pow2_ceil" and (len(args) != 1 or args[0] < 1):
            raise self.fail("pow2_ceil takes one argument of at least 1")
        if not args:
            raise self.fail(f"{name}() needs arguments")
        return self.bounded(func(*args))

    def _sizeof(self, node: ast.Call) -> int:
        if len(node.args) != 1 or not isinstance(node.args[0], ast.Name):
            raise self.fail("sizeof takes one dtype name")
        arg = node.args[0].id
        dtype = self.env.get(arg, arg)
        if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
            raise self.fail(f"sizeof({arg}): {dtype!r} is not a dtype",
                            "dtypes: " + ", ".join(DTYPE_BYTES))
        return DTYPE_BYTES[dtype]


COMPARISONS = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==",
               ast.NotEq: "!="}
# What each comparison :func:`comparison` returns computes (plain operators: symbolic
# sizes work).
COMPARE: dict[str, Callable[[Any, Any], Any]] = {
    "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
    "==": operator.eq, "!=": operator.ne}


def _requirement_parts(text: str, where: str) -> tuple[str, str, Any]:
    """(left, operator, right) of a contract's requirement on its params: ``left in (a,
    b, ...)`` over integer literals (right: their tuple); ``==`` or ``!=``, read whole as
    a condition (so a word param may meet a quoted word: ``dtype == 'bf16'``); or an
    ordering of two size expressions (``<= < >= >``)."""
    try:
        node = ast.parse(str(text).strip(), mode="eval").body
    except SyntaxError:
        node = None
    if (isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.In)
            and isinstance(node.comparators[0], (ast.Tuple, ast.List))):
        values = node.comparators[0].elts
        if values and all(isinstance(v, ast.Constant) and type(v.value) is int for v in values):
            return ast.unparse(node.left), "in", tuple(v.value for v in values)
    if not (isinstance(node, ast.Compare) and len(node.ops) == 1
            and type(node.ops[0]) in COMPARISONS):
        raise ContractError(f"cannot read requirement {text!r}", where=where or None,
                            hint="write one comparison, e.g. head_dim % 64 == 0, "
                                 "tile_m <= 256, dtype == 'bf16' or head_dim in (64, 128)")
    if isinstance(node.ops[0], (ast.Eq, ast.NotEq)):
        return str(text), COMPARISONS[type(node.ops[0])], None
    return comparison(text, where=where)


def requirement_names(text: str, *, where: str = "") -> set[str]:
    """The params a contract's requirement reads; refuses, naming ``where``, one that
    does not parse."""
    left, op, right = _requirement_parts(text, where)
    if op in ("==", "!="):
        return names(left, where=where, condition=True)
    return names(left, where=where) | (names(right, where=where) if op != "in" else set())


def holds(text: str, env: Mapping[str, Value], *, where: str = "") -> bool:
    """Whether a contract's requirement holds for the params in ``env``."""
    left, op, right = _requirement_parts(text, where)
    if op in ("==", "!="):
        return evaluate(left, env, where=where, condition=True) == 1
    value = evaluate(left, env, where=where)
    return value in right if op == "in" else COMPARE[op](value, evaluate(right, env, where=where))


def comparison(text: str, *, where: str = "") -> tuple[str, str, str]:
    """(left, operator, right) of a condition such as 'E <= 64'; each side is an
    expression :func:`names` accepts."""
    try:
        node = ast.parse(str(text).strip(), mode="eval").body
    except SyntaxError:
        node = None
    if not (isinstance(node, ast.Compare) and len(node.ops) == 1
            and type(node.ops[0]) in COMPARISONS):
        raise ContractError(f"cannot read condition {text!r}", where=where or None,
                            hint="write one comparison of two size expressions, e.g. "
                                 "'E <= 64' or 'D % 8 == 0'")
    left, right = ast.unparse(node.left), ast.unparse(node.comparators[0])
    names(left, where=where)
    names(right, where=where)
    return left, COMPARISONS[type(node.ops[0])], right
