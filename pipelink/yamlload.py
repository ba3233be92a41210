"""The one YAML reader for contracts and recipes: bounded, strict and short-spoken.

:func:`read_yaml` refuses, with an error naming the file (and line and column where
there is one), what PyYAML alone would turn into a traceback, a hang or a silent
surprise: files over :data:`MAX_BYTES`, binary or non-UTF-8 bytes, nesting deeper than
:data:`MAX_DEPTH`, aliases that expand past :data:`MAX_NODES` nodes (billion laughs) or
into themselves, and a key written twice in one mapping. A tab where YAML wants
indentation gets a "use spaces" hint. Dates stay strings: no contract or recipe field
is a date, and PyYAML's date parser raises plain ``ValueError`` on ``2024-13-01``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

MAX_BYTES = 1 << 20       # a contract or recipe is a few KiB; 1 MiB is generous
MAX_DEPTH = 64            # the deepest real contract nests 5 levels
MAX_NODES = 200_000       # nodes after expanding every alias
MAX_SHOWN = 160           # characters of user data quoted back in one message

_TIMESTAMP = "tag:yaml.org,2002:timestamp"
_MERGE = "tag:yaml.org,2002:merge"


def clip(text: str, limit: int = MAX_SHOWN) -> str:
    """``text`` cut to ``limit`` characters, saying how much was left out."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit} more)"


# What PyYAML's own constructors raise on some tagged values (!!int '', !!timestamp '').
_CONSTRUCTOR_FAILURES = (ValueError, IndexError, OverflowError, TypeError, AttributeError,
                         KeyError)


class _Refused(yaml.YAMLError):
    def __init__(self, problem: str, mark: yaml.Mark | None, hint: str | None = None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.problem_mark = mark
        self.hint = hint


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that counts depth and alias-expanded nodes while composing (before any
    Python object exists) and refuses duplicate keys while constructing."""

    yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag != _TIMESTAMP]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0
        self._open: list[str] = []            # anchors of collections still composing
        self._sizes: dict[int, int] = {}      # id(node) -> values it expands to

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in self._open:
                raise _Refused(f"alias *{clip(event.anchor, 40)} refers to a value that "
                               "contains it", event.start_mark, "write the value out instead")
            node = super().compose_node(parent, index)
            self._count(self._sizes.get(id(node), 1), event.start_mark)
            return node
        if self._depth >= MAX_DEPTH:
            raise _Refused(f"nested more than {MAX_DEPTH} levels deep", event.start_mark,
                           "contracts and recipes nest a few levels; check the brackets")
        before = self._nodes
        self._count(1, event.start_mark)
        self._depth += 1
        self._open.append(event.anchor)
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
            self._open.pop()
        self._sizes[id(node)] = self._nodes - before
        return node

    def _count(self, nodes: int, mark: yaml.Mark) -> None:
        self._nodes += nodes
        if self._nodes > MAX_NODES:
            raise _Refused(f"expands to more than {MAX_NODES} values", mark,
                           "aliases (*name) may repeat a value, not multiply it; "
                           "write the values out")

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep=deep)
        except yaml.YAMLError:
            raise
        except _CONSTRUCTOR_FAILURES as exc:
            tag = node.tag.replace("tag:yaml.org,2002:", "!!")
            raise _Refused(f"cannot read {clip(repr(node.value), 40)} as {tag}: "
                           f"{clip(str(exc) or type(exc).__name__, 60)}", node.start_mark,
                           "check the tagged (!!) and numeric values") from None

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, yaml.Mark] = {}
        if isinstance(node, yaml.MappingNode):
            for key_node, _ in node.value:
                if key_node.tag == _MERGE:
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:
                    continue   # unhashable: the base constructor names it
                if first is not None:
                    raise _Refused(
                        f"key {clip(repr(key), 60)} appears twice in one mapping (first at "
                        f"line {first.line + 1})", key_node.start_mark,
                        "remove one of them: YAML would silently keep the last")
                seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


def parse_yaml(text: str, where: str, error: type[Exception]) -> Any:
    """YAML text to data within the bounds above; ``error`` names ``where`` (file:line:col)."""
    loader = None
    try:
        loader = _BoundedLoader(text)   # the reader refuses control characters here
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"{where}:{mark.line + 1}:{mark.column + 1}" if mark else where
        problem = getattr(exc, "problem", None) or str(exc)
        context = getattr(exc, "context", None)   # "while parsing a flow sequence", ...
        if context and not isinstance(exc, _Refused):
            problem = f"{context}: {problem}" if context.startswith("while") \
                else f"{context} {problem}"
        hint = getattr(exc, "hint", None)
        if "'\\t'" in problem or (mark is not None and _tab_at(text, mark)):
            hint = "YAML indents with spaces: replace the tab with spaces"
        raise error(f"malformed YAML: {clip(problem)}", where=at, hint=hint) from None
    except _CONSTRUCTOR_FAILURES as exc:
        # PyYAML's own constructors fail this way on tagged values: !!int 0x, !!int ''
        raise error(f"malformed YAML: a value cannot be read ({clip(str(exc) or 'empty')})",
                    where=where, hint="check the tagged (!!) and numeric values") from None
    finally:
        if loader is not None:
            loader.dispose()


def _tab_at(text: str, mark: yaml.Mark) -> bool:
    lines = text.splitlines()
    return mark.line < len(lines) and "\t" in lines[mark.line][:mark.column + 1]


def read_yaml(path: Path, error: type[Exception]) -> Any:
    """YAML from ``path``: at most :data:`MAX_BYTES` of UTF-8 text, else ``error``."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise error(f"cannot read: {exc.strerror}", where=str(path)) from None
    if len(raw) > MAX_BYTES:
        raise error(f"larger than {MAX_BYTES} bytes; not a contract or recipe",
                    where=str(path), hint="point at the YAML file itself")
    if b"\0" in raw:
        raise error("binary file, not YAML text", where=str(path),
                    hint="point at the YAML file itself")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise error(f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})",
                    where=str(path), hint="save the file as UTF-8") from None
    return parse_yaml(text, str(path), error)
