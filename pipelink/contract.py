"""Component contracts: load, validate against the schema, and bind params.

A contract is YAML next to the component's source. :func:`load_contract` validates it
against :data:`pipelink.schema.CONTRACT_SCHEMA` and checks its internal references
(a port's buffer names an smem entry, every expression's names are bound).
:meth:`Contract.bind` fixes the compile-time params; what still depends on tunables
stays an expression and is tabulated over the tunables' values by the checker.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema

from . import expr, yamlload
from .errors import ContractError, did_you_mean
from .interfaces import INTERFACES, caller_symbol
from .problem import DYNAMIC_SMEM_ALIGN
from .schema import C_IDENT, CONNECTION, CONTRACT_SCHEMA, IDENT, PARAM_STRING, Validator
from .work import (
    K_RANGE_FIELDS,
    PARTIAL_RECORDS,
    PER_TILE_WORK,
    accepted_records,
    record_fields,
)
from .yamlload import clip

# Ports that are rings of buffers with full/empty mbarriers, placed at the producer.
RING_PORTS = ("smem_pipeline", "tmem")
EVERY_ROLE = "*"          # the role of a work in port that every role of its component reads
# Architectures with Tensor Memory (tcgen05).
TMEM_ARCHS = {"sm_100a"}
WARPGROUP_USES = {"wgmma", "setmaxnreg", "umma", "tmem_load"}
_VALIDATOR = Validator(CONTRACT_SCHEMA)
# The placer enumerates every value of a tunable (and every combination of those one
# expression reads): keep the ranges small.
MAX_TUNABLE_VALUES = 256
MAX_COMBINATIONS = 4096


def canonical_json(data: Any) -> str:
    """The one serialisation used for hashing and embedding: sorted, compact."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def sha256_text(text: str | bytes) -> str:
    raw = text.encode() if isinstance(text, str) else text
    return hashlib.sha256(raw).hexdigest()


def read_yaml(path: Path, error: type[Exception] = ContractError) -> Any:
    """YAML from ``path``, bounded and strict (see :mod:`pipelink.yamlload`); an error
    names the file, line and column."""
    return yamlload.read_yaml(path, error)


def _path_order(path: Any) -> tuple:
    """Sort key of a key path that may mix list indices and (YAML: any) mapping keys."""
    return tuple((0, p, "") if isinstance(p, int) else (1, 0, str(p)) for p in path)


def _key_text(key: Any) -> str:
    """A key as a path element: plain names as they are, anything odd in brackets."""
    if isinstance(key, int):
        return f"[{key}]"     # a list index, written as the checker writes connect[0]
    text = str(key)
    return text if re.fullmatch(r"[A-Za-z0-9_-]+", text) else f"[{json.dumps(key, default=str)}]"


def _kinds(alternatives: list[Any]) -> list[str]:
    """What each alternative of a oneOf accepts, flattened: integer, string, object..."""
    out: list[str] = []
    for alt in alternatives:
        if not isinstance(alt, dict):
            continue
        if "oneOf" in alt:
            out += _kinds(alt["oneOf"])
        elif "enum" in alt:
            out.append("one of " + "/".join(map(str, alt["enum"])))
        else:
            out.append(str(alt.get("type", "valid")))
    return list(dict.fromkeys(out))


# What each schema pattern means, said to a person instead of the regex.
_PATTERN_WORDS = {
    IDENT["pattern"]: ("not a name", "names are lowercase letters, digits and _, "
                       "not starting with a digit"),
    C_IDENT["pattern"]: ("not a C identifier", "letters, digits and _, not starting with a "
                         "digit"),
    PARAM_STRING["pattern"]: ("not a param string", "letters, digits and _ . + -"),
    CONNECTION["pattern"]: ("not a connection", "write 'producer.port -> consumer.port'"),
}


def _narrowed(error: jsonschema.ValidationError,
              validator: jsonschema.Validator) -> jsonschema.ValidationError:
    """A oneOf/anyOf violation by a value of the type exactly one alternative takes, as
    that alternative's own first violation: a mapping with a misspelt key is an unknown
    key, not 'neither string nor object'."""
    while error.validator in ("oneOf", "anyOf") and error.context \
            and isinstance(error.validator_value, list):
        fits = [i for i, alt in enumerate(error.validator_value)
                if isinstance(alt, dict) and isinstance(alt.get("type"), str)
                and validator.is_type(error.instance, alt["type"])]
        inner = sorted((e for e in error.context if fits and e.relative_schema_path
                        and e.relative_schema_path[0] == fits[0]),
                       key=lambda e: (_path_order(e.absolute_path), e.message))
        if len(fits) != 1 or not inner:
            break
        error = inner[0]
    return error


def schema_error(validator: jsonschema.Validator, data: Any, where: str,
                 error: type[Exception]) -> None:
    """Raises the first schema violation (deterministic order) with its key path:
    an unknown key and a missing key are named themselves, not their parent."""
    errors = sorted(validator.iter_errors(data),
                    key=lambda e: (_path_order(e.absolute_path), e.message))
    if not errors:
        return
    first = _narrowed(errors[0], validator)
    path = [_key_text(p) for p in first.absolute_path]
    message = first.message
    schema = first.schema if isinstance(first.schema, dict) else {}
    hint = schema.get("description")
    if first.validator == "additionalProperties" and isinstance(first.instance, dict):
        allowed = sorted(schema.get("properties", {}))
        extra = sorted(_key_text(k) for k in first.instance if k not in allowed)
        path.append(extra[0] if extra else "?")
        message = "unknown key"
        hint = "allowed keys here: " + (", ".join(allowed) or "none")
    elif first.validator in ("oneOf", "anyOf") and any(
            e.validator == "pattern" for e in first.context or ()):
        # The value has an accepted type but not the accepted form: say the form.
        pattern = next(e for e in first.context if e.validator == "pattern").validator_value
        what, words = _PATTERN_WORDS.get(pattern, ("not valid here", None))
        message = f"{clip(repr(first.instance))} is {what}"
        hint = "; ".join(h for h in (hint, words) if h) or None
    elif first.validator in ("oneOf", "anyOf") and isinstance(first.validator_value, list):
        message = f"{clip(repr(first.instance))} is neither " + " nor ".join(
            _kinds(first.validator_value))
    elif first.validator == "maxLength" and isinstance(first.instance, str):
        message = (f"{clip(repr(first.instance), 40)} is {len(first.instance)} characters "
                   f"long, more than {first.validator_value}")
        hint = "; ".join(h for h in (hint, "names become file names and symbols: shorten "
                                           "it") if h)
    elif first.validator == "pattern":
        what, words = _PATTERN_WORDS.get(first.validator_value, ("not valid here", None))
        message = f"{clip(repr(first.instance))} is {what}"
        hint = "; ".join(h for h in (hint, words) if h) or None
    elif first.validator == "required" and isinstance(first.instance, dict):
        missing = [k for k in first.validator_value if k not in first.instance]
        path.append(str(missing[0]) if missing else "?")
        message = "missing (required)"
        hint = schema.get("properties", {}).get(path[-1], {}).get("description") \
            or "add the key"
    key = clip(".".join(path).replace(".[", "["), 120) or "<top>"
    raise error(f"key '{key}': {clip(message)}", where=where, hint=hint)


@dataclass(frozen=True)
class Port:
    name: str
    dir: str
    kind: str
    dtype: str
    role: str                     # EVERY_ROLE: a work in port all the roles read
    spec: dict[str, Any]          # the rest, as written (expressions unevaluated)

    def seen_by(self, role: str) -> bool:
        """Whether `role`'s entry sees this port."""
        return self.role in (role, EVERY_ROLE)


@dataclass(frozen=True)
class RoleSpec:
    name: str
    warps: Any
    registers: Any
    uses: tuple[str, ...]
    entry: str
    init: bool
    tail: bool
    state: tuple[str, ...] = ()    # PipeStates of rings between the component's own roles

    @property
    def warpgroup(self) -> bool:
        return bool(WARPGROUP_USES & set(self.uses))


@dataclass(frozen=True)
class Contract:
    """A validated contract, params not yet bound."""

    name: str
    path: str                      # where it was read from, for messages
    data: dict[str, Any]           # the YAML as validated
    roles: dict[str, RoleSpec] = field(default_factory=dict)
    ports: dict[str, Port] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return self.data.get("kind", "stage")

    @property
    def archs(self) -> tuple[str, ...]:
        return tuple(self.data["arch"])

    @property
    def params(self) -> dict[str, int | str]:
        return dict(self.data.get("params", {}))

    @property
    def tunables(self) -> dict[str, tuple[int, ...]]:
        out = {}
        for name, spec in self.data.get("tunables", {}).items():
            out[name] = (tuple(range(spec[0], spec[1] + 1)) if isinstance(spec, list)
                         else tuple(sorted(set(spec["values"]))))
        return out

    def section(self, key: str) -> dict[str, Any]:
        return dict(self.data.get(key, {}))

    def source_for(self, arch: str) -> str:
        return self.data.get("sources", {}).get(arch) or self.data.get(
            "source", f"{self.name}.cu")

    def where(self, key: str) -> str:
        return f"{self.path}: {key}"

    def bind(self, overrides: dict[str, int | str] | None = None, *,
             where: str | None = None) -> BoundContract:
        """Fixes compile-time params (defaults overridden by ``overrides``)."""
        params = self.params
        if overrides is not None and not isinstance(overrides, dict):
            raise ContractError(f"params of '{self.name}' must be a mapping, got {overrides!r}",
                                where=where or self.path, hint="params: {name: value}")
        for name, value in (overrides or {}).items():
            if name not in params:
                raise ContractError(
                    f"component '{self.name}' has no param '{name}'", where=where or self.path,
                    hint="params: " + (", ".join(sorted(params)) or "none"))
            if type(value) is not type(params[name]):
                raise ContractError(
                    f"param '{name}' of '{self.name}' is {type(params[name]).__name__}, "
                    f"got {value!r}", where=where or self.path,
                    hint=f"the default is {params[name]!r}")
            if isinstance(value, str) and not re.fullmatch(PARAM_STRING["pattern"], value):
                raise ContractError(
                    f"param '{name}' of '{self.name}' is {value!r}: a param string is a dtype "
                    "or a word of letters, digits and _ . + -", where=where or self.path)
            params[name] = value
        bound = BoundContract(self, params)
        bound.validate(where)
        return bound


@dataclass(frozen=True)
class BoundContract:
    """A contract with its params fixed: what one compiled object carries."""

    contract: Contract
    params: dict[str, int | str]

    @property
    def name(self) -> str:
        return self.contract.name

    def validate(self, where: str | None = None) -> None:
        """With the params fixed, every dtype names one and every expression evaluates,
        for every value of the tunables it reads, within its field's range. A recipe's
        params that break the contract fail here, naming the field and the params."""
        try:
            self._check_requires()
            for key, value in _dtype_refs(self.contract):
                self.dtype(value, key)
            for port in self.contract.ports:
                self.layout(port)
            for key, value in _expressions(self.contract):
                _, table = self.tabulate(value, key)
                for _, result in table:
                    _check_range(key, result, self.contract)
            self._check_rings()
            self._check_tensormaps()
        except ContractError as exc:
            shown = ", ".join(f"{k}={v}" for k, v in sorted(self.params.items()))
            source = f", set in {where}" if where else ""
            raise ContractError(f"{exc.message} (params: {shown or 'none'}{source})",
                                where=exc.where, hint=exc.hint) from None

    def _check_requires(self) -> None:
        """The contract's rules on its params hold (requires): params its code cannot take
        are refused here, naming the rule, before nvcc meets a static_assert."""
        for i, rule in enumerate(self.contract.data.get("requires", [])):
            where = self.contract.where(f"requires[{i}]")
            if expr.holds(rule["check"], self.params, where=where):
                continue
            read = sorted(expr.requirement_names(rule["check"]))
            raise ContractError(f"'{self.name}' requires {rule['check']}: {rule['why']}",
                                where=where,
                                hint=f"set {', '.join(read)} so that {rule['check']}")

    def _check_rings(self) -> None:
        """Each ring a port produces fits what it names, for every value of the tunables:
        its shared-memory buffer holds every stage (stages x the tile's bytes) and its full
        and empty mbarrier arrays hold one barrier per stage. Else the stages past the end
        land on the next buffer or barrier: a kernel that builds, then hangs or computes
        garbage."""
        c = self.contract
        for port in c.ports.values():
            if port.dir != "out" or port.kind not in RING_PORTS:
                continue
            key = f"ports.{port.name}"
            stages = port.spec["stages"]
            if port.kind == "smem_pipeline":
                dtype = self.dtype(port.dtype, f"{key}.dtype")
                shape = [self.eval(d, f"{key}.shape[{i}]")
                         for i, d in enumerate(port.spec["shape"])]
                tile = math.prod(shape) * expr.DTYPE_BYTES[dtype]
                buffer = port.spec["buffer"]
                written = "*".join(f"({v})" if isinstance(v, str) and not v.isidentifier()
                                   else str(v) for v in (stages, *port.spec["shape"]))
                self._at_least(f"smem.{buffer}.bytes", c.section("smem")[buffer]["bytes"],
                               stages, tile,
                               f"port '{port.name}' rings {{stages}} stages of {tile} bytes "
                               f"(shape {shape} of {dtype}), but smem.{buffer} holds "
                               "{value} bytes: the stages past its end would overwrite "
                               "the next buffer",
                               f"size smem.{buffer}.bytes as {written}*sizeof({port.dtype})")
            for bar in ("full", "empty"):
                name = port.spec[bar]
                spec = c.section("mbarriers")[name]
                count = spec["count"] if isinstance(spec, dict) else spec
                self._at_least(f"mbarriers.{name}", count, stages, 1,
                               f"port '{port.name}' rings {{stages}} stages, but its {bar} "
                               f"barriers, mbarriers.{name}, number {{value}}: the stages "
                               "past them would wait on another array's barriers",
                               f"give mbarriers.{name} one barrier per stage: {stages}")

    def _at_least(self, key: str, value: Any, stages: Any, per_stage: int, message: str,
                  hint: str) -> None:
        """``value`` >= ``stages`` x ``per_stage`` for every combination of the tunables
        either reads (evaluated together, so ``stages`` in both is one value)."""
        deps = tuple(dict.fromkeys((*self.depends(value), *self.depends(stages))))
        for combo in self._combinations(deps, key, f"{key} and its port's stages"):
            tunables = dict(zip(deps, combo, strict=True))
            have = self.eval(value, key, tunables)
            count = self.eval(stages, key, tunables)
            if have < count * per_stage:
                pinned = ", ".join(f"{k}={v}" for k, v in tunables.items())
                raise ContractError(message.format(stages=count, value=have)
                                    + (f" (with {pinned})" if pinned else ""),
                                    where=self.contract.where(key), hint=hint)

    def _check_tensormaps(self) -> None:
        """A tensormap argument's box is one cuTensorMapEncodeTiled takes (else every call
        fails): 1 to 5 dimensions, an inner row of a multiple of 16 bytes and, under a
        swizzle, of at most the swizzle's bytes."""
        for i, arg in enumerate(self.contract.data.get("args", [])):
            if arg["type"] != "tensormap":
                continue
            key, box = f"args[{i}]", arg.get("box") or []
            example = "box: [tile_k, tile_m] (innermost first)"
            if not 1 <= len(box) <= TMA_MAX_RANK:
                raise ContractError(f"tensormap argument '{arg['name']}' has "
                                    + (f"a {len(box)}-D box" if box else "no box"),
                                    where=self.contract.where(f"{key}.box" if box else key),
                                    hint=f"a TMA box has 1 to {TMA_MAX_RANK} dimensions: "
                                         + example)
            if "dtype" not in arg:
                continue
            size = expr.DTYPE_BYTES[self.dtype(arg["dtype"], f"{key}.dtype")]
            inner = self.eval(box[0], f"{key}.box[0]") * size
            swizzle = self.eval(arg.get("swizzle", 0), f"{key}.swizzle")
            if inner % 16:
                raise ContractError(f"tensormap argument '{arg['name']}': the box's inner "
                                    f"dimension spans {inner} bytes, not a multiple of 16",
                                    where=self.contract.where(f"{key}.box[0]"),
                                    hint="TMA moves rows of whole 16-byte units: make box[0] "
                                         f"a multiple of {max(16 // size, 1)} elements")
            if swizzle and inner > swizzle:
                raise ContractError(f"tensormap argument '{arg['name']}': the box's inner "
                                    f"dimension spans {inner} bytes, more than its "
                                    f"{swizzle}-byte swizzle", where=self.contract.where(
                                        f"{key}.box[0]"),
                                    hint=f"make box[0] at most {swizzle // size} elements, "
                                         "or the swizzle wider")

    def params_hash(self) -> str:
        return sha256_text(canonical_json(self.params))[:8]

    def symbol(self, entry: str) -> str:
        """The linked symbol of an entry: the params hash keeps two param sets of one
        component apart in one kernel."""
        return f"{entry}_{self.params_hash()}"

    def entries(self) -> dict[str, str]:
        """Source-level name of each function the object defines: each role's entry, its
        init/tail hooks, and the functions of its function out ports ('port.function')."""
        out = {r.name: r.entry for r in self.contract.roles.values()}
        for r in self.contract.roles.values():
            if r.init:
                out[f"{r.name}.init"] = f"{r.entry}_init"
            if r.tail:
                out[f"{r.name}.tail"] = f"{r.entry}_tail"
        out.update(self.functions("out"))
        return out

    def functions(self, direction: str) -> dict[str, str]:
        """'port.function' -> source-level name, for the function ports of one direction:
        in, the functions the object calls (the glue defines them); out, the ones it
        provides."""
        return {f"{p.name}.{f.name}": caller_symbol(self.name, p.name, f.name)
                for p in sorted(self.contract.ports.values(), key=lambda p: p.name)
                if p.kind == "function" and p.dir == direction
                for f in INTERFACES[p.spec["interface"]].functions}

    def dtype(self, value: str, key: str) -> str:
        """A dtype as written, or the dtype a string param names."""
        resolved = self.params.get(value, value)
        if resolved not in expr.DTYPE_BYTES:
            what = f"param '{value}' is {resolved!r}" if value in self.params else f"'{value}'"
            raise ContractError(f"{what}, not a dtype", where=self.contract.where(key),
                                hint="dtypes: " + ", ".join(expr.DTYPE_BYTES))
        return str(resolved)

    def layout(self, port: str) -> str | None:
        """A port's layout with its {param} placeholders filled from word params, so one
        contract serves, e.g., K-major and MN-major operands: 'sw128_{a_major}major'."""
        value = self.contract.ports[port].spec.get("layout")
        if value is None or "{" not in value:
            return value
        try:
            return value.format_map({k: v for k, v in self.params.items()
                                     if isinstance(v, str)})
        except (KeyError, ValueError, IndexError) as exc:
            raise ContractError(f"layout {value!r} names no word param ({exc})",
                                where=self.contract.where(f"ports.{port}.layout"),
                                hint="write {p} for a param p whose value is a word, "
                                     "e.g. sw128_{a_major}major") from None

    def env(self, tunables: dict[str, int] | None = None) -> dict[str, int | str]:
        return {**self.params, **(tunables or {})}

    def eval(self, value: Any, key: str, tunables: dict[str, int] | None = None) -> int:
        """The value of the expression at ``key`` (a condition's: 1 or 0)."""
        return expr.evaluate(value, self.env(tunables), where=self.contract.where(key),
                             condition=is_condition(key))

    def depends(self, value: Any, key: str = "") -> tuple[str, ...]:
        """The tunables an expression (the one at ``key``) reads, in contract order."""
        used = (expr.names(value, condition=is_condition(key))
                if not isinstance(value, int) else set())
        return tuple(t for t in self.contract.tunables if t in used)

    def places(self, barrier: str) -> bool:
        """Whether this instance places named barrier ``barrier``: it has no ``when``, or
        its ``when`` holds for these params."""
        when = self.contract.section("named_barriers")[barrier].get("when")
        return when is None or bool(self.eval(when, f"named_barriers.{barrier}.when"))

    def named_barriers(self) -> dict[str, dict[str, Any]]:
        """The named barriers this instance places, name -> spec as written: every one
        the contract declares but those whose ``when`` is false for these params. The
        placement struct still has a field for each declared one (see
        :data:`pipelink.problem.UNPLACED_BARRIER`)."""
        return {name: spec for name, spec in self.contract.section("named_barriers").items()
                if self.places(name)}

    def tabulate(self, value: Any, key: str) -> tuple[tuple[str, ...],
                                                       tuple[tuple[tuple[int, ...], int], ...]]:
        """(depends, table): the value for every combination of the tunables it reads."""
        deps = self.depends(value, key)
        table = tuple((c, self.eval(value, key, dict(zip(deps, c, strict=True))))
                      for c in self._combinations(deps, key))
        return deps, table

    def _combinations(self, deps: tuple[str, ...], key: str,
                      readers: str = "") -> list[tuple[int, ...]]:
        """Every combination of the values of tunables ``deps``, which the field at ``key``
        (or ``readers``, as the message names them) reads; refused past MAX_COMBINATIONS."""
        if math.prod(len(self.contract.tunables[d]) for d in deps) > MAX_COMBINATIONS:
            subject = f"{readers} read" if readers else f"{key} reads"
            raise ContractError(f"{subject} tunables {', '.join(deps)}: more than "
                                f"{MAX_COMBINATIONS} combinations",
                                where=self.contract.where(key),
                                hint="narrow the tunables' ranges")
        combos: list[tuple[int, ...]] = [()]
        for d in deps:
            combos = [c + (v,) for c in combos for v in self.contract.tunables[d]]
        return combos

    def resolved(self) -> dict[str, Any]:
        """Every value that does not depend on a tunable, evaluated (for inspect)."""
        out: dict[str, Any] = {}
        for section in ("smem", "named_barriers", "tmem", "roles"):
            for name, spec in self.contract.section(section).items():
                out[f"{section}.{name}"] = {
                    k: self._try(v, f"{section}.{name}.{k}") for k, v in spec.items()
                    if k not in ("uses", "entry", "init", "tail")}
        for name, spec in self.contract.section("mbarriers").items():
            count = spec["count"] if isinstance(spec, dict) else spec
            out[f"mbarriers.{name}"] = {"count": self._try(count, f"mbarriers.{name}")}
        return out

    def _try(self, value: Any, key: str) -> Any:
        if isinstance(value, (bool, list)) or self.depends(value, key):
            return value
        result = self.eval(value, key)
        return bool(result) if is_condition(key) else result


def load_contract(path: Path | str) -> Contract:
    """A contract from its file. A ``contract.yaml`` names the component of its folder: the
    index finds components by folder, sources include ``pl_<component>.h``."""
    path = Path(path)
    data = read_yaml(path)
    contract = contract_from_data(data, str(path))
    folder = path.resolve().parent.name
    if path.name == "contract.yaml" and contract.name != folder:
        raise ContractError(
            f"component '{contract.name}' is in folder '{folder}'; the two must match "
            f"(the index looks for the folder, the source includes pl_{contract.name}.h)",
            where=contract.where("component"),
            hint=f"rename the folder to '{contract.name}', or write component: {folder} "
                 f"and include pl_{folder}.h")
    return contract


def contract_from_data(data: Any, where: str) -> Contract:
    """Validates contract data (already parsed) and checks its internal references."""
    if not isinstance(data, dict):
        raise ContractError("a contract is a mapping (component:, arch:, ...)", where=where)
    schema_error(_VALIDATOR, data, where, ContractError)
    name = data["component"]
    roles = {r: RoleSpec(r, spec["warps"], spec.get("registers", 0), tuple(spec.get("uses", [])),
                         spec.get("entry", f"pl_{name}_{r}"), spec.get("init", False),
                         spec.get("tail", False), tuple(spec.get("state", ())))
             for r, spec in data.get("roles", {}).items()}
    ports = {}
    for pname, spec in data.get("ports", {}).items():
        if spec["kind"] == "function":
            # Called from any of the component's roles (in) or from another component's
            # code (out): no role of its own.
            rest = {k: v for k, v in spec.items() if k not in ("dir", "kind")}
            ports[pname] = Port(pname, spec["dir"], "function", "", "", rest)
            continue
        if spec["kind"] == "work" and spec["dir"] == "in" and "role" not in spec \
                and len(roles) > 1:
            # Every role of the component loops over the records: each reads them.
            rest = {k: v for k, v in spec.items() if k not in ("dir", "kind")}
            ports[pname] = Port(pname, "in", "work", "", EVERY_ROLE, rest)
            continue
        role = spec.get("role") or _only_role(roles, name, pname, where)
        if role not in roles:
            raise ContractError(f"port '{pname}' names role '{role}', which is not declared",
                                where=f"{where}: ports.{pname}.role",
                                hint="roles: " + ", ".join(sorted(roles)))
        if "dtype" not in spec and spec["kind"] != "work":
            raise ContractError(f"{spec['kind']} port '{pname}' needs 'dtype'",
                                where=f"{where}: ports.{pname}")
        rest = {k: v for k, v in spec.items() if k not in ("dir", "kind", "dtype", "role")}
        ports[pname] = Port(pname, spec["dir"], spec["kind"], spec.get("dtype", ""), role, rest)
    contract = Contract(name, where, data, roles, ports)
    _check_references(contract)
    _check_expressions(contract)
    return contract


def _only_role(roles: dict[str, RoleSpec], name: str, port: str, where: str) -> str:
    if len(roles) == 1:
        return next(iter(roles))
    if not roles:   # no role to see the port: say what is missing, not which to pick
        raise ContractError(f"component '{name}' declares no roles, so no role sees port "
                            f"'{port}'", where=f"{where}: roles",
                            hint="a stage runs in warps: roles: {main: {warps: 1}}")
    raise ContractError(f"port '{port}' of '{name}' must say which role sees it",
                        where=f"{where}: ports.{port}",
                        hint="add role: <one of " + ", ".join(sorted(roles)) + ">")


_PORT_NEEDS = {
    ("smem_pipeline", "out"): ("shape", "layout", "stages", "buffer", "full", "empty",
                               "arrivals"),
    ("smem_pipeline", "in"): ("shape", "layout", "stages", "arrivals"),
    ("tmem", "out"): ("shape", "layout", "stages", "buffer", "full", "empty", "arrivals"),
    ("tmem", "in"): ("shape", "layout", "stages", "arrivals"),
    ("registers", "out"): ("count", "layout"),
    ("registers", "in"): ("count", "layout"),
    ("global", "out"): ("shape", "slots"),
    ("global", "in"): ("shape", "readers"),
    ("work", "out"): ("record", "stages"),
    ("work", "in"): (),
    ("function", "out"): ("interface",),
    ("function", "in"): ("interface",),
}


def _check_references(c: Contract) -> None:
    mbars = c.section("mbarriers")
    if c.kind == "stage" and not c.roles:
        raise ContractError(f"component '{c.name}' declares no roles", where=c.where("roles"),
                            hint="a stage runs in warps: roles: {main: {warps: 1}}; a "
                                 "component that only provides device functions says "
                                 "kind: function")
    if c.kind == "function":
        _check_function_component(c)
    for port in c.ports.values():
        key = f"ports.{port.name}"
        for need in _PORT_NEEDS[(port.kind, port.dir)]:
            if need not in port.spec:
                raise ContractError(f"{port.dir} {port.kind} port '{port.name}' needs '{need}'",
                                    where=c.where(key))
        if port.kind == "tmem" and set(c.archs) - TMEM_ARCHS:
            raise ContractError(f"tmem port '{port.name}' hands data through Tensor Memory, "
                                f"which {', '.join(sorted(set(c.archs) - TMEM_ARCHS))} does not "
                                "have", where=c.where("arch"),
                                hint=f"list only {', '.join(sorted(TMEM_ARCHS))} in arch (a "
                                     "recipe picks another component elsewhere with per_arch:)")
        if port.kind in RING_PORTS and port.dir == "out":
            section = "smem" if port.kind == "smem_pipeline" else "tmem"
            buffers = c.section(section)
            if port.spec["buffer"] not in buffers:
                raise ContractError(f"port '{port.name}' names buffer '{port.spec['buffer']}', "
                                    f"which is not under {section}",
                                    where=c.where(f"{key}.buffer"),
                                    hint=f"{section}: " + (", ".join(sorted(buffers)) or "none"))
            for bar in ("full", "empty"):
                if port.spec[bar] not in mbars:
                    raise ContractError(
                        f"port '{port.name}' names mbarrier array '{port.spec[bar]}' as {bar}, "
                        "which is not under mbarriers", where=c.where(f"{key}.{bar}"),
                        hint="mbarriers: " + (", ".join(sorted(mbars)) or "none"))
    _check_work_ports(c)
    _check_role_state(c)
    for name in c.section("tmem"):
        if not TMEM_ARCHS & set(c.archs):
            raise ContractError(f"tmem '{name}' needs sm_100a in arch",
                                where=c.where(f"tmem.{name}"),
                                hint="Tensor Memory exists on sm_100a only")


def _check_role_state(c: Contract) -> None:
    """A role's own ring states sit beside its ports' in one struct: no name twice."""
    for role in c.roles.values():
        for name in role.state:
            port = c.ports.get(name)
            if port is not None and port.kind in RING_PORTS and port.seen_by(role.name):
                raise ContractError(f"role '{role.name}' keeps state '{name}', the name of its "
                                    f"port '{name}'", where=c.where(f"roles.{role.name}.state"),
                                    hint="name the ring between the component's own roles "
                                         "apart from its ports")


def _check_work_ports(c: Contract) -> None:
    """A work out port belongs to a scheduler; a work in port names its
    record or the fields it reads; a ring whose trip count is the record's k range
    belongs to a role that reads that range."""
    for port in c.ports.values():
        key = f"ports.{port.name}"
        if port.kind == "work" and port.dir == "in" \
                and ("record" in port.spec) == ("fields" in port.spec):
            raise ContractError(f"work port '{port.name}' needs one of 'record' or 'fields'",
                                where=c.where(key),
                                hint="record: gemm_tile, or fields: [the fields it reads]")
        if port.kind == "work" and "shape" not in port.spec and any(
                r in PARTIAL_RECORDS for r in accepted_records(port.spec)):
            raise ContractError(f"work port '{port.name}' carries split_tile records but "
                                "states no tile shape", where=c.where(key),
                                hint="add shape: [tile_m, tile_n]: the pieces of a split "
                                     "tile exchange fp32 partials of that shape")
        if port.kind == "work" and port.dir == "out":
            if not isinstance(port.spec["record"], str):
                raise ContractError(f"work out port '{port.name}' lists record types "
                                    f"{port.spec['record']}", where=c.where(f"{key}.record"),
                                    hint="a scheduler produces one record type; a list is for "
                                         "consumers that handle several")
            if c.kind != "scheduler":
                raise ContractError(f"work out port '{port.name}' in a component that is "
                                    "not a scheduler", where=c.where(key),
                                    hint="add kind: scheduler at the top of the contract")
        if port.spec.get("per_tile") == PER_TILE_WORK:
            readers = [p for p in c.ports.values()
                       if p.kind == "work" and p.dir == "in" and p.seen_by(port.role)
                       and set(K_RANGE_FIELDS) <= set(record_fields(p.spec))]
            if not readers:
                raise ContractError(
                    f"port '{port.name}' takes its trip count from the work record "
                    f"(per_tile: work), but role '{port.role}' reads no record with "
                    f"{' and '.join(K_RANGE_FIELDS)}", where=c.where(f"{key}.per_tile"),
                    hint=f"declare a work in port for role '{port.role}' "
                         "(e.g. work: {dir: in, kind: work, record: gemm_tile})")
    if c.kind == "scheduler" and sum(p.kind == "work" and p.dir == "out"
                                     for p in c.ports.values()) != 1:
        raise ContractError(f"scheduler '{c.name}' must have exactly one work out port",
                            where=c.where("ports"),
                            hint="work: {dir: out, kind: work, record: gemm_tile, "
                                 "stages: work_stages}")


def _check_function_component(c: Contract) -> None:
    """A function component runs in no warps: it owns no roles, no shared memory and no
    barriers (its functions run in the caller's warps, on the caller's resources)."""
    owned = [section for section in ("roles", "smem", "mbarriers", "named_barriers", "tmem")
             if c.data.get(section)]
    if owned:
        raise ContractError(f"function component '{c.name}' declares {', '.join(owned)}",
                            where=c.where(owned[0]),
                            hint="its functions run in the caller's warps: drop "
                                 f"{', '.join(owned)}, or make it a stage (kind: stage)")
    wrong = [p.name for p in c.ports.values() if p.kind != "function" or p.dir != "out"]
    if wrong or not c.ports:
        raise ContractError(f"function component '{c.name}' has "
                            + (f"port(s) {', '.join(wrong)} that are not function out ports"
                               if wrong else "no ports"),
                            where=c.where("ports"),
                            hint="declare what it provides: "
                                 "mask: {dir: out, kind: function, interface: attn_mask}")


def _expressions(c: Contract):
    """Every (key, expression) in a contract."""
    for section in ("smem", "named_barriers", "tmem"):
        for name, spec in c.section(section).items():
            for k, v in spec.items():
                if k not in ("fixed", "live"):
                    yield f"{section}.{name}.{k}", v
    for name, spec in c.section("mbarriers").items():
        if isinstance(spec, dict):
            yield from ((f"mbarriers.{name}.{k}", v) for k, v in spec.items() if k != "live")
        else:
            yield f"mbarriers.{name}", spec
    if "static_smem" in c.data:
        yield "static_smem", c.data["static_smem"]
    for r in c.roles.values():
        yield f"roles.{r.name}.warps", r.warps
        yield f"roles.{r.name}.registers", r.registers
    for p in c.ports.values():
        for k in ("count", "stages", "arrivals", "consumer_arrivals", "tx_bytes", "slots",
                  "readers", "cta_group", "multicast"):
            if k in p.spec:
                yield f"ports.{p.name}.{k}", p.spec[k]
        for i, v in enumerate(p.spec.get("shape", [])):
            yield f"ports.{p.name}.shape[{i}]", v
        per_tile = p.spec.get("per_tile")
        if per_tile is not None and per_tile != PER_TILE_WORK \
                and not str(per_tile).startswith("args."):
            yield f"ports.{p.name}.per_tile", per_tile
    for i, arg in enumerate(c.data.get("args", [])):
        for j, v in enumerate(arg.get("box", [])):
            yield f"args[{i}].box[{j}]", v
        if "swizzle" in arg:
            yield f"args[{i}].swizzle", arg["swizzle"]
        if "max" in arg:
            yield f"args[{i}].max", arg["max"]
    for name, count in c.section("counters").items():
        yield f"counters.{name}", count
    for name, size in c.section("scratch").items():
        yield f"scratch.{name}", size
    for i, v in enumerate(c.data.get("cluster", [])):
        yield f"cluster[{i}]", v


def _dtype_refs(c: Contract) -> list[tuple[str, str]]:
    """(key, dtype as written) of every port and argument."""
    refs = [(f"ports.{p.name}.dtype", p.dtype) for p in c.ports.values()
            if p.kind not in ("work", "function")]
    refs += [(f"args[{i}].dtype", a["dtype"]) for i, a in enumerate(c.data.get("args", []))
             if "dtype" in a]
    return refs


# Fields the checker, the placer and the header need as one number per object: they
# may read params but no tunable.
_COMPILE_TIME = re.compile(r"roles\.\w+\.(warps|registers)|smem\.\w+\.align"
                           r"|named_barriers\.\w+\.(threads|when)|args\[\d+\]\.(box\[\d+\]|swizzle|max)"
                           r"|counters\.\w+"
                           r"|scratch\.\w+|cluster\[\d\]|tmem\.\w+\.cta_group"
                           r"|ports\.\w+\.(count|arrivals|consumer_arrivals|slots|readers|multicast"
                           r"|shape\[\d+\])")

# Fields that are conditions (one == or != comparison, 1 or 0), not sizes: whether a named
# barrier is placed at all for an instance's params.
_CONDITIONS = re.compile(r"named_barriers\.\w+\.when")


def is_condition(key: str) -> bool:
    """Whether the contract field at ``key`` is a condition rather than a size."""
    return _CONDITIONS.fullmatch(key) is not None


TMA_SWIZZLES = (0, 32, 64, 128)   # bytes; cuTensorMapEncodeTiled's four modes
TMA_MAX_RANK = 5                  # dimensions of a tiled tensor map

# (key pattern, least value, greatest value or None, why) of every expression's range.
_RANGES = (
    (r"roles\.\w+\.warps", 1, 32, "a role runs in 1..32 warps"),
    (r"roles\.\w+\.registers", 0, 255, "a thread holds at most 255 registers"),
    (r"named_barriers\.\w+\.threads", 32, 1024, "bar.sync counts whole warps, at most 1024"),
    (r"named_barriers\.\w+\.when", 0, 1, "a condition is 1 (placed) or 0 (not placed)"),
    (r"tmem\.\w+\.columns", 0, 512, "Tensor Memory has 512 columns"),
    (r"(tmem\.\w+|ports\.\w+)\.cta_group", 1, 2, "an MMA runs on one CTA or a CTA pair"),
    (r"ports\.\w+\.multicast", 1, 16, "a multicast reaches 1..16 CTAs of a cluster"),
    (r"cluster\[\d\]", 1, 16, "a cluster holds 1..16 CTAs per dimension"),
    (r"mbarriers\.\w+\.arrivals", 1, None, "an mbarrier expects at least one arrival"),
    (r"ports\.\w+\.(count|stages|arrivals|consumer_arrivals|slots|readers|shape\[\d+\])",
     1, None, "a port has at least one of each"),
    (r"smem\.\w+\.align", 1, DYNAMIC_SMEM_ALIGN,
     f"an alignment is a power of two, at most the dynamic shared memory base's "
     f"{DYNAMIC_SMEM_ALIGN} bytes (the linker can place no buffer above that)"),
    (r"counters\.\w+", 1, None, "a counters entry holds at least one counter"),
    (r"scratch\.\w+", 1, None, "a scratch entry holds at least one byte"),
    (r"args\[\d+\]\.box\[\d+\]", 1, 256, "a TMA box spans 1..256 elements"),
    (r"args\[\d+\]\.swizzle", 0, 128, "TMA swizzles 0 (none), 32, 64 or 128 bytes"),
    (r".*", 0, None, "sizes and counts are not negative"),
)


def _check_range(key: str, value: int, c: Contract) -> None:
    for pattern, low, high, why in _RANGES:
        if not re.fullmatch(pattern, key):
            continue
        limits = f"outside {low}..{high}" if high is not None else f"less than {low}"
        bad = value < low or (high is not None and value > high)
        if not bad and re.fullmatch(r"named_barriers\.\w+\.threads", key) and value % 32:
            bad, limits = True, "not a multiple of 32"
        if not bad and key.endswith(".align") and value & (value - 1):
            bad, limits = True, "not a power of two"
        if not bad and key.endswith(".swizzle") and value not in TMA_SWIZZLES:
            bad, limits = True, "not 0, 32, 64 or 128"
        if bad:
            raise ContractError(f"{value} is {limits}", where=c.where(key), hint=why)
        return


def _unbound_hint(name: str, params: dict[str, Any], tunables: dict[str, Any],
                  params_only: bool) -> str:
    """What to do about an unbound name: declare it where this field may read it, with
    the names the field may read (no tunable where it is fixed at compile time)."""
    if params_only:
        return (did_you_mean(name, params) + "declare it under params: this field is fixed "
                "when the component compiles and reads no tunable (params: "
                + (", ".join(sorted(params)) or "none") + ")")
    known = sorted({*params, *tunables})
    return (did_you_mean(name, known) + "declare it under params or tunables (known: "
            + (", ".join(known) or "none") + ")")


def _check_expressions(c: Contract) -> None:
    """Every expression parses and reads only declared params and tunables (and no
    tunable where one number per object is needed); every dtype is one, or a string
    param; tunables and live ranges are not empty."""
    params = c.params
    for key, value in _dtype_refs(c):
        if value not in expr.DTYPE_BYTES and not isinstance(params.get(value), str):
            raise ContractError(f"'{value}' is neither a dtype nor a string param",
                                where=c.where(key),
                                hint="dtypes: " + ", ".join(expr.DTYPE_BYTES))
    for name, spec in c.data.get("tunables", {}).items():
        low, high = (spec[0], spec[1]) if isinstance(spec, list) else (0, len(spec["values"]))
        if isinstance(spec, list) and low > high:
            raise ContractError(f"tunable '{name}' has the empty range [{low}, {high}]",
                                where=c.where(f"tunables.{name}"), hint="write [min, max]")
        if high - low + 1 > MAX_TUNABLE_VALUES:
            raise ContractError(f"tunable '{name}' has more than {MAX_TUNABLE_VALUES} values",
                                where=c.where(f"tunables.{name}"),
                                hint="list the values worth trying: {values: [...]}")
        if name in params:
            raise ContractError(f"'{name}' is both a param and a tunable",
                                where=c.where(f"tunables.{name}"), hint="rename one of them")
    for key, value in _expressions(c):
        params_only = _COMPILE_TIME.fullmatch(key) is not None
        for name in sorted(expr.names(value, where=c.where(key), condition=is_condition(key))):
            if name not in params and name not in c.tunables:
                raise ContractError(f"unbound name '{name}' in {key}", where=c.where(key),
                                    hint=_unbound_hint(name, params, c.tunables, params_only))
            if name in c.tunables and params_only:
                raise ContractError(
                    f"reads tunable '{name}', but this field is fixed when the component "
                    "compiles", where=c.where(key), hint="use params only in this field")
        for name in sorted(expr.sizeof_names(value)):
            if name not in expr.DTYPE_BYTES and not isinstance(params.get(name), str):
                raise ContractError(f"sizeof({name}): '{name}' is neither a dtype "
                                    "nor a string param", where=c.where(key),
                                    hint="dtypes: " + ", ".join(expr.DTYPE_BYTES))
    for i, rule in enumerate(c.data.get("requires", [])):
        key = f"requires[{i}].check"
        for name in sorted(expr.requirement_names(rule["check"], where=c.where(key))):
            if name not in params:
                raise ContractError(f"unbound name '{name}' in {key}", where=c.where(key),
                                    hint=_unbound_hint(name, params, c.tunables, True))
    for section in ("smem", "named_barriers", "mbarriers"):
        for name, spec in c.section(section).items():
            live = spec.get("live") if isinstance(spec, dict) else None
            if live and live[0] >= live[1]:
                raise ContractError(f"{section}.{name}.live {live} is empty",
                                    where=c.where(f"{section}.{name}.live"),
                                    hint="[first, last) phase indices: first < last")
    arg_names = [a["name"] for a in c.data.get("args", [])]
    if len(set(arg_names)) != len(arg_names):
        dup = sorted({n for n in arg_names if arg_names.count(n) > 1})
        raise ContractError(f"argument '{dup[0]}' is declared twice", where=c.where("args"),
                            hint="argument names are struct fields: make them unique")
    for p in c.ports.values():
        per_tile = str(p.spec.get("per_tile", ""))
        if per_tile.startswith("args.") and per_tile[5:] not in arg_names:
            raise ContractError(f"per_tile names '{per_tile}', not a declared arg",
                                where=c.where(f"ports.{p.name}.per_tile"),
                                hint="args: " + (", ".join(sorted(arg_names)) or "none"))
