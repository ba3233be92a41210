"""The recipe's ``launch:`` section as kernel.json carries it, and what follows from it
for one set of input shapes: sizes, output shapes, grid, scalar arguments, and which
tensor feeds which kernel argument (so each tensor gets the checks its argument needs).

Shape expressions are evaluated with plain Python operators, so the same code serves
real shapes and PyTorch's symbolic ones (``torch.compile`` traces output shapes through
:func:`output_shapes`).
"""

from __future__ import annotations

import ast
import functools
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import expr
from ..errors import PipeLinkError, RuntimeLaunchError
from .contents import ContentRule
from .tensors import torch_name

_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
}


# The host sizes (check.HOST_SIZES) of an H100 SXM, for what asks no GPU: tools, tests,
# `pipelink dispatch`. An H200 has as many SMs and a larger L2. A loaded op reads its
# device's instead.
H100_HOST_SIZES = {"num_sms": 132, "l2_bytes": 50 * 1024 * 1024}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    shape: tuple[Any, ...]          # int or expression text per dimension
    inplace: str | None = None      # outputs: the input this output is written over
    writes: bool = False            # inputs: the kernel writes into it


@dataclass(frozen=True)
class LaunchSpec:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    bind: dict[str, Any]            # instance.arg -> tensor name or size expression
    grid: tuple[Any, ...]
    persistent: bool
    # tensor name -> the kernel fields it is passed as
    fields_of: dict[str, tuple[dict[str, Any], ...]] = field(default_factory=dict)
    cluster: tuple[int, int, int] = (1, 1, 1)   # compiled in (__cluster_dims__)
    require: tuple[str, ...] = ()               # conditions on sizes, checked per call
    # keyword integer arguments of the op (name, default), in name order: sizes too
    scalar_inputs: tuple[tuple[str, int], ...] = ()
    # rules on the values of index tensors, checked on the device per call
    contents: tuple[ContentRule, ...] = ()

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> LaunchSpec:
        launch = meta.get("launch") or {}

        def specs(key: str) -> tuple[TensorSpec, ...]:
            return tuple(TensorSpec(s["name"], s["dtype"], tuple(s["shape"]), s.get("inplace"),
                                    bool(s.get("writes")))
                         for s in launch.get(key, []))
        inputs, outputs = specs("inputs"), specs("outputs")
        names = {s.name for s in (*inputs, *outputs)}
        by_arg = {f"{f['instance']}.{f['arg']}": f for f in meta["params"]["fields"]
                  if f["instance"] is not None}
        fields_of: dict[str, list[dict[str, Any]]] = {}
        for arg, value in launch.get("bind", {}).items():
            if isinstance(value, str) and value in names and arg in by_arg:
                fields_of.setdefault(value, []).append(by_arg[arg])
        return cls(inputs, outputs, dict(launch.get("bind", {})),
                   tuple(launch.get("grid", [1])), bool(launch.get("persistent")),
                   {k: tuple(v) for k, v in fields_of.items()},
                   tuple((list(meta.get("cluster") or [1, 1, 1]) + [1, 1])[:3]),
                   tuple(launch.get("require", [])),
                   tuple(sorted((n, int(v)) for n, v in (launch.get("scalars") or {}).items())),
                   tuple(ContentRule.from_spec(n, r)
                         for n, r in sorted((launch.get("contents") or {}).items())))

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.inputs)

    @property
    def scalar_names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.scalar_inputs)

    def scalar_values(self, given: Mapping[str, Any]) -> tuple[Any, ...]:
        """The op's keyword scalars in name order, defaults filled in; an unknown name
        or a value that is not an integer is refused (bounds are launch.require's)."""
        unknown = sorted(set(given) - set(self.scalar_names))
        if unknown:
            takes = ", ".join(f"{n}={d}" for n, d in self.scalar_inputs)
            raise RuntimeLaunchError(f"unknown keyword argument(s) {unknown}",
                                     hint=f"keyword scalars: {takes}" if takes else
                                     "this op takes tensors only (and out=, stream=)")
        values = []
        for name, default in self.scalar_inputs:
            value = given.get(name, default)
            if isinstance(value, bool) or not _is_int(value):
                raise RuntimeLaunchError(f"scalar '{name}' takes an integer, got {value!r}")
            values.append(value)
        return tuple(values)

    def trailing_scalars(self, values: tuple[Any, ...]) -> tuple[Any, ...]:
        """Scalars as the dispatcher hands them to a kernel, by position: it drops
        trailing arguments equal to their defaults, which are filled back in here."""
        return (*values, *(d for _, d in self.scalar_inputs[len(values):]))

    @property
    def tensor_names(self) -> set[str]:
        return {s.name for s in (*self.inputs, *self.outputs)}

    def sizes(self, shapes: Mapping[str, tuple[Any, ...]], dtypes: Mapping[str, str],
              extra: Mapping[str, int] | None = None) -> dict[str, Any]:
        """Binds each size name to the first input dimension that names it, then
        checks every input's rank, dtype and shape against its spec."""
        sizes: dict[str, Any] = dict(extra or {})
        for spec in self.inputs:
            shape = shapes[spec.name]
            if len(shape) != len(spec.shape):
                raise RuntimeLaunchError(f"input '{spec.name}' has {len(shape)} dimensions "
                                         f"{list(shape)}, expected {len(spec.shape)}: "
                                         f"{list(spec.shape)}")
            if dtypes[spec.name] != spec.dtype:
                raise RuntimeLaunchError(f"input '{spec.name}' is {dtypes[spec.name]}, "
                                         f"expected {spec.dtype}",
                                         hint=f"convert it (.to({torch_name(spec.dtype)}))")
            for dim, want in zip(shape, spec.shape, strict=True):
                if isinstance(want, str) and want.isidentifier() and want not in sizes:
                    sizes[want] = dim
        for spec in self.inputs:
            actual = list(shapes[spec.name])
            wanted = [evaluate(d, sizes, f"inputs.{spec.name}") for d in spec.shape]
            if actual != wanted:
                raise RuntimeLaunchError(f"input '{spec.name}' has shape {actual}, expected "
                                         f"{wanted} from {list(spec.shape)}")
        self.check_require(sizes)
        return sizes

    def check_require(self, sizes: Mapping[str, Any]) -> None:
        """Every launch.require condition holds for these sizes (what the kernel was
        built for: a table's capacity, an alignment), or the call is refused naming it."""
        for i, condition in enumerate(self.require):
            left, op, right = expr.comparison(condition, where=f"launch.require[{i}]")
            a = evaluate(left, sizes, f"require[{i}]")
            b = evaluate(right, sizes, f"require[{i}]")
            if not expr.COMPARE[op](a, b):
                used = sorted((expr.names(left) | expr.names(right)) & set(sizes))
                here = ", ".join(f"{n} = {sizes[n]}" for n in used) or f"{a} {op} {b} is false"
                raise RuntimeLaunchError(
                    f"the kernel requires {condition}, but here {here}",
                    where=f"kernel.json launch.require[{i}]",
                    hint="the objects were built for this bound: change the inputs, or "
                         "rebuild with larger params")

    def output_shapes(self, sizes: Mapping[str, Any]) -> dict[str, list[Any]]:
        return {o.name: [evaluate(d, sizes, f"outputs.{o.name}") for d in o.shape]
                for o in self.outputs}

    def grid_for(self, sizes: Mapping[str, Any], num_sms: int) -> list[int]:
        """The launch grid; a clustered kernel's is a whole number of clusters (a
        persistent one rounds the SM count down, a sized one rounds up: the schedulers
        end extra CTAs at once)."""
        if self.persistent:
            return [max(num_sms // self.cluster[0], 1) * self.cluster[0]]
        grid = [evaluate(g, sizes, "grid") for g in self.grid]
        return [-(-int(g) // c) * c if isinstance(g, int) else g
                for g, c in zip(grid, self.cluster, strict=False)]

    def scalars(self, sizes: Mapping[str, Any]) -> dict[str, int]:
        return {k: evaluate(v, sizes, f"bind.{k}") for k, v in self.bind.items()
                if not (isinstance(v, str) and v in self.tensor_names)}


def _is_int(value: Any) -> bool:
    """An int, or an integer PyTorch symbol (torch.compile traces scalars as SymInt)."""
    return isinstance(value, int) or type(value).__name__ == "SymInt"


def evaluate(text: Any, sizes: Mapping[str, Any], key: str) -> Any:
    """A launch expression over sizes, with Python operators (so symbolic sizes work)."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    return _function(str(text), key)(sizes)


def condition(text: str, key: str) -> Callable[[Mapping[str, Any]], Any]:
    """A condition ('M <= 512') as a function of the sizes, parsed once. Calling it runs
    plain Python operators only, so torch.compile traces it where it could not trace
    the parser (symbolic sizes become guards)."""
    try:
        left, op, right = expr.comparison(text, where=key)
    except PipeLinkError as exc:
        raise RuntimeLaunchError(exc.message, where=exc.where, hint=exc.hint) from None
    lhs, rhs, compare = _function(left, key), _function(right, key), expr.COMPARE[op]
    return lambda sizes: compare(lhs(sizes), rhs(sizes))


@functools.lru_cache(maxsize=1024)
def _function(text: str, key: str) -> Callable[[Mapping[str, Any]], Any]:
    """``text`` (an expression :func:`expr.names` accepts) as a function of the sizes."""
    try:
        expr.host_names(text, where=f"kernel.json launch.{key}")  # what check refuses
        return _Build(text, key).visit(ast.parse(text.strip(), mode="eval").body)
    except PipeLinkError as exc:
        raise RuntimeLaunchError(exc.message, where=exc.where, hint=exc.hint) from None


class _Build(ast.NodeVisitor):
    """An expression's tree as nested closures over the sizes."""

    def __init__(self, text: str, key: str) -> None:
        self.text, self.key = text, key

    def generic_visit(self, node: ast.AST) -> Any:
        raise RuntimeLaunchError(f"cannot evaluate {self.text!r}", where=f"launch.{self.key}")

    def visit_Constant(self, node: ast.Constant) -> Callable[[Mapping[str, Any]], Any]:
        value = node.value
        return lambda sizes: value

    def visit_Name(self, node: ast.Name) -> Callable[[Mapping[str, Any]], Any]:
        name, text, key = node.id, self.text, self.key

        def size(sizes: Mapping[str, Any]) -> Any:
            if name not in sizes:
                raise RuntimeLaunchError(f"launch.{key}: {text!r} names '{name}', which no "
                                         "input dimension defines",
                                         hint="known sizes: " + ", ".join(sorted(sizes)))
            return sizes[name]
        return size

    def visit_UnaryOp(self, node: ast.UnaryOp) -> Callable[[Mapping[str, Any]], Any]:
        operand = self.visit(node.operand)
        if isinstance(node.op, ast.USub):
            return lambda sizes: -operand(sizes)
        return operand

    def visit_BinOp(self, node: ast.BinOp) -> Callable[[Mapping[str, Any]], Any]:
        left, right = self.visit(node.left), self.visit(node.right)
        op = operator.pow if isinstance(node.op, ast.Pow) else _BINOPS[type(node.op)]
        divides = isinstance(node.op, (ast.FloorDiv, ast.Mod))
        text, key = self.text, self.key

        def apply(sizes: Mapping[str, Any]) -> Any:
            a, b = left(sizes), right(sizes)
            if divides and isinstance(b, int) and b == 0:
                raise RuntimeLaunchError(f"launch.{key}: division by zero in {text!r}")
            return op(a, b)
        return apply

    def visit_Call(self, node: ast.Call) -> Callable[[Mapping[str, Any]], Any]:
        args = [self.visit(a) for a in node.args]
        name = node.func.id if isinstance(node.func, ast.Name) else ""
        if name in ("ceil_div", "align_up"):
            text, key, up = self.text, self.key, name == "align_up"

            def divide(sizes: Mapping[str, Any]) -> Any:
                step = args[1](sizes)
                if isinstance(step, int) and step == 0:
                    raise RuntimeLaunchError(f"launch.{key}: division by zero in {text!r}")
                quotient = -(-args[0](sizes) // step)
                return quotient * step if up else quotient
            return divide
        if name in ("min", "max"):
            pick = _sym(name)
            return lambda sizes: functools.reduce(pick, [a(sizes) for a in args])
        return self.generic_visit(node)


def _sym(name: str) -> Callable[..., Any]:
    """min/max that keep PyTorch symbolic sizes symbolic where torch is loaded."""
    try:
        import torch
        return getattr(torch, f"sym_{name}")
    except (ImportError, AttributeError):
        return {"min": min, "max": max}[name]

