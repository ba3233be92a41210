"""Recipes: which components make a kernel, how their ports connect, how it launches.

A recipe is YAML under ``recipes/``, validated against
:data:`pipelink.schema.RECIPE_SCHEMA`; every error names the recipe file and key.
Components are found by name under the component search path (``components/``).

A recipe holds one kernel (``instances``/``connect``/``launch`` at the top level, the
kernel :data:`MAIN`) or several under ``kernels:``. :meth:`Recipe.kernels` gives each
kernel as a :class:`Recipe` of its own (its ``data`` merges the recipe-wide keys with
the kernel's), so the checker, placer and linker see one kernel whichever form the
file uses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .contract import Contract, load_contract, read_yaml, schema_error
from .errors import ContractError, RecipeError, did_you_mean
from .schema import ARCHS, IDENT, RECIPE_SCHEMA, Validator

_VALIDATOR = Validator(RECIPE_SCHEMA)
_CONNECTION = re.compile(r"^\s*(\w+)\.(\w+)\s*->\s*(\w+)\.(\w+)\s*$")
MAIN = "main"                                   # the kernel of a single-kernel recipe
# What a kernel defines; the rest of a multi-kernel recipe is shared by its kernels.
KERNEL_KEYS = ("instances", "connect", "launch", "phases")
_COMPONENT_CHOICE = {"component", "per_arch"}    # an instance's component, one way or the other


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
    loop: str | None = None        # cooperative | pingpong, where the recipe says
    lane: str | None = None        # the instance whose role's warps this one's runs in
    # Params written per arch with no value for this one: param -> the values given. A
    # component that takes such a param is refused (resolve_components); one that does
    # not (another arch's component, per_arch) is built without it.
    unset: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class Recipe:
    """A recipe file, or one kernel of it (see :meth:`kernels`).

    ``name`` is what the kernel's symbols derive from (entry ``pl_<name>``): the
    recipe's name for a single-kernel recipe, ``<recipe>_<kernel>`` for a kernel of a
    multi-kernel one. ``recipe_name`` is always the file's ``recipe:``.
    """

    name: str
    path: str
    data: dict[str, Any]
    connections: tuple[Connection, ...] = field(default_factory=tuple)
    kernel: str = MAIN
    recipe_name: str = ""
    prefix: str = ""                 # where this kernel's keys sit: "" or "kernels.<k>."

    def __post_init__(self) -> None:
        if not self.recipe_name:  # a single-kernel recipe built by hand
            object.__setattr__(self, "recipe_name", self.name)

    @property
    def multi(self) -> bool:
        """Whether the file defines its kernels under ``kernels:``."""
        return "kernels" in self.data

    @property
    def folder(self) -> str:
        """This kernel's folder under ``<build>/<arch>/<recipe>/``: none for a
        single-kernel recipe (today's layout), the kernel's name under ``kernels:``."""
        return self.kernel if self.prefix else ""

    def kernels(self) -> dict[str, Recipe]:
        """Each kernel as a recipe of its own, in file order."""
        if not self.multi:
            return {self.kernel: self}
        shared = {k: v for k, v in self.data.items()
                  if k not in ("kernels", "autograd", "dispatch")}
        out = {}
        for name, spec in self.data["kernels"].items():
            data = {**shared, **spec}
            out[name] = Recipe(f"{self.data['recipe']}_{name}", self.path, data,
                               _connections(data, self.path, f"kernels.{name}."), name,
                               self.data["recipe"], f"kernels.{name}.")
        return out

    def select(self, names: list[str] | tuple[str, ...] | None,
               arch: str | None = None) -> dict[str, Recipe]:
        """The kernels named (all when none are), refusing unknown names; with `arch`,
        those built for it (a kernel named but not built for it is refused)."""
        if arch is not None and arch not in self.archs:
            raise RecipeError(f"recipe '{self.recipe_name}' does not target {arch}",
                              where=self.where("arch"), hint="its archs: " + ", ".join(self.archs))
        kernels = self.kernels()
        for name in names or ():
            if name not in kernels:
                raise RecipeError(f"recipe '{self.recipe_name}' has no kernel '{name}'",
                                  where=self.where("kernels" if self.multi else "recipe"),
                                  hint="its kernels: " + ", ".join(kernels))
            if arch is not None and arch not in kernels[name].archs:
                raise RecipeError(f"kernel '{name}' of recipe '{self.recipe_name}' is not "
                                  f"built for {arch}", where=self.where(f"kernels.{name}.arch"),
                                  hint="it builds for " + ", ".join(kernels[name].archs))
        return {n: k for n, k in kernels.items() if (not names or n in names)
                and (arch is None or arch in k.archs)}

    def elsewhere(self, arch: str) -> dict[str, tuple[str, ...]]:
        """The kernels not built for `arch` -> the archs they are built for."""
        return {n: k.archs for n, k in self.kernels().items() if arch not in k.archs}

    @property
    def archs(self) -> tuple[str, ...]:
        return tuple(self.data["arch"])

    @property
    def phases(self) -> dict[str, dict[str, Any]]:
        """``phases:`` as written (name -> {instances, after}); empty for a kernel of one
        phase."""
        return dict(self.data.get("phases", {}))

    @property
    def launch(self) -> dict[str, Any]:
        return dict(self.data.get("launch", {}))

    @property
    def autograd(self) -> dict[str, Any] | None:
        return self.data.get("autograd")

    @property
    def dispatch(self) -> list[dict[str, Any]] | None:
        return self.data.get("dispatch")

    def where(self, key: str) -> str:
        """``<file>: <key>``, with a kernel's own keys under ``kernels.<kernel>.``."""
        if key.split(".", 1)[0].split("[", 1)[0] in KERNEL_KEYS:
            key = self.prefix + key
        return f"{self.path}: {key}"

    def instances(self, arch: str) -> dict[str, Instance]:
        """Instances in recipe order, with the component chosen for ``arch``."""
        if arch not in self.archs:
            raise RecipeError(f"recipe '{self.name}' does not target {arch}",
                              where=self.where("arch"),
                              hint="its archs: " + ", ".join(self.archs))
        if self.multi:
            raise RecipeError(f"recipe '{self.recipe_name}' defines several kernels; pick one",
                              where=self.where("kernels"),
                              hint="its kernels: " + ", ".join(self.data["kernels"]))
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
            params, unset = _params_on(spec.get("params", {}), arch)
            out[name] = Instance(name, component, params, dict(spec.get("tunables", {})),
                                 spec.get("loop"), spec.get("lane"), unset)
        return out


def _params_on(params: dict[str, Any], arch: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """An instance's params on ``arch`` (a value written ``{arch: value}`` takes this
    arch's), and those written per arch with no value for it (see Instance.unset)."""
    on, unset = {}, {}
    for key, value in params.items():
        if not isinstance(value, dict):
            on[key] = value
        elif arch in value:
            on[key] = value[arch]
        else:
            unset[key] = value
    return on, unset


def load_recipe(path: Path | str) -> Recipe:
    path = Path(path)
    own = _mapping(path)
    data = _extended(path, own, ())
    where = str(path)
    data = _with_likes(data, where)
    data = _with_constants(data, where, own.get("constants"))
    _check_per_arch_params(data, where)
    schema_error(_VALIDATOR, data, where, RecipeError)
    if "kernels" in data:
        top = [k for k in KERNEL_KEYS if k in data]
        if top:
            raise RecipeError(f"the recipe defines kernels: and also top-level "
                              f"{', '.join(top)}", where=f"{where}: {top[0]}",
                              hint="move " + ", ".join(top) + " under one kernel in kernels:")
        recipe = Recipe(data["recipe"], where, data)
        for name, kernel in recipe.kernels().items():
            _check_instances_named(kernel)
            extra = [a for a in kernel.archs if a not in data["arch"]]
            if extra:
                raise RecipeError(f"kernel '{name}' builds for {', '.join(extra)}, which the "
                                  "recipe does not target", where=f"{where}: kernels.{name}.arch",
                                  hint="a kernel's arch lists some of the recipe's: "
                                       + ", ".join(data["arch"]))
        return recipe
    if "instances" not in data:
        raise RecipeError("key 'instances': missing (required)", where=where,
                          hint="list the kernel's instances, or define kernels:")
    if "autograd" in data:
        raise RecipeError("autograd: needs kernels: (a forward kernel and its gradients)",
                          where=f"{where}: autograd", hint="define the kernels under kernels:")
    if "dispatch" in data:
        raise RecipeError("dispatch: needs kernels: (the kernels a call chooses among)",
                          where=f"{where}: dispatch", hint="define the kernels under kernels:")
    recipe = Recipe(data["recipe"], where, data, _connections(data, where, ""))
    _check_instances_named(recipe)
    return recipe


def _mapping(path: Path) -> dict[str, Any]:
    """The recipe file as written."""
    data = read_yaml(path, RecipeError)
    if not isinstance(data, dict):
        raise RecipeError("a recipe is a mapping (recipe:, arch:, instances:, connect:)",
                          where=str(path))
    return data


def _extended(path: Path, data: dict[str, Any], seen: tuple[Path, ...]) -> dict[str, Any]:
    """``data``, read from ``path``, written over the recipe it ``extends:`` (which must
    sit in the same folder), so the rest of the build sees one whole recipe."""
    data = dict(data)
    base_name = data.pop("extends", None)
    if base_name is None:
        return data
    if not isinstance(base_name, str) or not base_name.isidentifier():
        raise RecipeError(f"extends: {base_name!r} is not a recipe name",
                          where=f"{path}: extends", hint="name a recipe of this folder")
    base = path.parent / f"{base_name}.yaml"
    if not base.is_file():
        known = sorted(p.stem for p in path.parent.glob("*.yaml") if p != path)
        raise RecipeError(f"extends names recipe '{base_name}', which is not in {path.parent}",
                          where=f"{path}: extends", hint="recipes here: " + ", ".join(known))
    if base.resolve() in seen or base.resolve() == path.resolve():
        chain = " -> ".join(p.stem for p in (*seen, path.resolve(), base.resolve()))
        raise RecipeError(f"recipes extend each other in a cycle: {chain}",
                          where=f"{path}: extends", hint="remove one extends:")
    merged = _merge(_extended(base, _mapping(base), (*seen, path.resolve())), data)
    if "recipe" not in data:
        merged["recipe"] = path.stem
    if merged["recipe"] == base_name:
        raise RecipeError(f"this recipe and the one it extends are both named '{base_name}': "
                          "their builds would overwrite each other", where=f"{path}: recipe",
                          hint=f"name it '{path.stem}'")
    return merged


def _with_likes(data: dict[str, Any], where: str) -> dict[str, Any]:
    """Each kernel that says ``like: <another kernel>`` written over that kernel (as
    ``extends:`` writes a recipe over its base), so variants of one kernel differ in a
    few lines: ``forward_later: {like: forward, instances: {mask: ...}}``."""
    kernels = data.get("kernels")
    if not isinstance(kernels, dict) or not any(
            isinstance(k, dict) and "like" in k for k in kernels.values()):
        return data
    resolved: dict[str, Any] = {}

    def resolve(name: str, chain: tuple[str, ...]) -> Any:
        if name in resolved:
            return resolved[name]
        kernel = kernels[name]
        if not isinstance(kernel, dict) or "like" not in kernel:
            resolved[name] = kernel
            return kernel
        like = kernel["like"]
        key = f"{where}: kernels.{name}.like"
        if not isinstance(like, str) or like not in kernels:
            raise RecipeError(f"kernel '{name}' is like {like!r}, which is not a kernel of "
                              "this recipe", where=key,
                              hint="its kernels: " + ", ".join(sorted(kernels)))
        if like in (*chain, name):
            raise RecipeError("kernels are like each other in a cycle: "
                              + " -> ".join((*chain, name, like)), where=key,
                              hint="one kernel of the cycle must be written out")
        own = {k: v for k, v in kernel.items() if k != "like"}
        resolved[name] = _merge(resolve(like, (*chain, name)), own)
        return resolved[name]

    return {**data, "kernels": {name: resolve(name, ()) for name in kernels}}


_CONSTANT = re.compile(r"\$(\w+)")
_CONSTANT_VALUE = re.compile(r"[A-Za-z0-9_.+-]+")   # a param string's words, no "$"


def _with_constants(data: dict[str, Any], where: str, own: Any = None) -> dict[str, Any]:
    """The recipe with every ``$name`` in its values replaced by ``constants: {name:
    value}``: a value that is one reference takes the constant's type (``head_dim:
    $head_dim`` is an int), a reference inside a longer string its text (``D ==
    $head_dim``). A recipe that ``extends:`` another sets the constants the other
    reads, so one line changes a value every instance and check shares. A constant the
    file itself sets (``own``) and nothing reads is refused: a misspelt ``head_dm: 64``
    would leave the base's value in place."""
    constants = data.get("constants", {})
    if not isinstance(constants, dict):
        raise RecipeError("constants: is a mapping of names to integers or words",
                          where=f"{where}: constants", hint="constants: {head_dim: 128}")
    for name, value in constants.items():
        if not (isinstance(name, str) and re.fullmatch(IDENT["pattern"], name)) or \
                isinstance(value, bool) or not isinstance(value, (int, str)) or \
                (isinstance(value, str) and not _CONSTANT_VALUE.fullmatch(value)):
            raise RecipeError(f"constant {name!r}: {value!r} is not a name with an integer or "
                              "a word (letters, digits, _ . + -)",
                              where=f"{where}: constants.{name}",
                              hint="e.g. head_dim: 128 or dtype: bf16")

    read: set[str] = set()

    def value_of(name: str, key: str) -> int | str:
        read.add(name)
        if name not in constants:
            raise RecipeError(f"${name} names no constant of this recipe",
                              where=f"{where}: {key}",
                              hint=("its constants: " + ", ".join(sorted(constants)))
                              if constants else f"define it under constants: ({name}: ...)")
        return constants[name]

    def walk(node: Any, key: str) -> Any:
        if isinstance(node, dict):
            return {k: node[k] if k in ("description", "constants") else
                    walk(node[k], f"{key}.{k}" if key else str(k)) for k in node}
        if isinstance(node, list):
            return [walk(item, f"{key}[{i}]") for i, item in enumerate(node)]
        if not isinstance(node, str) or "$" not in node:
            return node
        whole = _CONSTANT.fullmatch(node.strip())
        if whole:
            return value_of(whole[1], key)
        return _CONSTANT.sub(lambda m: str(value_of(m[1], key)), node)
    out = walk(data, "")
    for name in own if isinstance(own, dict) else ():
        if name not in read:
            raise RecipeError(f"constant '{name}' is set here but read nowhere (no "
                              f"${name} in the recipe or the recipes it extends)",
                              where=f"{where}: constants.{name}",
                              hint=did_you_mean(name, read) + "constants read: "
                                   + (", ".join(sorted(read)) or "none")
                                   + "; remove it or fix its name")
    return out


def _check_per_arch_params(data: dict[str, Any], where: str) -> None:
    """A param written per arch names known archs (the schema would only say the
    instance matches no form)."""
    kernels = data.get("kernels")
    groups = [("", data)] + ([(f"kernels.{k}.", v) for k, v in kernels.items()
                              if isinstance(v, dict)] if isinstance(kernels, dict) else [])
    for prefix, kernel in groups:
        instances = kernel.get("instances")
        for name, spec in (instances.items() if isinstance(instances, dict) else ()):
            params = spec.get("params") if isinstance(spec, dict) else None
            for key, value in (params.items() if isinstance(params, dict) else ()):
                unknown = [a for a in value if a not in ARCHS] if isinstance(value, dict) else []
                if unknown:
                    raise RecipeError(f"param '{key}' of instance '{name}' gives a value for "
                                      f"{unknown[0]!r}, which is not an arch",
                                      where=f"{where}: {prefix}instances.{name}.params.{key}",
                                      hint="archs: " + ", ".join(ARCHS))


def _merge(base: Any, over: Any) -> Any:
    """``over`` written over ``base``: mappings merge key by key, a key set to null
    (``~``) is removed, anything else (lists included) replaces. An instance's choice of
    component (``component`` or ``per_arch``), written over, replaces the base's choice
    whole: an instance the base picks per arch becomes one component for every arch."""
    if not (isinstance(base, dict) and isinstance(over, dict)):
        return over
    out = dict(base)
    if _COMPONENT_CHOICE & over.keys():
        for key in _COMPONENT_CHOICE:
            out.pop(key, None)
    for key, value in over.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge(base.get(key), value)
    return out


def _connections(data: dict[str, Any], where: str, prefix: str) -> tuple[Connection, ...]:
    connections = []
    for i, text in enumerate(data.get("connect", [])):
        m = _CONNECTION.match(text)
        if not m:  # the schema's pattern already refuses most of these
            raise RecipeError(f"cannot read connection {text!r}",
                              where=f"{where}: {prefix}connect[{i}]",
                              hint="write 'producer.port -> consumer.port'")
        connections.append(Connection(Endpoint(m[1], m[2]), Endpoint(m[3], m[4]), i))
    return tuple(connections)


def _check_instances_named(recipe: Recipe) -> None:
    """Every connection names an instance of its kernel."""
    for c in recipe.connections:
        for end in (c.src, c.dst):
            if end.instance not in recipe.data["instances"]:
                raise RecipeError(f"connection names instance '{end.instance}', which is not "
                                  "under instances", where=recipe.where(c.key),
                                  hint="instances: " + ", ".join(recipe.data["instances"]))


@dataclass(frozen=True)
class ComponentIndex:
    """Finds components by name: ``<root>/<name>/contract.yaml`` for each root."""

    roots: tuple[Path, ...]

    def path(self, name: str) -> Path:
        for root in self.roots:
            candidate = root / name / "contract.yaml"
            if candidate.is_file():
                return candidate
        if not self.names():   # a command run outside the project, most likely
            searched = ", ".join(str(r.resolve()) for r in self.roots)
            raise ContractError(f"unknown component '{name}': no components at all under "
                                f"{searched}",
                                hint="run from the folder that holds components/, or set "
                                     "PIPELINK_COMPONENTS to the components folder "
                                     "(os.pathsep-separated for several)")
        raise ContractError(f"unknown component '{name}'",
                            hint=did_you_mean(name, self.names()) + "known components: "
                                 + (", ".join(self.names()) or "none")
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
        _check_unset(recipe, arch, inst, out[name][1])
    return out


def _check_unset(recipe: Recipe, arch: str, inst: Instance, contract_path: Path) -> None:
    """A param written per arch (``{sm_90a: 192, sm_100a: 128}``) needs a value for
    every arch whose component takes it; a per_arch instance whose component on this arch
    has no such param (another arch's component's knob) is built without it."""
    if not inst.unset:
        return
    takes = load_contract(contract_path).params
    for key, value in inst.unset.items():
        if key in takes:
            raise RecipeError(
                f"param '{key}' of instance '{inst.name}' has no value for {arch}, and "
                f"{inst.component} takes it",
                where=recipe.where(f"instances.{inst.name}.params.{key}"),
                hint=f"add {arch}: <value> beside "
                     + ", ".join(f"{a}: {v}" for a, v in value.items()))
