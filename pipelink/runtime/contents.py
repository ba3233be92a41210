"""Checks on the values of small index tensors (launch.contents), before a launch.

A kernel can bound what it reads by a tensor's shape, but not by its values: offsets
that run backwards, or a page index past the cache, make it compute on the wrong
rows. The recipe states the rule (``cu_seqlens: {ordered: true, first: 0, last: T}``,
``block_table: {min: 0, max: NB - 1}``); the runtime checks it on the device with a
few tensor operations and one synchronisation per call, and refuses the call naming
the tensor, the entry and the rule. An op can skip them (``op.check_contents =
False``) where the caller vouches for its indices and the synchronisation matters; a
call made while a CUDA graph is being captured skips them (it cannot synchronise).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import RuntimeLaunchError

RULES = ("ordered", "first", "last", "min", "max")


@dataclass(frozen=True)
class ContentRule:
    tensor: str
    ordered: bool = False        # non-decreasing along the flattened tensor
    first: Any = None            # size expression the first entry equals
    last: Any = None             # ... the last entry
    min: Any = None              # every entry >= this
    max: Any = None              # every entry <= this

    @classmethod
    def from_spec(cls, tensor: str, spec: Mapping[str, Any]) -> ContentRule:
        return cls(tensor, bool(spec.get("ordered", False)), spec.get("first"),
                   spec.get("last"), spec.get("min"), spec.get("max"))


def check(rules: tuple[ContentRule, ...], tensors: Mapping[str, Any],
          sizes: Mapping[str, Any], evaluate: Any) -> None:
    """Every rule against its tensor: all conditions reduced on the device, one
    synchronisation, and on a failure the first offending entry found and named."""
    import torch
    if not rules or _capturing(torch):
        return
    bounds = {r.tensor: {k: evaluate(getattr(r, k), sizes, f"contents.{r.tensor}.{k}")
                         for k in ("first", "last", "min", "max") if getattr(r, k) is not None}
              for r in rules}
    verdicts = [_holds(tensors[r.tensor].reshape(-1), r, bounds[r.tensor]) for r in rules]
    if bool(torch.stack(verdicts).all()):
        return
    for rule, ok in zip(rules, verdicts, strict=True):
        if not bool(ok):
            raise _refusal(tensors[rule.tensor].reshape(-1), rule, bounds[rule.tensor])


def _capturing(torch: Any) -> bool:
    """A CUDA graph is being captured on the current stream (never on a CPU-only build)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _holds(flat: Any, rule: ContentRule, bounds: Mapping[str, int]) -> Any:
    import torch
    ok = torch.ones((), dtype=torch.bool, device=flat.device)
    if flat.numel() == 0:
        return ok
    if rule.ordered and flat.numel() > 1:
        ok = ok & (flat[1:] >= flat[:-1]).all()
    if "first" in bounds:
        ok = ok & (flat[0] == bounds["first"])
    if "last" in bounds:
        ok = ok & (flat[-1] == bounds["last"])
    if "min" in bounds:
        ok = ok & (flat >= bounds["min"]).all()
    if "max" in bounds:
        ok = ok & (flat <= bounds["max"]).all()
    return ok


def _refusal(flat: Any, rule: ContentRule, bounds: Mapping[str, int]) -> RuntimeLaunchError:
    """The error for the first entry that breaks the rule (read back on the host)."""
    values = flat.tolist()
    what = f"tensor '{rule.tensor}'"
    where = f"kernel.json launch.contents.{rule.tensor}"
    if rule.ordered:
        for i in range(1, len(values)):
            if values[i] < values[i - 1]:
                return RuntimeLaunchError(
                    f"{what} must not decrease, but entry {i} is {values[i]} after "
                    f"{values[i - 1]}", where=where,
                    hint="pass offsets in order (e.g. a cumsum of non-negative lengths)")
    for key, index in (("first", 0), ("last", len(values) - 1)):
        if key in bounds and values and values[index] != bounds[key]:
            return RuntimeLaunchError(
                f"{what}: its {key} entry must be {bounds[key]} ({getattr(rule, key)}), "
                f"got {values[index]}", where=where,
                hint="offsets start at 0 and end at the number of rows")
    for i, v in enumerate(values):
        if "min" in bounds and v < bounds["min"] or "max" in bounds and v > bounds["max"]:
            low, high = bounds.get("min", "-inf"), bounds.get("max", "inf")
            return RuntimeLaunchError(
                f"{what}: entry {i} is {v}, outside [{low}, {high}] "
                f"({rule.min if rule.min is not None else ''} .. "
                f"{rule.max if rule.max is not None else ''})", where=where,
                hint="every index must name an existing row or block")
    return RuntimeLaunchError(f"{what} breaks launch.contents", where=where)
