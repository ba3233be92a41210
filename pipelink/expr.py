"""Integer expressions over a component's params and tunables, evaluated safely.

Contracts write sizes such as ``stages*tile_m*tile_k*2``. They are parsed with
:mod:`ast` and only a small whitelist of nodes is walked: integer literals, names,
``+ - * // % **``, comparisons-free ternaries are not allowed, and calls to
``min``, ``max``, ``ceil_div``, ``align_up`` and ``sizeof``. Nothing is ever passed
to ``eval``.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping

from .errors import ContractError

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


_FUNCS: dict[str, Callable[..., int]] = {
    "min": min, "max": max, "ceil_div": _ceil_div, "align_up": _align_up,
}

Value = int | str


def names(text: str | int) -> set[str]:
    """The free names an expression reads (dtype names inside sizeof() excluded)."""
    if isinstance(text, int):
        return set()
    tree = _parse(text, where="")
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id == "sizeof":
            continue
        if isinstance(node, ast.Name) and node.id not in _FUNCS and node.id != "sizeof":
            found.add(node.id)
    return found


def evaluate(text: str | int, env: Mapping[str, Value], *, where: str = "") -> int:
    """Evaluate ``text`` with names bound by ``env``; raise ContractError naming
    ``where`` on anything else (unbound names, division by zero, odd syntax)."""
    if isinstance(text, bool):
        raise ContractError(f"expected an integer expression, got {text!r}", where=where)
    if isinstance(text, int):
        return text
    return _Evaluator(env, text, where).visit(_parse(text, where).body)


def _parse(text: str, where: str) -> ast.Expression:
    try:
        return ast.parse(str(text), mode="eval")
    except SyntaxError as exc:
        raise ContractError(f"cannot parse expression {text!r}: {exc.msg}", where=where,
                            hint="use integers, names, + - * // % ** and "
                                 "min/max/ceil_div/align_up/sizeof") from None


class _Evaluator(ast.NodeVisitor):
    def __init__(self, env: Mapping[str, Value], text: str, where: str) -> None:
        self.env, self.text, self.where = env, text, where

    def fail(self, message: str, hint: str | None = None) -> ContractError:
        return ContractError(f"{message} in expression {self.text!r}", where=self.where,
                             hint=hint)

    def generic_visit(self, node: ast.AST) -> int:
        raise self.fail(f"'{type(node).__name__}' is not allowed",
                        "use integers, names, + - * // % ** and min/max/ceil_div/align_up/sizeof")

    def visit_Constant(self, node: ast.Constant) -> int:
        if type(node.value) is not int:
            raise self.fail(f"literal {node.value!r} is not an integer")
        return node.value

    def visit_Name(self, node: ast.Name) -> int:
        if node.id not in self.env:
            known = ", ".join(sorted(self.env)) or "none"
            raise self.fail(f"unbound name '{node.id}'",
                            f"declare '{node.id}' under params or tunables (known: {known})")
        value = self.env[node.id]
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(f"'{node.id}' is {value!r}, not an integer",
                            f"use sizeof({node.id}) for the bytes of a dtype")
        return value

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
        if isinstance(node.op, ast.Pow) and (right < 0 or right > 64):
            raise self.fail(f"exponent {right} out of range 0..64")
        return op(left, right)

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
        if not args:
            raise self.fail(f"{name}() needs arguments")
        return func(*args)

    def _sizeof(self, node: ast.Call) -> int:
        if len(node.args) != 1 or not isinstance(node.args[0], ast.Name):
            raise self.fail("sizeof takes one dtype name")
        arg = node.args[0].id
        dtype = self.env.get(arg, arg)
        if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
            raise self.fail(f"sizeof({arg}): {dtype!r} is not a dtype",
                            "dtypes: " + ", ".join(DTYPE_BYTES))
        return DTYPE_BYTES[dtype]
