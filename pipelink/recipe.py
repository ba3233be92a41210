"""Recipes: which components make a kernel, how their ports connect, how it launches.

A recipe is YAML under ``recipes/``, validated against
:data:`pipelink.schema.RECIPE_SCHEMA`; every error names the recipe file and key.
Components are found by name under the component search path (``components/``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .contract import Contract, load_contract, read_yaml, schema_error
from .errors import ContractError, RecipeError
from .schema import RECIPE_SCHEMA, Validator

_VALIDATOR = Validator(RECIPE_SCHEMA)
_CONNECTION = re.compile(r"^\s*(\w+)\.(\w+)\s*->\s*(\w+)\.(\w+)\s*$")


@dataclass(frozen=True)
class Endpoint:
    instance: str
    port: str

    def __str__(self) -> str:
        return f"{self.instance}.{self.port}"


@dataclass(frozen=True)
class Connection:
    src: Endpoint
    dst: Endpoint
    index: int                     # position under connect:, for messages

    @property
    def key(self) -> str:
        return f"connect[{self.index}]"


@dataclass(frozen=True)
class Instance:
    name: str
    component: str                 # for the arch being built
    params: dict[str, int | str]
    tunables: dict[str, Any]       # pins: value or list of allowed values


@dataclass(frozen=True)
class Recipe:
    name: str
    path: str
    data: dict[str, Any]
    connections: tuple[Connection, ...] = field(default_factory=tuple)

    @property
    def archs(self) -> tuple[str, ...]:
        return tuple(self.data["arch"])

    @property
    def phases(self) -> tuple[str, ...]:
        return tuple(self.data.get("phases", ["main"]))

    @property
    def launch(self) -> dict[str, Any]:
        return dict(self.data.get("launch", {}))

    def where(self, key: str) -> str:
        return f"{self.path}: {key}"

    def instances(self, arch: str) -> dict[str, Instance]:
        """Instances in recipe order, with the component chosen for ``arch``."""
        if arch not in self.archs:
            raise RecipeError(f"recipe '{self.name}' does not target {arch}",
                              where=self.where("arch"),
                              hint="its archs: " + ", ".join(self.archs))
        out = {}
        for name, spec in self.data["instances"].items():
            if isinstance(spec, str):
                out[name] = Instance(name, spec, {}, {})
                continue
            component = spec.get("per_arch", {}).get(arch) or spec.get("component")
            if not component:
                raise RecipeError(f"instance '{name}' names no component for {arch}",
                                  where=self.where(f"instances.{name}"),
                                  hint="add component: or per_arch: {" + arch + ": ...}")
            out[name] = Instance(name, component, dict(spec.get("params", {})),
                                 dict(spec.get("tunables", {})))
        return out


def load_recipe(path: Path | str) -> Recipe:
    path = Path(path)
    data = read_yaml(path, RecipeError)
    where = str(path)
    if not isinstance(data, dict):
        raise RecipeError("a recipe is a mapping (recipe:, arch:, instances:, connect:)",
                          where=where)
    schema_error(_VALIDATOR, data, where, RecipeError)
    connections = []
    for i, text in enumerate(data.get("connect", [])):
        m = _CONNECTION.match(text)
        if not m:  # the schema's pattern already refuses most of these
            raise RecipeError(f"cannot read connection {text!r}", where=f"{where}: connect[{i}]",
                              hint="write 'producer.port -> consumer.port'")
        connections.append(Connection(Endpoint(m[1], m[2]), Endpoint(m[3], m[4]), i))
    recipe = Recipe(data["recipe"], where, data, tuple(connections))
    for c in connections:
        for end in (c.src, c.dst):
            if end.instance not in data["instances"]:
                raise RecipeError(f"connection names instance '{end.instance}', which is not "
                                  "under instances", where=recipe.where(c.key),
                                  hint="instances: " + ", ".join(data["instances"]))
    return recipe


@dataclass(frozen=True)
class ComponentIndex:
    """Finds components by name: ``<root>/<name>/contract.yaml`` for each root."""

    roots: tuple[Path, ...]

    def path(self, name: str) -> Path:
        for root in self.roots:
            candidate = root / name / "contract.yaml"
            if candidate.is_file():
                return candidate
        raise ContractError(f"unknown component '{name}'",
                            hint="known components: " + (", ".join(self.names()) or "none")
                                 + f" (searched {', '.join(map(str, self.roots))})")

    def names(self) -> list[str]:
        return sorted({p.parent.name for r in self.roots for p in r.glob("*/contract.yaml")})

    def contract(self, name: str) -> Contract:
        return load_contract(self.path(name))


def resolve_components(recipe: Recipe, arch: str,
                       index: ComponentIndex) -> dict[str, tuple[Instance, Path]]:
    """Each instance with its contract path; unknown components are recipe errors."""
    out = {}
    for name, inst in recipe.instances(arch).items():
        try:
            out[name] = (inst, index.path(inst.component))
        except ContractError as exc:
            raise RecipeError(exc.message, where=recipe.where(f"instances.{name}"),
                              hint=exc.hint) from None
    return out
