"""The checker: do a recipe's components fit together, and what must be placed?

Given a recipe and the bound contract of every instance (read from the objects, so a
shipped ``.o`` is enough), :func:`check` verifies the wiring before anything is
placed: arch sets intersect; every input port is connected exactly once to a
compatible output, every ring has a consumer and every register fragment one reader;
dtype, shape, layout, stages and arrival counts agree or a known transfer bridges them;
fixed barrier ids do not collide; no dependency cycle runs through a global hand-off;
the launch names only sizes its inputs bind and binds every argument. Every problem
names both components, both ports and the field. The result is a :class:`Kernel`: the transfers,
the warp lanes, the global workspace and the :class:`~pipelink.problem.Problem` the
placer solves.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from . import expr
from .contract import RING_PORTS, BoundContract, Port
from .errors import CheckError, ContractError
from .problem import (
    ARCH_LIMITS,
    THREADS_PER_WARP,
    TMEM_MIN_COLUMNS,
    Buffer,
    NamedBarrier,
    Problem,
    Role,
    Sized,
    TmemAlloc,
    Tunable,
    static_footprint,
    tmem_allocatable,
)
from .recipe import Endpoint, Instance, Recipe
from .schema import DTYPES
from .work import (
    PARTIAL_RECORDS,
    PER_TILE_WORK,
    RECORD_ALIGN,
    RECORD_BYTES,
    RECORDS,
    accepted_records,
    record_fields,
    record_problem,
)

MBARRIER_BYTES = 8
MBARRIER_ALIGN = 8
DEFAULT_SMEM_ALIGN = 128
WORKSPACE_ALIGN = 256
MAIN_PHASE = "main"            # the one phase of a kernel that declares none
PINGPONG_TEAMS = 2             # a pingpong lane's teams, on alternate work records
CONVERTER_WARPS = 4            # one warpgroup converts a stage with 16-byte accesses
CONVERTER_REGISTERS = 64
CONVERTER_STAGES = 2           # double-buffered: conversion overlaps the consumer
TMEM_ADDRESS_SLOT = "pl.tmem_address"   # where tcgen05.alloc leaves the base address
TMEM_ADDRESS_BYTES = 4
TMEM_COLUMN_BYTES = 4               # a Tensor Memory column is 32 bits per lane
CONVERTIBLE_DTYPES = {"f32", "bf16", "f16"}
CONVERTIBLE_LAYOUTS = {"row_major", "col_major"}
TENSOR_ARGS = {"ptr", "tensormap"}     # bound to a tensor by name; the rest to an expression
HOST_SIZES = ("num_sms", "l2_bytes")   # sizes the runtime knows without a tensor
# What an integer argument of each type holds (the runtime packs it as such).
INT_RANGES = {"u32": (0, (1 << 32) - 1), "i32": (-(1 << 31), (1 << 31) - 1),
              "u64": (0, (1 << 64) - 1)}


@dataclass(frozen=True)
class Transfer:
    kind: str                      # zero_copy | conversion | registers | global
    src: Endpoint
    dst: Endpoint
    index: int                     # the recipe's connect[] entry

    @property
    def converter(self) -> str:
        return f"cvt_{self.dst.instance}_{self.dst.port}"


@dataclass(frozen=True)
class Lane:
    """Warps shared by component roles joined by register hand-offs, in call order."""

    name: str
    members: tuple[tuple[str, str], ...]     # (instance, role)
    warps: int                     # of one team: what every member's contract states
    registers: int
    warpgroup: bool
    teams: int = 1                 # pingpong: two teams of `warps` take alternate records
    phase: int = 0                 # index into Kernel.phases

    @property
    def total_warps(self) -> int:
        return self.warps * self.teams


@dataclass(frozen=True)
class GlobalSlots:
    slot_offset: int
    slot_bytes: int
    counter_offset: int
    slots: int


@dataclass(frozen=True)
class WorkRing:
    """The kernel's work ring: the scheduler's records, broadcast to every looping lane."""

    producer: Endpoint             # the scheduler's work out port
    lane: str                      # the scheduler role's lane
    record: str                    # the record's C++ type
    consumers: tuple[str, ...]     # lanes (and converters) that loop over the ring
    arrivals: int                  # on each empty barrier: one per consuming warp


@dataclass(frozen=True)
class Phase:
    """A step of the kernel: its instances' roles run on the kernel's warps after the
    phases before it. ``after``: phases every CTA must have finished, grid-wide, before
    any CTA starts this one (through a counter in the workspace)."""

    name: str
    instances: tuple[str, ...]
    after: tuple[str, ...] = ()


@dataclass(frozen=True)
class Kernel:
    recipe: Recipe
    arch: str
    bound: dict[str, BoundContract]
    transfers: tuple[Transfer, ...]
    lanes: tuple[Lane, ...]
    scheduler: str | None
    workspace: dict[str, GlobalSlots]        # "inst.port" of the producer -> slots
    workspace_bytes: int
    problem: Problem
    warnings: tuple[str, ...] = field(default_factory=tuple)
    works: tuple[WorkRing | None, ...] = ()          # each phase's work ring, if any
    tmem_allocator: tuple[str, str] | None = None   # (instance, role) that allocates TMEM
    phases: tuple[Phase, ...] = (Phase(MAIN_PHASE, ()),)   # in run order

    @property
    def work(self) -> WorkRing | None:
        """The work ring of a kernel of one phase (the first phase's otherwise)."""
        return self.works[0] if self.works else None

    def work_of(self, lane: Lane) -> WorkRing | None:
        return self.works[lane.phase] if self.works else None

    @property
    def phased(self) -> bool:
        return len(self.phases) > 1

    def phase_of(self, inst: str) -> int:
        return next((i for i, ph in enumerate(self.phases) if inst in ph.instances), 0)

    def peer(self, inst: str, port: str) -> Transfer | None:
        """The transfer feeding an input port."""
        return next((t for t in self.transfers
                     if t.dst == Endpoint(inst, port)), None)


class _Problems:
    """Collects every problem before failing, so one run reports them all."""

    def __init__(self, recipe: Recipe) -> None:
        self.recipe, self.items, self.warnings = recipe, [], []

    def add(self, key: str, message: str, hint: str = "") -> None:
        text = f"{self.recipe.where(key)}: {message}"
        self.items.append(text + (f"\n  hint: {hint}" if hint else ""))

    def warn(self, key: str, message: str) -> None:
        self.warnings.append(f"{self.recipe.where(key)}: warning: {message}")

    def raise_if_any(self) -> None:
        if self.items:
            raise CheckError(self.items)


def check(recipe: Recipe, arch: str, bound: dict[str, BoundContract]) -> Kernel:
    problems = _Problems(recipe)
    _check_instances(recipe, arch, bound, problems)
    problems.raise_if_any()
    _check_archs(recipe, arch, bound, problems)
    transfers = _check_connections(recipe, bound, problems)
    _check_function_callers(bound, transfers, problems)
    _check_fixed_barriers(bound, problems)
    _check_clusters(recipe, arch, bound, problems)
    _check_binds(recipe, bound, problems)
    _check_launch(recipe, bound, problems)
    _check_cycles(transfers, problems)
    phases = _phases(recipe, bound, problems)
    problems.raise_if_any()
    _check_phase_transfers(recipe, bound, transfers, phases, problems)
    _check_phase_order(recipe, phases, problems)
    schedulers = _schedulers(bound, phases, problems)
    scheduler = next((s for s in schedulers if s), None)
    problems.raise_if_any()
    lanes = _lanes(recipe, arch, bound, transfers, phases, problems)
    problems.raise_if_any()
    for lane in lanes:
        _check_pingpong(recipe, bound, [lane], schedulers[lane.phase], problems)
    works = tuple(_work_ring(bound, [t for t in transfers
                                     if _phase_index(phases, t.dst.instance) == i],
                             [lane for lane in lanes if lane.phase == i], sched, problems)
                  for i, sched in enumerate(schedulers))
    _check_trip_counts(recipe, bound, transfers, problems)
    _check_tmem_buffers(bound, problems)
    _check_tmem_sizes(bound, problems)
    allocator = _tmem_allocator(bound, phases, problems)
    _check_cta_pairs(recipe, bound, problems)
    problems.raise_if_any()
    workspace, workspace_bytes = _workspace(bound, phases)
    problem = _problem(recipe, arch, bound, transfers, lanes, phases, problems)
    problems.raise_if_any()
    return Kernel(recipe, arch, bound, tuple(transfers), tuple(lanes), scheduler, workspace,
                  workspace_bytes, problem, tuple(problems.warnings), works, allocator, phases)


def _check_instances(recipe: Recipe, arch: str, bound: dict[str, BoundContract],
                     problems: _Problems) -> None:
    """``bound`` holds one contract per instance of the recipe, of the component the
    recipe names for ``arch``."""
    instances = recipe.instances(arch)
    for name, inst in instances.items():
        b = bound.get(name)
        if b is None:
            problems.add(f"instances.{name}", f"no contract for instance '{name}' "
                                              f"(component '{inst.component}')",
                         "build or pass an object for every instance")
        elif b.name != inst.component:
            problems.add(f"instances.{name}", f"instance '{name}' names component "
                                              f"'{inst.component}', its object holds '{b.name}'",
                         "rebuild the instance's object")
    for name in bound:
        if name not in instances:
            problems.add("instances", f"an object was passed for '{name}', which the recipe "
                                      "does not declare", "add it under instances:")


def _check_archs(recipe: Recipe, arch: str, bound: dict[str, BoundContract],
                 problems: _Problems) -> None:
    for name, b in bound.items():
        if arch not in b.contract.archs:
            problems.add(f"instances.{name}",
                         f"component '{b.name}' supports {', '.join(b.contract.archs)}, "
                         f"not {arch}",
                         f"choose another component for {arch} with per_arch:, or drop "
                         f"{arch} from the recipe's arch")


def _port(bound: dict[str, BoundContract], end: Endpoint, recipe: Recipe, key: str,
          problems: _Problems) -> Port | None:
    b = bound.get(end.instance)
    if b is None:
        problems.add(key, f"unknown instance '{end.instance}'")
        return None
    port = b.contract.ports.get(end.port)
    if port is None:
        problems.add(key, f"component '{b.name}' (instance '{end.instance}') has no port "
                          f"'{end.port}'",
                     "its ports: " + (", ".join(sorted(b.contract.ports)) or "none"))
    return port


def _check_connections(recipe: Recipe, bound: dict[str, BoundContract],
                       problems: _Problems) -> list[Transfer]:
    transfers: list[Transfer] = []
    fed: dict[Endpoint, int] = {}
    for conn in recipe.connections:
        src = _port(bound, conn.src, recipe, conn.key, problems)
        dst = _port(bound, conn.dst, recipe, conn.key, problems)
        if src is None or dst is None:
            continue
        if src.dir != "out" or dst.dir != "in":
            problems.add(conn.key, f"'{conn.src}' is an {src.dir} port and '{conn.dst}' an "
                                   f"{dst.dir} port; a connection runs out -> in",
                         "write 'producer.out_port -> consumer.in_port'")
            continue
        if conn.dst in fed:
            problems.add(conn.key, f"input port '{conn.dst}' is connected twice "
                                   f"(connect[{fed[conn.dst]}] and connect[{conn.index}])",
                         "an input port takes exactly one producer")
            continue
        fed[conn.dst] = conn.index
        kind = _transfer_kind(bound, conn, src, dst, problems)
        first = next((t for t in transfers if t.src == conn.src), None)
        if kind == "registers" and first is not None:
            problems.add(conn.key, f"register port '{conn.src}' ({bound[conn.src.instance].name}) "
                                   f"feeds '{first.dst}' (connect[{first.index}]) and "
                                   f"'{conn.dst}' (connect[{conn.index}]); a fragment in "
                                   "registers has one reader",
                         f"keep one of the two connections; chain '{conn.dst.instance}' after "
                         f"'{first.dst.instance}' or give the producer a second output port")
            continue
        if kind:
            transfers.append(Transfer(kind, conn.src, conn.dst, conn.index))
    for name, b in bound.items():
        for port in b.contract.ports.values():
            end = Endpoint(name, port.name)
            if port.dir == "in" and end not in fed:
                problems.add(f"instances.{name}",
                             f"input port '{end}' ({port.kind}, "
                             f"{port.dtype or _reads(port.spec)}) of component "
                             f"'{b.name}' is not connected",
                             f"add 'producer.port -> {end}' under connect:")
            connected = any(t.src == end for t in transfers)
            if port.kind == "work" and port.dir == "out" \
                    and not any(c.src == end for c in recipe.connections):
                problems.add(f"instances.{name}",
                             f"work ring '{end}' of scheduler '{b.name}' has no consumer: "
                             "no role would run", f"connect '{end} -> <instance>.work' for "
                                                  "every looping role")
            elif port.dir == "out" and port.kind in RING_PORTS and not connected \
                    and not any(c.src == end for c in recipe.connections):
                problems.add(f"instances.{name}",
                             f"output ring '{end}' ({b.name}) has no consumer: its producer "
                             "would wait forever for an empty stage",
                             f"add '{end} -> consumer.port' under connect:, or remove "
                             f"instance '{name}'")
            elif port.dir == "out" and not connected:
                problems.warn(f"instances.{name}", f"output port '{end}' is not connected; "
                                                   "its producer still runs")
    _check_arrivals(bound, transfers, problems)
    _check_arrival_threads(bound, problems)
    return transfers


def _check_function_callers(bound: dict[str, BoundContract], transfers: list[Transfer],
                            problems: _Problems) -> None:
    """A caller's function symbols are named by its component and params: two instances
    of one object share them, so they must share the provider too (the glue defines
    each symbol once)."""
    provider: dict[tuple[str, str, str], Transfer] = {}
    for t in transfers:
        if t.kind != "function":
            continue
        caller = bound[t.dst.instance]
        first = provider.setdefault((caller.name, caller.params_hash(), t.dst.port), t)
        if first.src.instance != t.src.instance:
            problems.add(f"connect[{t.index}]",
                         f"'{t.dst}' and '{first.dst}' are instances of one object "
                         f"({bound[t.dst.instance].name}, same params) whose function port "
                         f"'{t.dst.port}' is connected to two providers ('{first.src}' and "
                         f"'{t.src}'); the linked kernel holds one definition of its "
                         "functions", "connect both to one provider, or give the instances "
                                      "different params (two objects)")


def _reads(spec: dict[str, Any]) -> str:
    """What a work port reads, as an error names it: its record types, or its fields."""
    return " or ".join(accepted_records(spec)) or ", ".join(record_fields(spec))


def _field(b: BoundContract, port: Port, name: str) -> Any:
    """A port field, evaluated where it does not depend on tunables."""
    value = port.spec.get(name)
    if name == "dtype":
        return b.dtype(port.dtype, f"ports.{port.name}.dtype")
    if name == "layout":
        return b.layout(port.name)
    if value is None:
        return value
    key = f"ports.{port.name}.{name}"
    if name == "shape":
        return [b.eval(v, f"{key}[{i}]") for i, v in enumerate(value)]
    return value if b.depends(value) else b.eval(value, key)


def _transfer_kind(bound: dict[str, BoundContract], conn: Any, src: Port, dst: Port,
                   problems: _Problems) -> str | None:
    sb, db = bound[conn.src.instance], bound[conn.dst.instance]
    pair = f"'{conn.src}' ({sb.name}) -> '{conn.dst}' ({db.name})"
    if src.kind != dst.kind:
        problems.add(conn.key, f"{pair}: port kinds differ: {src.kind} vs {dst.kind}",
                     "connect ports of the same kind")
        return None
    if src.kind == "function":
        interfaces = (src.spec["interface"], dst.spec["interface"])
        if interfaces[0] != interfaces[1]:
            problems.add(conn.key, f"{pair}: the caller calls interface {interfaces[1]}, the "
                                   f"provider provides {interfaces[0]}",
                         f"connect a provider of {interfaces[1]} to '{conn.dst}'")
            return None
        return "function"
    if src.kind == "work":
        kind = _work_kind(conn.key, pair, src, dst, problems)
        if kind and src.spec["record"] in PARTIAL_RECORDS:
            shapes = (_field(sb, src, "shape"), _field(db, dst, "shape"))
            if shapes[0] != shapes[1]:
                problems.add(conn.key, f"{pair}: the pieces of a {src.spec['record']} meet "
                                       f"as partial tiles of shape {shapes[0]}, the "
                                       f"consumer's tile is {shapes[1]}",
                             "give the scheduler the consumer's tile shape (its params "
                             "tile_m, tile_n)")
                return None
        return kind
    differs = {f: (_field(sb, src, f), _field(db, dst, f))
               for f in ("dtype", "shape", "layout", "count")
               if _field(sb, src, f) != _field(db, dst, f)}
    if src.kind == "registers":
        if differs:
            _mismatch(problems, conn.key, pair, differs,
                      "a register hand-off needs one fragment: same dtype, count and layout")
            return None
        return "registers"
    if src.kind == "tmem":
        groups = (_field(sb, src, "cta_group") or 1, _field(db, dst, "cta_group") or 1)
        if groups[0] != groups[1]:
            differs["cta_group"] = groups
        if differs:
            _mismatch(problems, conn.key, pair, differs,
                      "Tensor Memory is read where the MMA wrote it: the producer's and the "
                      "consumer's dtype, tile shape and lane layout must be equal")
            return None
        stage_problem = _stages(sb, src, db, dst)
        if stage_problem:
            problems.add(conn.key, f"{pair}: field 'stages': {stage_problem}",
                         "give both ports the same number of accumulator buffers")
            return None
        return "zero_copy"
    if src.kind == "global":
        differs.pop("layout", None)
        if differs:
            _mismatch(problems, conn.key, pair, differs, "global slots must agree")
            return None
        return "global"
    if "shape" in differs:
        _mismatch(problems, conn.key, pair, {"shape": differs["shape"]},
                  "no transfer reshapes a tile: make the tile shapes equal")
        return None
    casts = (_field(sb, src, "multicast") or 1, _field(db, dst, "multicast") or 1)
    if casts[0] != casts[1]:
        _mismatch(problems, conn.key, pair, {"multicast": casts},
                  "a stage filled by a multicast is released in every CTA it reached: the "
                  "producer and the reader must say the same multicast")
        return None
    if not differs:
        stage_problem = _stages(sb, src, db, dst)
        if stage_problem:
            problems.add(conn.key, f"{pair}: field 'stages': {stage_problem}",
                         "give both ports the same stages, or make one a tunable")
            return None
        tx_s, tx_d = _field(sb, src, "tx_bytes"), _field(db, dst, "tx_bytes")
        if tx_d is not None and tx_s != tx_d:
            _mismatch(problems, conn.key, pair, {"tx_bytes": (tx_s, tx_d)},
                      "the consumer expects another byte count per stage")
            return None
        return "zero_copy"
    dtypes = {_field(sb, src, "dtype"), _field(db, dst, "dtype")}
    layouts = {sb.layout(src.name), db.layout(dst.name)}
    if dtypes <= CONVERTIBLE_DTYPES and layouts <= CONVERTIBLE_LAYOUTS:
        consumer = _stage_domain(db, dst)
        if CONVERTER_STAGES not in consumer:
            problems.add(conn.key, f"{pair}: field 'stages': the generated conversion "
                                   f"feeds '{conn.dst}' a ring of {CONVERTER_STAGES} stages, it "
                                   f"takes {sorted(consumer)}",
                         f"let the consumer's stages be a tunable that includes "
                         f"{CONVERTER_STAGES}")
            return None
        return "conversion"
    _mismatch(problems, conn.key, pair, differs,
              "a generated conversion handles dtypes " + "/".join(sorted(CONVERTIBLE_DTYPES))
              + " and layouts " + "/".join(sorted(CONVERTIBLE_LAYOUTS)))
    return None


def _work_kind(key: str, pair: str, src: Port, dst: Port, problems: _Problems) -> str | None:
    """A consumer understands the record when it names the record type among those it
    handles, or lists only fields the producer's record has (and reads them right)."""
    problem = record_problem(src.spec["record"], dst.spec)
    if problem:
        problems.add(key, f"{pair}: {problem[0]}", problem[1])
        return None
    return "work"


def _mismatch(problems: _Problems, key: str, pair: str, differs: dict[str, tuple],
              hint: str) -> None:
    for name, (a, b) in sorted(differs.items()):
        problems.add(key, f"{pair}: field '{name}' differs: {a} vs {b}", hint)


def _stage_domain(b: BoundContract, p: Port) -> set[int]:
    """Every value a port's stages can take."""
    _, table = b.tabulate(p.spec["stages"], f"ports.{p.name}.stages")
    return {v for _, v in table}


def _stages(sb: BoundContract, src: Port, db: BoundContract, dst: Port) -> str | None:
    """Stages must be able to agree: equal constants, or plain tunables with a shared
    value (the placer then picks one for both, see :func:`_stage_pins`)."""
    for b, p in ((sb, src), (db, dst)):
        stages = p.spec["stages"]
        if b.depends(stages) and stages not in b.contract.tunables:
            return (f"'{b.name}.{p.name}' computes its stages ({stages!r}) from tunables; a "
                    "zero-copy ring needs a constant or one tunable by name")
    common = _stage_domain(sb, src) & _stage_domain(db, dst)
    if not common:
        return (f"{sorted(_stage_domain(sb, src))} vs {sorted(_stage_domain(db, dst))} have "
                "no value in common")
    return None


def _stage_pins(bound: dict[str, BoundContract],
                transfers: list[Transfer]) -> dict[str, set[int]]:
    """Values a tunable that names a ring's stages may take: a zero-copy pair shares
    one ring, so each side's tunable keeps only the values the other side allows; a
    consumer fed by a generated conversion reads the converter's ring."""
    pins: dict[str, set[int]] = {}

    def pin(end: Endpoint, allowed: set[int]) -> None:
        b = bound[end.instance]
        stages = b.contract.ports[end.port].spec["stages"]
        if isinstance(stages, str) and stages in b.contract.tunables:
            key = f"{end.instance}.{stages}"
            pins[key] = pins.get(key, allowed) & allowed

    for t in transfers:
        if t.kind == "zero_copy":
            src = bound[t.src.instance].contract.ports[t.src.port]
            dst = bound[t.dst.instance].contract.ports[t.dst.port]
            common = (_stage_domain(bound[t.src.instance], src)
                      & _stage_domain(bound[t.dst.instance], dst))
            pin(t.src, common)
            pin(t.dst, common)
        elif t.kind == "conversion":
            pin(t.dst, {CONVERTER_STAGES})
    return pins


def _check_arrivals(bound: dict[str, BoundContract], transfers: list[Transfer],
                    problems: _Problems) -> None:
    for t in transfers:
        if t.kind != "zero_copy":
            continue
        src = bound[t.src.instance].contract.ports[t.src.port]
        expected = src.spec.get("consumer_arrivals")
        if expected is None:
            continue
        sb = bound[t.src.instance]
        consumers = [u for u in transfers if u.src == t.src and u.kind == "zero_copy"]
        total = sum(_arrivals(bound, u.dst) for u in consumers)
        want = sb.eval(expected, f"ports.{src.name}.consumer_arrivals")
        if total != want and t == consumers[0]:
            who = " + ".join(f"{u.dst} {_arrivals(bound, u.dst)}" for u in consumers)
            problems.add(f"connect[{t.index}]",
                         f"'{t.src}' ({sb.name}) expects {want} arrivals per stage on its "
                         f"empty barrier, its consumers make {total} ({who})",
                         "make the consumers' 'arrivals' add up to the producer's "
                         "'consumer_arrivals'")


def _check_arrival_threads(bound: dict[str, BoundContract], problems: _Problems) -> None:
    """Each side of a ring arrives from its own threads: a count above them, or an
    mbarrier that states another count than the port, never completes a phase."""
    for inst, b in bound.items():
        for port in b.contract.ports.values():
            if port.kind not in RING_PORTS or port.role not in b.contract.roles:
                continue
            arrivals = b.eval(port.spec["arrivals"], f"ports.{port.name}.arrivals")
            warps = b.eval(b.contract.roles[port.role].warps, f"roles.{port.role}.warps")
            if arrivals > 32 * warps:
                side = "full" if port.dir == "out" else "empty"
                problems.add(f"instances.{inst}",
                             f"port '{inst}.{port.name}' ({b.name}) makes {arrivals} arrivals "
                             f"per stage on its {side} barrier, but its role '{port.role}' "
                             f"runs {32 * warps} threads ({warps} warps)",
                             f"make ports.{port.name}.arrivals at most {32 * warps} in "
                             f"{b.contract.path}")
            if port.dir != "out":
                continue
            spec = b.contract.section("mbarriers").get(port.spec.get("full"))
            if isinstance(spec, dict) and "arrivals" in spec:
                stated = b.eval(spec["arrivals"], f"mbarriers.{port.spec['full']}.arrivals")
                if stated != arrivals:
                    problems.add(f"instances.{inst}",
                                 f"port '{inst}.{port.name}' ({b.name}) arrives {arrivals} "
                                 f"time(s) per stage on mbarrier '{port.spec['full']}', which "
                                 f"states arrivals: {stated}",
                                 f"make mbarriers.{port.spec['full']}.arrivals and "
                                 f"ports.{port.name}.arrivals agree in {b.contract.path}")


def _check_tmem_buffers(bound: dict[str, BoundContract], problems: _Problems) -> None:
    """A tmem out port's buffer holds `stages` equal slots, each at least its tile wide:
    one 32-bit column per element of a row (rows are lanes), for every tunable choice.
    A slot may be wider than the tile (a power-of-two stride), never narrower."""
    for inst, b in bound.items():
        for port in b.contract.ports.values():
            if port.kind != "tmem" or port.dir != "out":
                continue
            spec, buffer = port.spec, port.spec["buffer"]
            words = max(1, expr.DTYPE_BYTES[b.dtype(port.dtype, port.name)] // TMEM_COLUMN_BYTES)
            want = f"({spec['stages']})*({spec['shape'][-1]})*{words}"
            have = b.contract.section("tmem")[buffer]["columns"]
            _, short = b.tabulate(f"({want}) - ({have})", f"tmem.{buffer}.columns")
            _, uneven = b.tabulate(f"({have}) % ({spec['stages']})", f"tmem.{buffer}.columns")
            if any(value > 0 for _, value in short) or any(value for _, value in uneven):
                problems.add(f"instances.{inst}",
                             f"tmem port '{inst}.{port.name}' ({b.name}) holds {spec['stages']} "
                             f"buffers of {spec['shape'][-1]} columns, but tmem.{buffer} has "
                             f"{have} columns", f"make tmem.{buffer}.columns "
                                                f"{spec['stages']} * {spec['shape'][-1]} (or "
                                                f"{spec['stages']} equal wider slots) in "
                                                f"{b.contract.path}")


def _check_tmem_sizes(bound: dict[str, BoundContract], problems: _Problems) -> None:
    """Every Tensor Memory allocation is a power of two of at least 32 columns, for every
    tunable choice (tcgen05.alloc's rule, and the placer aligns each to its size):
    refused here rather than when the placer meets it."""
    for inst, b in bound.items():
        for name, spec in (b.contract.section("tmem") or {}).items():
            key = f"tmem.{name}.columns"
            _, table = b.tabulate(spec["columns"], key)
            bad = sorted({v for _, v in table if not tmem_allocatable(v)})
            if bad:
                problems.add(f"instances.{inst}",
                             f"tensor memory '{inst}.{name}' ({b.name}) is "
                             f"{', '.join(map(str, bad))} columns: allocations are powers of "
                             f"two of at least {TMEM_MIN_COLUMNS}",
                             f"round {key} up in {b.contract.path}, e.g. "
                             f"pow2_ceil({spec['columns']}), or change the params")


def component_cluster(b: BoundContract) -> tuple[int, ...]:
    """The cluster shape a component states, its params bound."""
    return tuple(b.eval(c, f"cluster[{i}]") for i, c in enumerate(b.contract.data["cluster"]))


def _tmem_groups(bound: dict[str, BoundContract]) -> dict[str, int]:
    """The CTA group ("inst.name" -> 1 or 2) of every Tensor Memory allocation."""
    return {f"{inst}.{name}": b.eval(spec.get("cta_group", 1), f"tmem.{name}.cta_group")
            for inst, b in bound.items() for name, spec in b.contract.section("tmem").items()}


def tmem_cta_group(bound: dict[str, BoundContract]) -> int:
    """The CTA group the kernel's Tensor Memory is allocated for: 2 when any allocation
    is a CTA pair's (checked to agree by _check_cta_pairs), else 1."""
    return max(_tmem_groups(bound).values(), default=1)


def _check_cta_pairs(recipe: Recipe, bound: dict[str, BoundContract],
                     problems: _Problems) -> None:
    """A component that needs a cluster shape gets it from the recipe (it cannot be
    inferred: the grid and the runtime depend on it); a CTA-pair (cta_group::2) Tensor
    Memory allocation needs a cluster of exactly two CTAs along x, and one kernel
    allocates Tensor Memory for one group."""
    launch = recipe.launch.get("cluster")
    for inst, b in bound.items():
        wanted = component_cluster(b) if "cluster" in b.contract.data else None
        if wanted and launch is None and any(c != 1 for c in wanted):
            problems.add(f"instances.{inst}",
                         f"{inst} ({b.name}) runs in a cluster of {list(wanted)} CTAs, but "
                         "the recipe launches no cluster",
                         f"add cluster: {list(wanted)} under launch:")
    pairs = _tmem_groups(bound)
    if len(set(pairs.values())) > 1:
        listing = ", ".join(f"{k} cta_group {v}" for k, v in sorted(pairs.items()))
        problems.add("instances", f"Tensor Memory is allocated once per kernel, for one CTA "
                                  f"group, but {listing}",
                     "use components of one CTA group (all cta_group::1 or all ::2)")
    paired = sorted(k for k, v in pairs.items() if v == 2)
    if paired and list(launch or [1, 1, 1]) != [2, 1, 1]:
        inst = paired[0].split(".")[0]
        problems.add(f"instances.{inst}",
                     f"{', '.join(paired)} is a CTA pair's Tensor Memory (a 2-CTA MMA), which "
                     f"needs a cluster of 2 CTAs; the recipe launches "
                     f"{list(launch) if launch else 'no cluster'}",
                     "add cluster: [2, 1, 1] under launch:")


def _tmem_allocator(bound: dict[str, BoundContract], phases: tuple[Phase, ...],
                    problems: _Problems) -> tuple[str, str] | None:
    """The role whose first warp allocates the kernel's Tensor Memory (uses:
    [tmem_alloc]): one per phase at most (phases run on the same warps, and the kernel
    allocates once, for its widest phase); the first phase's. None when no component
    asks for Tensor Memory."""
    users = [inst for inst, b in bound.items() if b.contract.section("tmem")]
    owners = [(inst, role) for inst, b in bound.items()
              for role, spec in sorted(b.contract.roles.items()) if "tmem_alloc" in spec.uses]
    per_phase: dict[int, list[tuple[str, str]]] = {}
    for owner in owners:
        per_phase.setdefault(_phase_index(phases, owner[0]), []).append(owner)
    crowded = next((o for o in per_phase.values() if len(o) > 1), None)
    if users and not owners:
        problems.add(f"instances.{users[0]}",
                     f"{', '.join(users)} ask(s) for Tensor Memory, but no role allocates it",
                     "give the role that issues the MMAs 'uses: [tmem_alloc]' in its contract")
    elif crowded:
        problems.add(f"instances.{crowded[1][0]}",
                     "Tensor Memory is allocated once per CTA, but roles "
                     + ", ".join(f"{i}.{r}" for i, r in crowded) + " all say uses: [tmem_alloc]",
                     "keep tmem_alloc on one role (the one that issues the MMAs)")
    elif owners and not users:
        problems.warn(f"instances.{owners[0][0]}",
                      f"{owners[0][0]}.{owners[0][1]} allocates Tensor Memory, but no "
                      "component asks for any")
    return owners[0] if users and owners and not crowded else None


def _arrivals(bound: dict[str, BoundContract], end: Endpoint) -> int:
    b = bound[end.instance]
    return b.eval(b.contract.ports[end.port].spec["arrivals"], f"ports.{end.port}.arrivals")


def _check_fixed_barriers(bound: dict[str, BoundContract], problems: _Problems) -> None:
    owners: dict[int, str] = {}
    for name, b in bound.items():
        for bar, spec in sorted(b.named_barriers().items()):
            fixed = spec.get("fixed")
            if fixed is None:
                continue
            here = f"{name}.{bar} ({b.name}, {b.contract.path})"
            if fixed in owners:
                problems.add(f"instances.{name}",
                             f"named barrier id {fixed} is fixed by both {owners[fixed]} and "
                             f"{here}",
                             "declare one of them relocatable (drop 'fixed:') so the linker "
                             "can move it")
            else:
                owners[fixed] = here


def _check_clusters(recipe: Recipe, arch: str, bound: dict[str, BoundContract],
                    problems: _Problems) -> None:
    """Components that state a cluster shape agree with the launch's, and no cluster
    holds more CTAs than the arch's portable maximum: the runtime launches with no
    non-portable cluster size attribute, so a larger one is refused at every launch
    (nvcc compiles it all the same)."""
    shapes = {name: component_cluster(b) for name, b in bound.items()
              if "cluster" in b.contract.data}
    wanted = recipe.launch.get("cluster")
    if wanted is not None:
        shapes["launch.cluster"] = tuple(wanted)
    most = ARCH_LIMITS[arch]["cluster_ctas"]
    for name, shape in sorted(shapes.items()):
        if math.prod(shape) <= most:
            continue
        launch = name == "launch.cluster"
        who = "the kernel" if launch else f"{name} ({bound[name].name})"
        problems.add(name if launch else f"instances.{name}",
                     f"{who} runs in a cluster of {list(shape)}, {math.prod(shape)} CTAs, more "
                     f"than the {most} a cluster holds portably on {arch}: a larger one needs "
                     "the non-portable cluster size attribute and a GPU that has it, and "
                     "would fail to launch",
                     f"use at most {most} CTAs in all (x * y * z) "
                     + ("under launch.cluster" if launch
                        else f"in {bound[name].contract.path}: cluster, or its params"))
    if len(set(shapes.values())) > 1:
        listing = ", ".join(f"{k} {list(v)}" for k, v in sorted(shapes.items()))
        problems.add("launch.cluster", f"cluster shapes disagree: {listing}",
                     "components of one kernel share one cluster shape")


def _check_binds(recipe: Recipe, bound: dict[str, BoundContract],
                 problems: _Problems) -> None:
    """launch.bind names 'instance.arg' of runtime arguments that exist: a typo would
    otherwise surface only when the kernel is launched."""
    for key in recipe.launch.get("bind", {}):
        inst, dot, arg = str(key).partition(".")
        if not dot:
            problems.add(f"launch.bind.{key}", f"bind key '{key}' names no argument: a key "
                         "is instance.argument", "e.g. " + next(
                             (f"{i}.{a['name']}" for i, b in bound.items()
                              for a in b.contract.data.get("args", [])), "load.k_tiles"))
            continue
        b = bound.get(inst)
        if b is None:
            problems.add(f"launch.bind.{key}", f"'{key}' names instance '{inst}', which is "
                                               "not under instances",
                         "instances: " + ", ".join(bound))
            continue
        args = [a["name"] for a in b.contract.data.get("args", [])]
        if arg not in args:
            problems.add(f"launch.bind.{key}", f"component '{b.name}' (instance '{inst}') has "
                                               f"no argument '{arg}'",
                         "its args: " + (", ".join(args) or "none"))


def _check_launch(recipe: Recipe, bound: dict[str, BoundContract],
                  problems: _Problems) -> None:
    """The host side of the launch, as the runtime will read it from kernel.json: every
    size an expression names comes from an input's shape (or the runtime), every
    argument is bound (a tensor to a pointer or tensor map, an expression to a scalar),
    every tensor has a known dtype. Without this a typo ships and fails at the call."""
    launch = recipe.launch
    if not launch.get("inputs") and not launch.get("bind"):
        return  # launched by hand (LinkedKernel.launch): nothing to check here
    tensors: dict[str, str] = {}
    sizes = set(HOST_SIZES)
    for group in ("inputs", "outputs"):
        for name, spec in launch.get(group, {}).items():
            if name in tensors:   # one name, two tensors: a bind could not tell which
                problems.add(f"launch.outputs.{name}", f"output '{name}' has the name of an "
                             "input: a bind or autograd could not tell which tensor it means",
                             "rename the output (or mark the input writes: true to write "
                             "into it)")
                continue
            tensors[name] = group
            if spec.get("dtype") not in DTYPES:
                problems.add(f"launch.{group}.{name}.dtype",
                             f"{group[:-1]} '{name}' has dtype {spec.get('dtype')!r}, which "
                             "PipeLink does not know", "use one of " + ", ".join(DTYPES))
    for group in ("inputs", "outputs"):
        for name, spec in launch.get(group, {}).items():
            for i, dim in enumerate(spec.get("shape", [])):
                if isinstance(dim, int) and dim < 1:   # else the knock-on "names no size"
                    problems.add(f"launch.{group}.{name}.shape[{i}]",
                                 f"{group[:-1]} '{name}' has dimension {dim}",
                                 "give a size's name, an expression over sizes, or an "
                                 "integer >= 1")
    for spec in launch.get("inputs", {}).values():
        sizes |= {d for d in spec.get("shape", []) if isinstance(d, str) and d.isidentifier()}
    for name, group in tensors.items():
        if name in sizes:
            what = "a size the runtime gives" if name in HOST_SIZES else "an input dimension"
            problems.add(f"launch.{group}.{name}", f"{group[:-1]} '{name}' has the name of "
                         f"{what}: a bind could not tell the tensor from the size",
                         "rename the tensor")
    for name in launch.get("scalars", {}):
        if name in sizes or name in tensors:
            what = "a tensor" if name in tensors else (
                "a size the runtime gives" if name in HOST_SIZES else "an input dimension")
            problems.add(f"launch.scalars.{name}",
                         f"scalar '{name}' has the name of {what}: a call could not tell "
                         "which value it means", "rename the scalar")
        sizes.add(name)

    def names_known(value: Any, key: str) -> None:
        _sizes_known(problems, key, value, sizes)

    for group in ("inputs", "outputs"):
        for name, spec in launch.get(group, {}).items():
            for i, dim in enumerate(spec.get("shape", [])):
                if not (group == "inputs" and isinstance(dim, str) and dim.isidentifier()):
                    names_known(dim, f"launch.{group}.{name}.shape[{i}]")
    for i, condition in enumerate(launch.get("require", [])):
        _condition_known(problems, f"launch.require[{i}]", condition, sizes)
        _condition_satisfiable(problems, f"launch.require[{i}]", condition)
    for name, rules in launch.get("contents", {}).items():
        if name not in launch.get("inputs", {}):
            problems.add(f"launch.contents.{name}", f"'{name}' is not an input of the launch",
                         "name an index tensor under launch.inputs")
            continue
        for key in ("first", "last", "min", "max"):
            if key in rules:
                names_known(rules[key], f"launch.contents.{name}.{key}")
    if not launch.get("persistent"):
        for i, dim in enumerate(launch.get("grid", [])):
            names_known(dim, f"launch.grid[{i}]")
            fixed = _constant(dim)
            if fixed is not None and fixed < 1:   # the runtime refuses an empty grid
                problems.add(f"launch.grid[{i}]", f"the grid's {'xyz'[i]} dimension is {fixed} for "
                             "every call: each launch would be refused as an empty grid",
                             "give each dimension at least one CTA, e.g. ceil_div(M, 128)")
    elif "grid" in launch:   # the runtime would size the grid to the SMs and drop this one
        problems.add("launch.grid", "a persistent launch has one CTA per SM (or as many as "
                     "stay resident): this grid would be ignored",
                     "drop launch.grid, or launch.persistent for a grid of that size")
    binds = launch.get("bind", {})
    for key, value in binds.items():
        inst, _, arg = str(key).partition(".")
        spec = _arg(bound, inst, arg)
        if spec is None:
            continue  # _check_binds said so
        wants_tensor = spec["type"] in TENSOR_ARGS
        is_tensor = isinstance(value, str) and value in tensors
        if wants_tensor and not is_tensor:
            problems.add(f"launch.bind.{key}",
                         f"argument '{key}' is a {spec['type']}: bind it to a tensor, not "
                         f"{value!r}", "tensors: " + (", ".join(tensors) or "none")
                         + " (launch.inputs and launch.outputs)")
        elif is_tensor and not wants_tensor:
            problems.add(f"launch.bind.{key}",
                         f"argument '{key}' is a {spec['type']} scalar, bound to tensor "
                         f"'{value}'", "bind an expression over the sizes")
        elif not wants_tensor:
            names_known(value, f"launch.bind.{key}")
            _check_arg_max(bound[inst], key, spec, value, problems)
        elif spec.get("dtype"):
            want = bound[inst].dtype(spec["dtype"], f"args.{arg}.dtype")
            have = launch[tensors[value]][value].get("dtype")
            if have in DTYPES and have != want:
                problems.add(f"launch.bind.{key}",
                             f"argument '{key}' ({spec['type']}) takes {want} elements, "
                             f"tensor '{value}' is {have}",
                             f"make launch.{tensors[value]}.{value}.dtype {want}, or bind "
                             "another tensor")
    bound_names = {value for value in binds.values() if isinstance(value, str)}
    for name in launch.get("outputs", {}):
        if name not in bound_names:   # else the op returns the allocator's leftovers
            problems.add(f"launch.outputs.{name}",
                         f"output '{name}' is bound to no argument: no component writes it, "
                         "so every call would return uninitialised memory",
                         f"bind it to the argument that writes it under launch.bind "
                         f"(<instance>.<argument>: {name}), or remove the output")
    for inst, b in bound.items():
        for spec in b.contract.data.get("args", []):
            if f"{inst}.{spec['name']}" not in binds:
                problems.add("launch.bind",
                             f"argument '{inst}.{spec['name']}' ({spec['type']}) of component "
                             f"'{b.name}' is not bound: the kernel would read garbage",
                             f"add '{inst}.{spec['name']}: <"
                             + ("tensor" if spec["type"] in TENSOR_ARGS else "expression")
                             + ">' under launch.bind")


def _constant(value: Any) -> int | None:
    """A launch expression's value when it names no size (None otherwise, or when it does
    not evaluate: that is reported where it is read)."""
    try:
        return expr.constant(value)
    except ContractError:
        return None


def _check_arg_max(b: BoundContract, key: str, spec: dict[str, Any], value: Any,
                   problems: _Problems) -> None:
    """A literal bound (or an expression that names no size) outside the argument's type,
    or above its ``max`` (what the object was built to handle), is refused here; an
    expression over sizes is checked by the runtime (arg_requires)."""
    fixed = value if isinstance(value, int) and not isinstance(value, bool) \
        else _constant(value)     # an expression that names no size: one value too
    if fixed is None:
        return
    shown = str(fixed) if fixed is value else f"{value!r}, which is {fixed}"
    low, high = INT_RANGES.get(spec["type"], (fixed, fixed))
    if not low <= fixed <= high:   # else every call would be refused at launch
        problems.add(f"launch.bind.{key}",
                     f"argument '{key}' is a {spec['type']}, which holds {low}..{high}; "
                     f"bound to {shown}", "bind a value in that range")
        return
    if "max" not in spec:
        return
    most = b.eval(spec["max"], f"args.{spec['name']}.max")
    if fixed > most:
        problems.add(f"launch.bind.{key}",
                     f"argument '{key}' of component '{b.name}' handles at most {most} "
                     f"(max: {spec['max']}), bound to {shown}",
                     f"bind at most {most}, or build '{b.name}' with larger params")


def arg_requires(kernel: Kernel) -> list[str]:
    """Runtime conditions for scalar arguments with a ``max`` bound to an expression
    over sizes ("K * 2 <= 8"): kernel.json lists them beside launch.require, so a call
    whose sizes exceed what an object handles is refused before it launches."""
    out = []
    for key, value in sorted(kernel.recipe.launch.get("bind", {}).items()):
        inst, _, arg = str(key).partition(".")
        spec = _arg(kernel.bound, inst, arg)
        if spec is None or "max" not in spec or isinstance(value, int):
            continue
        most = kernel.bound[inst].eval(spec["max"], f"args.{arg}.max")
        out.append(f"{value} <= {most}")
    return out


def _arg(bound: dict[str, BoundContract], inst: str, arg: str) -> dict[str, Any] | None:
    b = bound.get(inst)
    if b is None:
        return None
    return next((a for a in b.contract.data.get("args", []) if a["name"] == arg), None)


def _check_cycles(transfers: list[Transfer], problems: _Problems) -> None:
    """A global hand-off makes its consumer wait for its producer's publish; a cycle of
    dependencies through one never starts (``a.out -> b.inp, b.out -> a.inp``)."""
    out: dict[str, list[Transfer]] = {}
    for t in sorted(transfers, key=lambda t: t.index):
        out.setdefault(t.src.instance, []).append(t)
    seen: set[frozenset[int]] = set()
    for start in sorted((t for t in transfers if t.kind == "global"), key=lambda t: t.index):
        path = _path(out, start.dst.instance, start.src.instance)
        if path is None:
            continue
        cycle = [start, *path]
        ids = frozenset(t.index for t in cycle)
        if ids in seen:
            continue
        seen.add(ids)
        steps = ", ".join(f"{t.src} -> {t.dst} (connect[{t.index}], {t.kind})" for t in cycle)
        names = " -> ".join([t.src.instance for t in cycle] + [start.src.instance])
        problems.add(f"connect[{start.index}]",
                     f"dependency cycle through a global hand-off: {names}: {steps}; each "
                     "waits for the other's publish, so none starts",
                     f"remove one of these connections (e.g. connect[{cycle[-1].index}]); a "
                     "global hand-off must run one way")


def _path(out: dict[str, list[Transfer]], src: str, dst: str) -> list[Transfer] | None:
    """The first path of transfers from instance ``src`` to ``dst`` (breadth first, in
    connect order, so the message is the same every run)."""
    if src == dst:
        return []
    parent: dict[str, Transfer] = {}
    queue, seen = [src], {src}
    while queue:
        here = queue.pop(0)
        for t in out.get(here, []):
            nxt = t.dst.instance
            if nxt in seen:
                continue
            parent[nxt], seen = t, seen | {nxt}
            if nxt == dst:
                path = [t]
                while path[0].src.instance != src:
                    path.insert(0, parent[path[0].src.instance])
                return path
            queue.append(nxt)
    return None


def _schedulers(bound: dict[str, BoundContract], phases: tuple[Phase, ...],
                problems: _Problems) -> list[str | None]:
    """Each phase's scheduler (None where a phase has none): at most one per phase."""
    out = []
    for i, phase in enumerate(phases):
        found = [n for n, b in bound.items() if b.contract.kind == "scheduler"
                 and _phase_index(phases, n) == i]
        if len(found) > 1:
            key = "instances" if phase.name == MAIN_PHASE else f"phases.{phase.name}"
            problems.add(key, "more than one scheduler: " + ", ".join(found),
                         "a phase iterates over one sequence of work tiles: split them "
                         "into phases (phases: {name: {instances: [...]}})")
        out.append(found[0] if found else None)
    return out


def _phase_index(phases: tuple[Phase, ...], inst: str) -> int:
    return next((i for i, ph in enumerate(phases) if inst in ph.instances), 0)


def _phases(recipe: Recipe, bound: dict[str, BoundContract],
            problems: _Problems) -> tuple[Phase, ...]:
    """The recipe's phases in run order: each after those it names (recipe order where
    free). Every instance runs in exactly one phase; a cycle of `after` is refused."""
    spec = recipe.phases
    if not spec:
        return (Phase(MAIN_PHASE, tuple(bound)),)
    owner: dict[str, str] = {}
    for name, ph in spec.items():
        for inst in ph["instances"]:
            if inst not in bound:
                problems.add(f"phases.{name}.instances", f"phase '{name}' names instance "
                             f"'{inst}', which is not under instances",
                             "instances: " + ", ".join(bound))
            elif inst in owner:
                problems.add(f"phases.{name}.instances", f"instance '{inst}' is in phases "
                             f"'{owner[inst]}' and '{name}'", "give each instance one phase")
            else:
                owner[inst] = name
        for dep in ph.get("after", []):
            if dep not in spec:
                problems.add(f"phases.{name}.after", f"phase '{name}' runs after '{dep}', "
                             "which is not a phase", "phases: " + ", ".join(spec))
    for inst in bound:
        if inst not in owner:
            problems.add(f"instances.{inst}", f"instance '{inst}' is in no phase",
                         "list it under the instances of one of phases: "
                         + ", ".join(spec))
    order: list[str] = []
    while len(order) < len(spec):
        ready = [n for n, ph in spec.items() if n not in order
                 and all(d in order or d not in spec for d in ph.get("after", []))]
        if not ready:
            cycle = [n for n in spec if n not in order]
            problems.add(f"phases.{cycle[0]}.after", "phases wait for each other in a cycle: "
                         + " -> ".join(cycle + [cycle[0]]),
                         "a phase can only wait for phases that do not wait for it")
            order += cycle
            break
        order.append(ready[0])
    return tuple(Phase(n, tuple(spec[n]["instances"]), tuple(spec[n].get("after", [])))
                 for n in order)


def _check_phase_transfers(recipe: Recipe, bound: dict[str, BoundContract],
                           transfers: list[Transfer], phases: tuple[Phase, ...],
                           problems: _Problems) -> None:
    """Phases meet only through global memory: a ring, a register hand-off or a work
    record never crosses from one phase to another (its other end has left)."""
    if len(phases) == 1:
        return
    if not recipe.launch.get("persistent"):
        problems.add("launch.persistent", "a kernel of several phases needs launch: "
                     "{persistent: true}: its CTAs wait for each other between phases, so "
                     "all of them must be resident at once", "set launch.persistent: true")
    if recipe.launch.get("cluster"):
        problems.add("launch.cluster", "a kernel of several phases is launched cooperatively, "
                     "which does not take a cluster shape", "drop launch.cluster, or split "
                     "the kernel")
    for t in transfers:
        src, dst = (_phase_index(phases, e.instance) for e in (t.src, t.dst))
        if t.kind not in ("global", "function") and src != dst:
            problems.add(f"connect[{t.index}]", f"'{t.src}' is in phase "
                         f"'{phases[src].name}' and '{t.dst}' in '{phases[dst].name}': a "
                         f"{t.kind.replace('_', '-')} hand-off cannot cross phases",
                         "put both instances in one phase, or hand over through a tensor "
                         "(an output of one phase bound as the input of the next)")


def _check_phase_order(recipe: Recipe, phases: tuple[Phase, ...], problems: _Problems) -> None:
    """A tensor the kernel writes (an output, or an input marked ``writes:``) bound in
    phases of which two come first, neither after the other: one writes it while the
    other's CTAs read or write it, since only ``after:`` waits for other CTAs (phases in
    one CTA follow each other, the grid does not)."""
    if len(phases) == 1:
        return
    launch = recipe.launch
    written = set(launch.get("outputs", {})) | {
        name for name, spec in launch.get("inputs", {}).items() if spec.get("writes")}
    owner = {inst: i for i, ph in enumerate(phases) for inst in ph.instances}
    index = {ph.name: i for i, ph in enumerate(phases)}
    earlier: list[set[int]] = []          # phase -> the phases it waits for, transitively
    for ph in phases:                     # run order: the ones it waits for come first
        earlier.append({index[d] for d in ph.after} | {
            e for d in ph.after for e in earlier[index[d]]})
    users: dict[str, set[int]] = {}
    for key, value in launch.get("bind", {}).items():
        phase = owner.get(str(key).partition(".")[0])
        if isinstance(value, str) and value in written and phase is not None:
            users.setdefault(value, set()).add(phase)
    for tensor, used in users.items():
        first = sorted(i for i in used if not earlier[i] & used)
        if len(first) > 1:
            a, b = phases[first[0]].name, phases[first[1]].name
            problems.add(f"phases.{b}.after",
                         f"phases '{a}' and '{b}' both use '{tensor}', which the kernel "
                         f"writes, and neither runs after the other: a CTA would start "
                         f"'{b}' while others are still in '{a}'",
                         f"list '{a}' under phases.{b}.after (after: waits for every CTA)")


def _work_ring(bound: dict[str, BoundContract], transfers: list[Transfer], lanes: list[Lane],
               scheduler: str | None, problems: _Problems) -> WorkRing | None:
    """With a scheduler, every other lane loops over its ring: each role of such a lane
    reads the record through a connected work port (so the checker has proved it
    understands it), and every warp of the lane, and of each converter, arrives once
    per record on the ring's empty barrier."""
    if scheduler is None:
        return None
    b = bound[scheduler]
    port = next(p for p in b.contract.ports.values() if p.kind == "work" and p.dir == "out")
    producer = Endpoint(scheduler, port.name)
    own = (scheduler, port.role)
    readers = {(t.dst.instance, role) for t in transfers if t.kind == "work"
               and t.src == producer for role in bound[t.dst.instance].contract.roles
               if bound[t.dst.instance].contract.ports[t.dst.port].seen_by(role)}
    consumers, arrivals, lane_of_scheduler = [], 0, ""
    for lane in lanes:
        if own in lane.members:
            lane_of_scheduler = lane.name
            if len(lane.members) > 1:
                problems.add(f"instances.{scheduler}",
                             f"scheduler role '{scheduler}.{port.role}' shares warps with "
                             f"{lane.name}", "a scheduler role runs alone in its warp")
            if lane.warps != 1:
                problems.add(f"instances.{scheduler}",
                             f"scheduler role '{scheduler}.{port.role}' ({b.name}) runs in "
                             f"{lane.warps} warps", f"{b.contract.path}: roles.{port.role}: "
                                                    "a scheduler role is one warp (warps: 1)")
            continue
        for inst, role in lane.members:
            if (inst, role) not in readers:
                problems.add(f"instances.{inst}",
                             f"role '{inst}.{role}' ({bound[inst].name}) runs once per work "
                             f"item of '{producer}' but reads no work record",
                             f"declare 'work: {{dir: in, kind: work, record: "
                             f"{port.spec['record']}}}' for the role and connect "
                             f"'{producer} -> {inst}.work'")
        consumers.append(lane.name)
        arrivals += lane.total_warps   # a pingpong team reads (and skips) every record too
    for t in transfers:
        if t.kind == "conversion":
            consumers.append(t.converter)
            arrivals += CONVERTER_WARPS
    return WorkRing(producer, lane_of_scheduler, RECORDS[port.spec["record"]][0],
                    tuple(consumers), arrivals)


def _check_trip_counts(recipe: Recipe, bound: dict[str, BoundContract],
                       transfers: list[Transfer], problems: _Problems) -> None:
    """Both ends of a ring hand over the same number of stages per work item: both take
    it from the work record, or both from runtime arguments bound to one expression.
    Two binds that disagree would leave one side waiting on a stage that never comes."""
    binds = {str(k): str(v) for k, v in recipe.launch.get("bind", {}).items()}
    for t in transfers:
        if t.kind not in ("zero_copy", "conversion"):
            continue
        ends = [(e, str(bound[e.instance].contract.ports[e.port].spec.get("per_tile", "")))
                for e in (t.src, t.dst)]
        if any(not per for _, per in ends):
            continue
        key = f"connect[{t.index}]"
        # per_tile: work implies a connected work port (the contract and the connection
        # checks ensure it), so both ends here read records when either does.
        from_work = [per == PER_TILE_WORK for _, per in ends]
        if from_work[0] != from_work[1]:
            (a, pa), (b, pb) = ends
            problems.add(key, f"'{a}' hands over per_tile {pa} stages per work item, '{b}' "
                              f"takes per_tile {pb}: one ring, two trip counts",
                         "let both ends take it from the work record (per_tile: work): the "
                         "scheduler's k_tiles, bound once")
        elif not any(from_work) and all(per.startswith("args.") for _, per in ends):
            named = [(f"{e.instance}.{per[5:]}", binds.get(f"{e.instance}.{per[5:]}"))
                     for e, per in ends]
            (ka, va), (kb, vb) = named
            if va is not None and vb is not None and va != vb:
                problems.add(f"launch.bind.{kb}",
                             f"'{ka}' is bound to '{va}' and '{kb}' to '{vb}': both count "
                             f"the stages of one ring ('{t.src} -> {t.dst}')",
                             "bind them to one expression, or let the trip count travel "
                             "with the work (per_tile: work, k_tiles bound once on the "
                             "scheduler)")


def _lanes(recipe: Recipe, arch: str, bound: dict[str, BoundContract],
           transfers: list[Transfer], phases: tuple[Phase, ...],
           problems: _Problems) -> list[Lane]:
    """Union of component roles joined by register hand-offs (and `lane:`), producers
    first."""
    order = [(n, r) for n, b in bound.items() for r in b.contract.roles]
    parent = {m: m for m in order}

    def find(m: tuple[str, str]) -> tuple[str, str]:
        while parent[m] != m:
            m = parent[m]
        return m

    for t in transfers:
        if t.kind == "registers":
            a = (t.src.instance, bound[t.src.instance].contract.ports[t.src.port].role)
            b = (t.dst.instance, bound[t.dst.instance].contract.ports[t.dst.port].role)
            parent[find(b)] = find(a)
    follows = _stated_lanes(recipe.instances(arch), bound, transfers, phases, problems)
    for b, a in follows.items():
        parent[find(b)] = find(a)
    groups: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for m in order:
        groups.setdefault(find(m), []).append(m)
    lanes = []
    for members in groups.values():
        members = _call_order(members, transfers, bound, follows)
        specs = [(m, bound[m[0]].contract.roles[m[1]]) for m in members]
        warps = {m: bound[m[0]].eval(s.warps, f"roles.{m[1]}.warps") for m, s in specs}
        if len(set(warps.values())) > 1:
            listing = ", ".join(f"{i}.{r} {w}" for (i, r), w in warps.items())
            problems.add("connect", f"roles sharing warps (a register hand-off, or lane:) "
                                    f"run on different warp counts: {listing}",
                         "a lane's roles run in the same threads: give them the same warps")
            continue
        regs = max(bound[m[0]].eval(s.registers, f"roles.{m[1]}.registers") for m, s in specs)
        lanes.append(Lane("+".join(f"{i}.{r}" for i, r in members), tuple(members),
                          next(iter(warps.values())), regs,
                          any(s.warpgroup for _, s in specs),
                          _teams(recipe.instances(arch), members, problems),
                          _phase_index(phases, members[0][0])))
    return lanes


def _teams(instances: dict[str, Instance], members: list[tuple[str, str]],
           problems: _Problems) -> int:
    """1 for a cooperative lane, 2 for a pingpong one: the loop its instances state
    (instances that state none follow the others; two that disagree are refused)."""
    stated = {i: instances[i].loop for i, _ in members if instances[i].loop}
    if len(set(stated.values())) > 1:
        listing = ", ".join(f"{i}: {loop}" for i, loop in sorted(stated.items()))
        problems.add(f"instances.{min(stated)}.loop",
                     f"roles sharing warps through a register hand-off state different "
                     f"loops ({listing})",
                     "one lane runs one loop: state the same loop on each, or on one of them")
        return 1
    return PINGPONG_TEAMS if set(stated.values()) == {"pingpong"} else 1


def _check_pingpong(recipe: Recipe, bound: dict[str, BoundContract], lanes: list[Lane],
                    scheduler: str | None, problems: _Problems) -> None:
    """A pingpong lane's teams take alternate work records, so it needs a scheduler's
    records, and every ring it touches must be one the glue can step over for the other
    team: stages it only reads, a count per record it can compute. It may not produce
    a ring (two teams would fill one stage sequence out of order) or hold Tensor Memory."""
    for lane in lanes:
        if lane.teams == 1:
            continue
        inst = lane.members[0][0]
        key = f"instances.{inst}.loop"
        if scheduler is None:
            problems.add(key, f"lane {lane.name} runs pingpong, but the kernel has no "
                              "scheduler: two teams alternate work records",
                         "add a scheduler instance (e.g. tile_scheduler) and connect its "
                         "work port to every looping role")
        if any(i == scheduler for i, _ in lane.members):
            problems.add(key, "a scheduler's own role cannot run pingpong",
                         "state loop: pingpong on the consumer instances")
        for i, role in lane.members:
            b = bound[i]
            elsewhere = [r for r in b.contract.roles if (i, r) not in lane.members]
            if elsewhere:
                problems.add(f"instances.{i}.loop",
                             f"'{i}' ({b.name}) runs pingpong in {lane.name} but also has "
                             f"role(s) {', '.join(elsewhere)} in other warps, which would "
                             "share one team's copy of its shared memory and barriers",
                             "run this lane cooperative")
            if b.contract.section("tmem"):
                problems.add(f"instances.{i}.loop",
                             f"'{i}' ({b.name}) holds Tensor Memory, which pingpong teams "
                             "cannot share", "run this lane cooperative")
            for port in b.contract.ports.values():
                if port.role != role or port.kind not in RING_PORTS:
                    continue
                if port.dir == "out":
                    problems.add(f"instances.{i}.loop",
                                 f"'{i}.{port.name}' ({b.name}) produces a ring, and two "
                                 "pingpong teams would fill its stages out of order",
                                 "run this lane cooperative, or move the producer to its "
                                 "own warps")
                elif port.kind == "tmem" or "per_tile" not in port.spec:
                    problems.add(f"instances.{i}.loop",
                                 f"'{i}.{port.name}' ({b.name}) takes no per_tile count, "
                                 "so the other team's stages cannot be stepped over",
                                 f"give ports.{port.name} a per_tile in {b.contract.path}, "
                                 "or run this lane cooperative")


def _stated_lanes(instances: dict[str, Instance], bound: dict[str, BoundContract],
                  transfers: list[Transfer], phases: tuple[Phase, ...],
                  problems: _Problems) -> dict[tuple[str, str], tuple[str, str]]:
    """role -> the role whose warps it runs in after, for each instance that states
    `lane:` (each side one role, both in one phase, no ring between them)."""
    follows = {}
    for name, inst in instances.items():
        if inst.lane is None:
            continue
        key = f"instances.{name}.lane"
        if inst.lane not in bound or inst.lane == name:
            problems.add(key, f"'{name}' runs in the lane of '{inst.lane}', which is no other "
                              "instance of this kernel",
                         "name one of: " + ", ".join(n for n in bound if n != name))
            continue
        roles = {n: list(bound[n].contract.roles) for n in (name, inst.lane)}
        several = [f"'{n}' has {len(r)} roles ({', '.join(r)})" for n, r in roles.items()
                   if len(r) != 1]
        if several:
            problems.add(key, f"a lane: joins one role to one role, and {'; '.join(several)}",
                         "join instances of one role each")
            continue
        if _phase_index(phases, name) != _phase_index(phases, inst.lane):
            problems.add(key, f"'{name}' and '{inst.lane}' run in different phases: a lane "
                              "runs in one", "put both in the same phase")
            continue
        rings = [f"'{t.src} -> {t.dst}'" for t in transfers
                 if t.kind not in ("registers", "function")
                 and {t.src.instance, t.dst.instance} == {name, inst.lane}]
        if rings:
            problems.add(key, f"'{name}' and '{inst.lane}' are joined by {', '.join(rings)}: "
                              "in one lane its producer would wait for a consumer that "
                              "runs after it", "give the two their own warps")
            continue
        if _feeds(transfers, name, inst.lane):
            problems.add(key, f"what '{name}' produces reaches '{inst.lane}' through other "
                              f"instances: in one lane '{inst.lane}' would wait for "
                              f"'{name}', which runs after it", "give the two their own warps")
            continue
        follows[(name, roles[name][0])] = (inst.lane, roles[inst.lane][0])
    for cycle in _lane_cycles(follows):     # else each runs after the other: no order
        names = [i for i, _ in cycle]
        problems.add(f"instances.{min(names)}.lane",
                     "lane: goes round in a cycle (" + " -> ".join([*names, names[0]])
                     + "): each would run after the other",
                     "drop lane: from one of them; the one it named then runs first")
        for member in cycle:
            follows.pop(member, None)
    return follows


def _lane_cycles(follows: dict[tuple[str, str], tuple[str, str]]) -> list[list[tuple[str, str]]]:
    """The cycles of `lane:` (each role names at most one, so a walk finds each), each
    once, from its least member."""
    cycles = []
    for start in sorted(follows):
        walk, at = [start], follows[start]
        while at in follows and at not in walk:
            walk.append(at)
            at = follows[at]
        if at == start and start == min(walk):
            cycles.append(walk)
    return cycles


def _feeds(transfers: list[Transfer], source: str, target: str) -> bool:
    """Whether data flows from instance `source` to `target` along transfers (function
    ports aside: they are calls, not data)."""
    edges: dict[str, set[str]] = {}
    for t in transfers:
        if t.kind != "function":
            edges.setdefault(t.src.instance, set()).add(t.dst.instance)
    seen, todo = {source}, [source]
    while todo:
        for nxt in edges.get(todo.pop(), ()):
            if nxt == target:
                return True
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return False


def _call_order(members: list[tuple[str, str]], transfers: list[Transfer],
                bound: dict[str, BoundContract],
                follows: dict[tuple[str, str], tuple[str, str]]) -> list[tuple[str, str]]:
    """Producers of register hand-offs run before their consumers, and a `lane:` role
    after the one it names (stable otherwise)."""
    before = {m: set() for m in members}
    for t in transfers:
        if t.kind == "registers":
            a = (t.src.instance, bound[t.src.instance].contract.ports[t.src.port].role)
            b = (t.dst.instance, bound[t.dst.instance].contract.ports[t.dst.port].role)
            if a in before and b in before:
                before[b].add(a)
    for b, a in follows.items():
        if a in before and b in before:
            before[b].add(a)
    ordered: list[tuple[str, str]] = []
    while len(ordered) < len(members):
        for m in members:
            if m not in ordered and before[m] <= set(ordered):
                ordered.append(m)
                break
        else:  # a cycle of hand-offs: keep recipe order, the glue will still call all
            ordered += [m for m in members if m not in ordered]
    return ordered


def phase_counter(phase: str) -> str:
    """The workspace key of a phase's counter: CTAs that finished it (zeroed per launch)."""
    return f"phase.{phase}"


def _workspace(bound: dict[str, BoundContract],
               phases: tuple[Phase, ...]) -> tuple[dict[str, GlobalSlots], int]:
    """Lays out the slots of every global out port (connected or not: its producer
    writes them either way), then their counters, in recipe order."""
    ports = []
    for inst, b in bound.items():
        for name, port in sorted(b.contract.ports.items()):
            if port.kind != "global" or port.dir != "out":
                continue
            elems = math.prod(b.eval(v, f"ports.{name}.shape") for v in port.spec["shape"])
            slot_bytes = _align(elems * expr.DTYPE_BYTES[b.dtype(port.dtype, name)],
                                WORKSPACE_ALIGN)
            slots = b.eval(port.spec["slots"], f"ports.{name}.slots")
            ports.append((f"{inst}.{name}", slot_bytes, slots))
    out, offset = {}, 0
    for key, slot_bytes, slots in ports:
        out[key] = GlobalSlots(offset, slot_bytes, 0, slots)
        offset += slot_bytes * slots
    for key, _, slots in ports:
        g = out[key]
        out[key] = GlobalSlots(g.slot_offset, g.slot_bytes, offset, slots)
        offset = _align(offset + 4 * slots, WORKSPACE_ALIGN)
    # Contract scratch (a split-K scheduler's partial tiles): written before it is
    # read within a launch, so never zeroed; keyed "inst.scratch.name".
    for inst, b in bound.items():
        for name, size in sorted(b.contract.section("scratch").items()):
            nbytes = _align(b.eval(size, f"scratch.{name}"), WORKSPACE_ALIGN)
            out[f"{inst}.scratch.{name}"] = GlobalSlots(offset, nbytes, offset, 0)
            offset += nbytes
    # Contract counters (a dynamic scheduler's tile counter): zeroed per launch like
    # the hand-off counters, keyed "inst.counter.name".
    for inst, b in bound.items():
        for name, count in sorted(b.contract.section("counters").items()):
            slots = b.eval(count, f"counters.{name}")
            out[f"{inst}.counter.{name}"] = GlobalSlots(offset, 0, offset, slots)
            offset = _align(offset + 4 * slots, WORKSPACE_ALIGN)
    # A phase that others wait for counts the CTAs done with it.
    awaited = {d for ph in phases for d in ph.after}
    for ph in phases:
        if ph.name in awaited:
            out[phase_counter(ph.name)] = GlobalSlots(offset, 0, offset, 1)
            offset = _align(offset + 4, WORKSPACE_ALIGN)
    return out, offset


def _align(value: int, to: int) -> int:
    return -(-value // to) * to


def _sized(b: BoundContract, inst: str, value: Any, key: str) -> Sized:
    deps, table = b.tabulate(value, key)
    return Sized(tuple(f"{inst}.{d}" for d in deps), table)


def _problem(recipe: Recipe, arch: str, bound: dict[str, BoundContract],
             transfers: list[Transfer], lanes: list[Lane], phases: tuple[Phase, ...],
             problems: _Problems) -> Problem:
    tunables, equal, buffers, barriers, tmem = [], [], [], [], []
    pins = recipe.instances(arch)
    stage_pins = _stage_pins(bound, transfers)
    teams = {i: lane.teams for lane in lanes for i, _ in lane.members}
    for inst, b in bound.items():
        where = b.contract.path
        for name in pins[inst].tunables:
            if name not in b.contract.tunables:   # else a misspelt pin silently pins nothing
                problems.add(f"instances.{inst}.tunables.{name}",
                             f"pins '{name}', which is not a tunable of '{b.name}'",
                             "its tunables: " + (", ".join(b.contract.tunables) or "none")
                             + f" ({where}: tunables)")
        for name, values in b.contract.tunables.items():
            allowed, outside = _pinned(values, pins[inst].tunables.get(name))
            if outside:     # else a pin of [3, 5] would quietly place 3 alone
                problems.add(f"instances.{inst}.tunables.{name}",
                             f"pins {_listed(outside)} outside {b.name}'s range "
                             f"{list(values)}",
                             f"pin values the contract allows ({where}: tunables.{name})")
                allowed = allowed or values
            ring = stage_pins.get(f"{inst}.{name}")
            if ring is not None and not set(allowed) & ring:
                problems.add(f"instances.{inst}.tunables.{name}",
                             f"'{inst}.{name}' may be {list(allowed)}, but the ring it sizes "
                             f"is shared with a port that takes {sorted(ring)}",
                             "pin both sides of the connection to one value")
            elif ring is not None:
                allowed = tuple(v for v in allowed if v in ring)
            tunables.append(Tunable(f"{inst}.{name}", tuple(allowed), 1,
                                    f"{where}: tunables.{name}"))
        # A pingpong team's epilogue runs while the other's does: each team has its own
        # shared memory, mbarriers and named barriers (keys of team t > 0: team_key).
        for team in range(teams.get(inst, 1)):
            buffers += _private_buffers(b, inst, team)
            barriers += [NamedBarrier(team_key(f"{inst}.{name}", team),
                                      b.eval(spec["threads"], f"named_barriers.{name}"),
                                      spec.get("fixed"), _live(spec),
                                      f"{where}: named_barriers.{name}")
                         for name, spec in b.named_barriers().items()]
        for _, port in sorted(b.contract.ports.items()):
            if port.kind == "work" and port.dir == "out":
                buffers += _work_buffers(b, inst, port)
        for name, spec in b.contract.section("tmem").items():
            tmem.append(TmemAlloc(f"{inst}.{name}", _sized(b, inst, spec["columns"],
                                                           f"tmem.{name}.columns"),
                                  f"{where}: tmem.{name}"))
    tied = [(t, _stage_ties(bound, t)) for t in transfers if t.kind == "zero_copy"]
    for _, ties in tied:
        equal += ties
    for t in transfers:
        if t.kind == "conversion":
            buffers += _converter_buffers(bound, t)
    _check_pinned_ties(tied, {t.name: set(t.values) for t in tunables}, pins, problems)
    if tmem:
        buffers.append(Buffer(TMEM_ADDRESS_SLOT, Sized.const(TMEM_ADDRESS_BYTES),
                              TMEM_ADDRESS_BYTES, None,
                              "the Tensor Memory address tcgen05.alloc writes"))
    # A pingpong lane hands the rings from team to team in record order (turn_key).
    barriers += [NamedBarrier(turn_key(lane.name, team), lane.total_warps * THREADS_PER_WARP,
                              None, None, f"pingpong turn of team {team} in {lane.name}")
                 for lane in lanes if lane.teams > 1 for team in range(lane.teams)]
    roles = [Role(lane.name, lane.total_warps, lane.registers, lane.warpgroup,
                  tuple(f"{i}.{r}" for i, r in lane.members),
                  "; ".join(f"{bound[i].contract.path}: roles.{r}" for i, r in lane.members))
             for lane in lanes]
    roles += [Role(t.converter, CONVERTER_WARPS, CONVERTER_REGISTERS, False, (t.converter,),
                   f"generated conversion for {t.src} -> {t.dst}")
              for t in transfers if t.kind == "conversion"]
    objective = recipe.data.get("objective", "max_tunables_then_min_smem")
    if isinstance(objective, dict):
        wanted = set(objective.get("maximize", []))
        known = [t.name for t in tunables]
        for i, name in enumerate(objective.get("maximize", [])):
            if name not in known:  # else every weight would silently drop to 0
                raise CheckError(f"'{name}' is not a tunable of this kernel on {arch}",
                                 where=recipe.where(f"objective.maximize[{i}]"),
                                 hint="tunables: " + (", ".join(known) or "none"))
        tunables = [Tunable(t.name, t.values, 1 if t.name in wanted else 0, t.source)
                    for t in tunables]
        objective = "max_tunables_then_min_smem"
    statics = {inst: b.eval(b.contract.data["static_smem"], "static_smem")
               for inst, b in bound.items() if "static_smem" in b.contract.data}
    static = sum(statics.values())
    most = ARCH_LIMITS[arch]["smem_bytes"]
    if static_footprint(static) > most:   # else the placer reports a negative budget
        top = max(statics, key=statics.__getitem__)
        problems.add(f"instances.{top}", "static __shared__ memory alone needs "
                     + " + ".join(f"{v} B ({i})" for i, v in statics.items())
                     + f", more than the {most} B a block gets on {arch}",
                     f"declare less static shared memory in {bound[top].contract.path} "
                     "(static_smem: states it), or move it into a smem: buffer the linker "
                     "places")
    if len(phases) > 1:
        buffers, barriers, roles, tmem = _phase_lives(phases, transfers, buffers, barriers,
                                                      roles, tmem)
    return Problem(arch, tuple(tunables), tuple(equal), tuple(buffers), (), tuple(barriers),
                   tuple(roles), tuple(tmem), objective, static)


def _phase_lives(phases: tuple[Phase, ...], transfers: list[Transfer], buffers: list[Buffer],
                 barriers: list[NamedBarrier], roles: list[Role],
                 tmem: list[TmemAlloc]) -> tuple[list, list, list, list]:
    """In a kernel of several phases, what an instance owns lives in its phase: buffers,
    named barriers and Tensor Memory columns of different phases may share addresses,
    ids and columns, and roles of different phases share warps. mbarriers stay
    whole-kernel (memory that held one must be invalidated before it is reused), as
    does the TMEM address slot."""
    converters = {t.converter: t.dst.instance for t in transfers if t.kind == "conversion"}

    def live(name: str) -> tuple[int, int]:
        owner = name.split(".", 1)[0].split("+", 1)[0]
        i = _phase_index(phases, converters.get(owner, owner))
        return (i, i + 1)

    buffers = [b if ".mbar." in b.name or b.name == TMEM_ADDRESS_SLOT
               else dataclasses.replace(b, live=live(b.name)) for b in buffers]
    barriers = [dataclasses.replace(b, live=live(b.name)) for b in barriers]
    roles = [dataclasses.replace(r, live=live(r.name)) for r in roles]
    tmem = [dataclasses.replace(t, live=live(t.name)) for t in tmem]
    return buffers, barriers, roles, tmem


def _pinned(values: tuple[int, ...], pin: Any) -> tuple[tuple[int, ...], list[Any]]:
    """The values a tunable may take under a recipe's pin, and the pinned values its
    range does not hold."""
    if pin is None:
        return values, []
    wanted = pin if isinstance(pin, list) else [pin]
    return (tuple(v for v in values if v in wanted),
            [v for v in wanted if v not in values])


def _listed(values: list[Any]) -> str:
    """``16`` for one value, ``[5, 6]`` for several."""
    return str(values[0]) if len(values) == 1 else str(values)


def team_key(key: str, team: int) -> str:
    """The placement key of a pingpong team's copy of a resource (team 0: the key)."""
    return key if team == 0 else f"{key}@{team}"


def turn_key(lane: str, team: int) -> str:
    """The named barrier that gives pingpong team `team` of a lane its turn on the rings.

    Turns are not for speed alone: a ring's consumer waits on a stage by phase parity,
    which cannot tell a fill two phases ahead from the last one. A team may only start
    waiting on the stages of its record once the team before it has taken every stage
    of the previous record, so the next fill of each stage is the one it wants."""
    return team_key(f"{lane}.turn", team)


def _private_buffers(b: BoundContract, inst: str, team: int) -> list[Buffer]:
    """An instance's own shared memory and mbarriers (one copy per pingpong team)."""
    where, out = b.contract.path, []
    for name, spec in b.contract.section("smem").items():
        align = b.eval(spec.get("align", DEFAULT_SMEM_ALIGN), f"smem.{name}.align")
        out.append(Buffer(team_key(f"{inst}.{name}", team),
                          _sized(b, inst, spec["bytes"], f"smem.{name}.bytes"), align,
                          _live(spec), f"{where}: smem.{name}"))
    for name, spec in b.contract.section("mbarriers").items():
        count = spec["count"] if isinstance(spec, dict) else spec
        sized = _sized(b, inst, count, f"mbarriers.{name}")
        sized = Sized(sized.depends, tuple((k, v * MBARRIER_BYTES) for k, v in sized.table))
        out.append(Buffer(team_key(f"{inst}.mbar.{name}", team), sized, MBARRIER_ALIGN,
                          _live(spec) if isinstance(spec, dict) else None,
                          f"{where}: mbarriers.{name}"))
    return out


def _live(spec: dict[str, Any]) -> tuple[int, int] | None:
    live = spec.get("live")
    return (live[0], live[1]) if live else None


def _check_pinned_ties(tied: list[tuple[Transfer, list[tuple[str, str]]]],
                       allowed: dict[str, set[int]], pins: dict[str, Instance],
                       problems: _Problems) -> None:
    """Both ends of a zero-copy ring take one stage count: recipe pins with no value in
    common are refused here, at the pin (the placer alone would name only contracts)."""
    seen: set[tuple[str, str]] = set()
    for t, ties in tied:
        for a, b in ties:
            if (a, b) in seen or allowed[a] & allowed[b]:
                continue
            seen.add((a, b))
            pinned = [n for n in (a, b)
                      if n.split(".", 1)[1] in pins[n.split(".", 1)[0]].tunables]
            if pinned:
                inst, name = pinned[-1].split(".", 1)
                problems.add(f"instances.{inst}.tunables.{name}",
                             f"'{a}' may be {sorted(allowed[a])} and '{b}' "
                             f"{sorted(allowed[b])}, but they size one ring ('{t.src} -> "
                             f"{t.dst}', connect[{t.index}]) and must take one value",
                             "pin both to one value, or drop a pin")


def _stage_ties(bound: dict[str, BoundContract], t: Transfer) -> list[tuple[str, str]]:
    """Zero-copy ports whose stages are both plain tunables must take one value."""
    def tunable(end: Endpoint) -> str | None:
        b = bound[end.instance]
        stages = b.contract.ports[end.port].spec["stages"]
        return f"{end.instance}.{stages}" if stages in b.contract.tunables else None
    a, b = tunable(t.src), tunable(t.dst)
    return [(a, b)] if a and b else []


def _work_buffers(b: BoundContract, inst: str, port: Port) -> list[Buffer]:
    """The work ring's records and its full/empty mbarriers, sized by its stages."""
    stages, key = port.spec["stages"], f"ports.{port.name}.stages"
    source = f"{b.contract.path}: ports.{port.name} (work ring)"
    return [
        Buffer(f"{inst}.{port.name}.records", _sized(b, inst, f"({stages})*{RECORD_BYTES}", key),
               RECORD_ALIGN, None, source),
        *(Buffer(f"{inst}.mbar.{port.name}.{bar}",
                 _sized(b, inst, f"({stages})*{MBARRIER_BYTES}", key), MBARRIER_ALIGN, None,
                 source) for bar in ("full", "empty")),
    ]


def _converter_buffers(bound: dict[str, BoundContract], t: Transfer) -> list[Buffer]:
    b = bound[t.dst.instance]
    port = b.contract.ports[t.dst.port]
    elems = math.prod(b.eval(v, f"ports.{port.name}.shape") for v in port.spec["shape"])
    stage_bytes = elems * expr.DTYPE_BYTES[b.dtype(port.dtype, port.name)]
    source = f"generated conversion for {t.src} -> {t.dst}"
    return [
        Buffer(f"{t.converter}.tiles", Sized.const(CONVERTER_STAGES * stage_bytes), 1024,
               None, source),
        Buffer(f"{t.converter}.mbar.full", Sized.const(CONVERTER_STAGES * MBARRIER_BYTES),
               MBARRIER_ALIGN, None, source),
        Buffer(f"{t.converter}.mbar.empty", Sized.const(CONVERTER_STAGES * MBARRIER_BYTES),
               MBARRIER_ALIGN, None, source),
    ]


def _runs_everywhere(recipe: Recipe, kernel: Recipe, key: str, problems: _Problems) -> None:
    """A kernel a call may run is built for every arch the recipe targets (gradient
    kernels may be narrower: backpropagation is refused where they are not built)."""
    missing = [a for a in recipe.archs if a not in kernel.archs]
    if missing:
        problems.add(key, f"kernel '{kernel.kernel}' is not built for {', '.join(missing)}, "
                          "which the recipe targets: a call there would find no kernel",
                     f"build it for every arch of the recipe (kernels.{kernel.kernel}.arch), "
                     "or narrow the recipe's arch")


def dispatch_on(recipe: Recipe, entries: list[dict[str, Any]], arch: str) -> list[dict[str, Any]]:
    """The dispatch entries a call on ``arch`` walks: those of kernels built there. An
    entry with conditions may name a kernel built for some archs only (a tile shape one
    arch's MMA has and another's lacks); the last entry runs everywhere (check_dispatch)."""
    built = set(recipe.select(None, arch))
    return [e for e in entries if e["kernel"] in built]


def check_autograd(recipe: Recipe) -> dict[str, Any] | None:
    """Checks a recipe's ``autograd:`` section against its kernels' launches and returns
    it normalised (grads in the forward kernel's input order), or None without one.

    The runtime turns it into a torch autograd op: ``forward`` runs on ``op(*inputs)``;
    for each differentiable input, its gradient kernel runs on the listed tensors
    (``grad.<output>`` is the incoming gradient, ``.T`` a transposed contiguous copy)
    and its output (the only one, or the one ``output`` names) is the gradient; grads
    that name the same kernel and inputs come from one launch. ``returns`` lists the
    forward outputs the call returns."""
    section = recipe.autograd
    if section is None:
        return None
    problems = _Problems(recipe)
    kernels = recipe.kernels()
    names = ", ".join(kernels)
    forward = kernels.get(section["forward"])
    if forward is None:
        problems.add("autograd.forward", f"names kernel '{section['forward']}', which the "
                                         "recipe does not define", f"kernels: {names}")
        problems.raise_if_any()
    _runs_everywhere(recipe, forward, "autograd.forward", problems)
    f_inputs = forward.launch.get("inputs", {})
    f_outputs = forward.launch.get("outputs", {})
    tensors = {**f_inputs, **f_outputs}
    for x, grad in section["grads"].items():
        key = f"autograd.grads.{x}"
        if x not in f_inputs:
            problems.add(key, f"'{x}' is not an input of kernel '{forward.kernel}'",
                         "its inputs: " + (", ".join(f_inputs) or "none")
                         + f" (kernels.{forward.kernel}.launch.inputs)")
        kernel = kernels.get(grad["kernel"])
        if kernel is None:
            problems.add(f"{key}.kernel", f"names kernel '{grad['kernel']}', which the recipe "
                                          "does not define", f"kernels: {names}")
            continue
        g_inputs = list(kernel.launch.get("inputs", {}).items())
        g_outputs = dict(kernel.launch.get("outputs", {}))
        output = grad.get("output")
        if output is None and len(g_outputs) != 1:
            problems.add(f"{key}.kernel",
                         f"gradient kernel '{kernel.kernel}' has {len(g_outputs)} outputs; "
                         f"say which is the gradient of '{x}'",
                         f"add output: <one of {', '.join(g_outputs) or 'none'}>")
        elif output is not None and output not in g_outputs:
            problems.add(f"{key}.output", f"kernel '{kernel.kernel}' has no output "
                                          f"'{output}'",
                         "its outputs: " + (", ".join(g_outputs) or "none"))
        elif x in f_inputs:
            name = output or next(iter(g_outputs))
            _same_tensor(problems, f"{key}.kernel", f"the gradient of '{x}'", f_inputs[x],
                         f"output '{name}' of kernel '{kernel.kernel}'", g_outputs[name])
        if len(grad["inputs"]) != len(g_inputs):
            problems.add(f"{key}.inputs",
                         f"lists {len(grad['inputs'])} inputs, kernel '{kernel.kernel}' takes "
                         f"{len(g_inputs)} ({', '.join(n for n, _ in g_inputs)})",
                         "list one tensor per input of the gradient kernel, in its order")
        for i, ref in enumerate(grad["inputs"]):
            base = ref.removeprefix("grad.").removesuffix(".T")
            ref_key = f"{key}.inputs[{i}]"
            if ref.startswith("grad.") and base not in f_outputs:
                problems.add(ref_key, f"'{ref}' is the gradient of '{base}', which is not an "
                                      f"output of kernel '{forward.kernel}'",
                             "outputs: " + (", ".join(f_outputs) or "none"))
                continue
            if base not in tensors:
                problems.add(ref_key, f"'{ref}' names no input or output of kernel "
                                      f"'{forward.kernel}'",
                             "write grad.<output>, <input> or <output>, with '.T' for a "
                             "transposed copy: " + ", ".join(tensors))
                continue
            rank = len(tensors[base].get("shape", []))
            if ref.endswith(".T") and rank != 2:
                problems.add(ref_key, f"'{ref}' transposes '{base}', which has {rank} "
                                      "dimensions", "'.T' takes a 2-D tensor")
                continue
            if i < len(g_inputs):
                _same_tensor(problems, ref_key, f"'{ref}'", tensors[base],
                             f"input '{g_inputs[i][0]}' of kernel '{kernel.kernel}'",
                             g_inputs[i][1])
    returns = section.get("returns")
    for name in returns or ():
        if name not in f_outputs:
            problems.add("autograd.returns", f"'{name}' is not an output of kernel "
                                             f"'{forward.kernel}'",
                         "outputs: " + (", ".join(f_outputs) or "none"))
    _check_scratch(problems, section, kernels, forward.kernel, f_outputs)
    problems.raise_if_any()
    order = list(f_inputs)
    grads = {}
    for x in sorted(section["grads"], key=order.index):
        g = section["grads"][x]
        kernel_outputs = list(kernels[g["kernel"]].launch.get("outputs", {}))
        grads[x] = {"kernel": g["kernel"], "inputs": list(g["inputs"]),
                    "output": g.get("output") or kernel_outputs[0]}
    out: dict[str, Any] = {"forward": forward.kernel, "grads": grads}
    if returns:
        out["returns"] = list(returns)
    if section.get("scratch"):
        out["scratch"] = list(section["scratch"])
        out["launches"] = _launch_order(problems, grads, kernels, section["scratch"])
        problems.raise_if_any()
    return out


def check_dispatch(recipe: Recipe) -> list[dict[str, Any]] | None:
    """Checks a recipe's ``dispatch:`` section and returns it normalised (``when`` as a
    list of conditions; none on the last entry), or None without one.

    The runtime makes the recipe one op: a call runs the first entry whose conditions all
    hold on the call's sizes, the last entry otherwise; on an arch an entry's kernel is not
    built for, the entry is skipped (dispatch_on), so the last must be built for every
    arch. The kernels must take and return
    the same tensors (names, dtypes, shapes) and scalars, so any call one accepts, the
    others accept too, and a condition may name only sizes the inputs' shapes bind. With
    ``autograd:``, its forward kernel is one of them, and every one takes its gradients."""
    section = recipe.dispatch
    if section is None:
        return None
    problems = _Problems(recipe)
    kernels = recipe.kernels()
    forward = (recipe.autograd or {}).get("forward")
    if forward is not None and forward not in {e["kernel"] for e in section}:
        problems.add("autograd.forward", f"kernel '{forward}' is not one dispatch: lists: a "
                                         "call would run a dispatched kernel that has no "
                                         "gradients",
                     "list the forward kernel under dispatch: (every dispatched kernel "
                     "then takes autograd's gradients)")
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    first = None
    sizes: set[str] = set()
    for i, entry in enumerate(section):
        key = f"dispatch[{i}]"
        kernel = kernels.get(entry["kernel"])
        if kernel is None:
            problems.add(f"{key}.kernel", f"names kernel '{entry['kernel']}', which the "
                                          "recipe does not define",
                         "kernels: " + ", ".join(kernels))
            continue
        if i == len(section) - 1:   # the fallback; an entry with conditions may be narrower
            _runs_everywhere(recipe, kernel, f"{key}.kernel", problems)
        if entry["kernel"] in seen:
            problems.add(f"{key}.kernel", f"kernel '{entry['kernel']}' is listed twice",
                         "list each kernel once, with all its conditions in one when:")
        seen.add(entry["kernel"])
        when = entry.get("when")
        when = [when] if isinstance(when, str) else list(when or [])
        last = i == len(section) - 1
        if last and when:
            problems.add(f"{key}.when", "the last entry has conditions: a call none of the "
                                        "entries takes would have no kernel",
                         f"drop when: from the last entry ('{entry['kernel']}'), or add an "
                         "entry without one after it")
        if not last and not when:
            problems.add(key, f"entry '{entry['kernel']}' has no when: and is not last: the "
                              "entries after it would never run",
                         "give it conditions, or move it to the end")
        if first is None:      # the signature every other kernel must have
            first = kernel
            sizes = {d for spec in first.launch.get("inputs", {}).values()
                     for d in spec.get("shape", []) if isinstance(d, str) and d.isidentifier()}
            sizes |= set(first.launch.get("scalars", {})) | set(HOST_SIZES)
        else:
            _same_signature(problems, key, first, kernel)
        for j, condition in enumerate(when):
            _condition_known(problems, f"{key}.when[{j}]", condition, sizes)
        out.append({"kernel": entry["kernel"], **({"when": when} if when else {})})
    problems.raise_if_any()
    return out


def _same_signature(problems: _Problems, key: str, first: Recipe, other: Recipe) -> None:
    """``other`` takes and returns what ``first`` does, in the same order."""
    for group in ("inputs", "outputs", "scalars"):
        mine, theirs = first.launch.get(group, {}), other.launch.get(group, {})
        if list(mine) != list(theirs):
            problems.add(f"{key}.kernel",
                         f"kernel '{other.kernel}' has launch {group} "
                         f"{', '.join(theirs) or 'none'}; kernel '{first.kernel}' has "
                         f"{', '.join(mine) or 'none'}",
                         f"give every dispatched kernel the same launch.{group}, in order")
            continue
        for name, spec in mine.items():
            if group != "scalars" and (spec.get("dtype"), list(spec.get("shape", []))) != (
                    theirs[name].get("dtype"), list(theirs[name].get("shape", []))):
                problems.add(f"{key}.kernel",
                             f"{group[:-1]} '{name}' is {theirs[name].get('dtype')} "
                             f"{list(theirs[name].get('shape', []))} in kernel "
                             f"'{other.kernel}', {spec.get('dtype')} "
                             f"{list(spec.get('shape', []))} in kernel '{first.kernel}'",
                             f"make kernels.{other.kernel}.launch.{group}.{name} the same")
            elif group == "scalars" and spec != theirs[name]:
                problems.add(f"{key}.kernel",
                             f"scalar '{name}' defaults to {theirs[name]!r} in kernel "
                             f"'{other.kernel}', {spec!r} in kernel '{first.kernel}'",
                             "give the scalar one default in every dispatched kernel")


def _sizes_known(problems: _Problems, key: str, value: Any, sizes: set[str]) -> None:
    """The launch expression ``value`` names only ``sizes`` (input dimensions, scalars
    and what the runtime gives)."""
    try:
        used = expr.host_names(value, where=problems.recipe.where(key))
    except ContractError as exc:
        problems.add(key, exc.message, exc.hint or "")
        return
    unknown = sorted(used - sizes)
    if unknown:
        known = ", ".join(sorted(sizes - set(HOST_SIZES))) or "none"
        problems.add(key, f"{value!r} names {'sizes' if len(unknown) > 1 else 'size'} "
                          f"{', '.join(unknown)}, which no input's shape binds",
                     f"sizes here: {known} (from launch.inputs shapes and launch.scalars) "
                     f"and {', '.join(HOST_SIZES)}")


def _condition_known(problems: _Problems, key: str, condition: str, sizes: set[str]) -> None:
    """``condition`` is one comparison of two expressions over ``sizes``."""
    try:
        left, _, right = expr.comparison(condition, where=problems.recipe.where(key))
    except ContractError as exc:
        problems.add(key, exc.message, exc.hint or "")
        return
    _sizes_known(problems, key, left, sizes)
    _sizes_known(problems, key, right, sizes)


def _condition_satisfiable(problems: _Problems, key: str, condition: str) -> None:
    """A condition that names no size (what is left of '$experts <= 64' once a recipe
    sets experts: 128) holds for every call or for none; for none, every launch would
    be refused at the call, after the build."""
    try:
        left, op, right = expr.comparison(condition)
    except ContractError:
        return   # _condition_known said so
    a, b = _constant(left), _constant(right)
    if a is not None and b is not None and not expr.COMPARE[op](a, b):
        problems.add(key, f"require {condition!r} names no size and is false ({a} {op} {b}): "
                          "every call would be refused",
                     "a require bounds the sizes (e.g. 'E <= 64'): correct it, or the "
                     "constants it is written with")


def _launch_order(problems: _Problems, grads: dict[str, Any], kernels: dict[str, Any],
                  scratch: list[str]) -> list[dict[str, Any]]:
    """The backward's launches (one per kernel and inputs), each one that writes a
    scratch tensor before those that read it; a cycle, or two launches writing one
    tensor, is refused."""
    launches: list[tuple[str, tuple[str, ...]]] = []
    for g in grads.values():
        if (g["kernel"], tuple(g["inputs"])) not in launches:
            launches.append((g["kernel"], tuple(g["inputs"])))

    def writes(launch: tuple[str, tuple[str, ...]]) -> set[str]:
        specs = kernels[launch[0]].launch.get("inputs", {}).values()
        return {ref for ref, spec in zip(launch[1], specs, strict=True) if spec.get("writes")}

    writer: dict[str, int] = {}
    for i, launch in enumerate(launches):
        for name in writes(launch):
            if name in writer:
                problems.add("autograd.scratch",
                             f"'{name}' is written by two gradient launches ('{launch[0]}' "
                             f"and '{launches[writer[name]][0]}'): which one the other reads "
                             "is not defined", "let one gradient kernel write each scratch "
                                               "tensor")
            writer[name] = i
    order: list[int] = []
    pending = list(range(len(launches)))
    while pending:
        ready = [i for i in pending
                 if all(writer.get(r, i) in (*order, i) for r in launches[i][1] if r in scratch)]
        if not ready:
            problems.add("autograd.scratch",
                         "the gradient launches read each other's scratch writes in a cycle: "
                         + ", ".join(launches[i][0] for i in pending),
                         "let the tensors one kernel writes be read only by later ones")
            return []
        order.append(ready[0])
        pending.remove(ready[0])
    return [{"kernel": launches[i][0], "inputs": list(launches[i][1])} for i in order]


def _check_scratch(problems: _Problems, section: dict[str, Any], kernels: dict[str, Any],
                   forward: str, f_outputs: dict[str, Any]) -> None:
    """A gradient kernel may write into a forward output only when the section lists it
    as scratch: an output the call does not return, which the backward then uses up."""
    scratch = section.get("scratch") or []
    hidden = [o for o in f_outputs if o not in (section.get("returns") or f_outputs)]
    for name in scratch:
        if name not in hidden:
            problems.add("autograd.scratch",
                         f"'{name}' is not a kept output of kernel '{forward}' (one the call "
                         "does not return)",
                         "kept outputs: " + (", ".join(hidden) or "none: list the returned "
                                             "ones under autograd.returns"))
    for x, grad in section["grads"].items():
        if grad["kernel"] not in kernels:
            continue                    # reported above
        inputs = list(kernels[grad["kernel"]].launch.get("inputs", {}).items())
        # a count that differs is reported above
        for i, (ref, (name, spec)) in enumerate(zip(grad["inputs"], inputs, strict=False)):
            if spec.get("writes") and ref not in scratch:
                problems.add(f"autograd.grads.{x}.inputs[{i}]",
                             f"kernel '{grad['kernel']}' writes into its input '{name}', and "
                             f"'{ref}' is not scratch: the write would reach a tensor the "
                             "caller or another gradient still reads",
                             "pass a kept forward output listed under autograd.scratch")


def _same_tensor(problems: _Problems, key: str, what: str, spec: dict[str, Any],
                 other: str, other_spec: dict[str, Any]) -> None:
    """Two tensors the runtime passes one for the other agree in dtype and rank."""
    a = (spec.get("dtype"), len(spec.get("shape", [])))
    b = (other_spec.get("dtype"), len(other_spec.get("shape", [])))
    if a != b:
        problems.add(key, f"{what} is {a[0]} with {a[1]} dimensions, {other} is {b[0]} with "
                          f"{b[1]} dimensions", "make the dtypes and ranks agree")
