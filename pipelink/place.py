"""The placer: one CP-SAT model for everything a kernel asks of an SM.

Entry point: :func:`place` turns a checked :class:`~pipelink.problem.Problem` into a
:class:`~pipelink.problem.Placement` — shared-memory offsets, named-barrier ids, warp
ranges, ``setmaxnreg`` values, Tensor Memory columns and tunable values — or raises a
:class:`DemandsDoNotFit` naming the smallest set of demands that cannot fit together.

Every solve uses the one model :func:`build_model` makes, in three steps:

1. *optimise* the recipe's objective, lexicographically, in two solves: the largest
   weighted sum of tunables; then, that fixed, the least shared memory and a fixed
   preference among equally good tunable choices (larger values, earlier tunables first);
2. *canonicalise*, single-threaded, in two solves: the tunables fixed and the peak at most
   the optimum's, the smallest offsets in problem order; then, offsets fixed too, the
   lowest barrier ids, the fewest warpgroups, the lowest warp bases and the fewest
   registers (barriers, warps and registers do not depend on the layout);
3. *re-check* the extracted placement in plain Python (:func:`verify`).

Determinism: every solve runs on one thread with a fixed seed and a deterministic time
limit (counted work, never wall time), so a placement is the same bytes on every run and
machine, for any ``workers``, for a given OR-Tools version. Parallel workers are not used:
their race decides which of several equal solutions comes back, so they cannot give
the single-threaded bytes. Canonicalising starts from a solution every run computes alike
(the optimum's own solution, else the first-fit layout at the optimum's tunables), so it
too is reproducible when its budget runs out.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace

from ortools.sat.python import cp_model

from .errors import PlacementError
from .problem import (
    ARCH_LIMITS,
    SETMAXNREG_MAX,
    SETMAXNREG_MIN,
    SETMAXNREG_STEP,
    THREADS_PER_WARP,
    TMEM_MIN_COLUMNS,
    WARPGROUP_WARPS,
    Buffer,
    NamedBarrier,
    Placement,
    Problem,
    Role,
    RoleSlot,
    Sized,
    Tunable,
    tmem_allocatable,
)

# Solver budgets in deterministic seconds: work the solver counts, the same on any machine.
OPTIMISE_DTIME = 0.08     # the largest tunables
SMEM_DTIME = 0.04         # then the least shared memory
CANONICAL_DTIME = 0.02    # each of the two canonical solves
EXPLAIN_DTIME = 0.5       # each solve of an infeasibility explanation
EXPLAIN_TOTAL_DTIME = 5.0 # all of them
OBJECTIVES = ("max_tunables_then_min_smem",)
# Exact lexicographic preference among tunables while the choices number at most this.
EXACT_TIE_CHOICES = 1 << 16
WARPGROUP_THREADS = WARPGROUP_WARPS * THREADS_PER_WARP
MAX_THREAD_REGS = 255     # the most registers one thread can address


class DemandsDoNotFit(PlacementError):
    """The kernel does not fit; ``demands`` names the smallest set that cannot fit together
    (``smem:load.a_tiles``, ``barrier:epi.sync``, ``role:mma``, ``tmem:mma.acc``)."""

    def __init__(self, message: str, demands: tuple[str, ...], **kw: object) -> None:
        self.demands = demands
        super().__init__(message, **kw)


def launch_regs(warpgroups: int, regs_per_sm: int = 65536) -> int:
    """Registers per thread at launch, as ``__launch_bounds__(warpgroups * 128, 1)`` lets
    the compiler use them: the SM's register file shared by the threads, rounded down to a
    multiple of 8 (the step ``setmaxnreg`` moves in), capped at 255 (the most a thread can
    address; one or two warpgroups get 255). Warpgroups whose ``setmaxnreg`` value is below
    it decrease, those above it increase."""
    if warpgroups == 0:
        return 0
    per_thread = regs_per_sm // (warpgroups * WARPGROUP_THREADS)
    return min(per_thread // SETMAXNREG_STEP * SETMAXNREG_STEP, MAX_THREAD_REGS)


def register_pool(warpgroups: int, regs_per_sm: int = 65536) -> int:
    """The sum of per-warpgroup ``setmaxnreg`` values the launch allocation can back.

    ``setmaxnreg.inc`` only takes registers that ``.dec`` released inside the CTA, so the
    values may not add up to more than what was allocated at launch. The launch count is
    taken in steps of 8 (255 counts as 248): nothing relies on the hardware rounding up."""
    regs = launch_regs(warpgroups, regs_per_sm)
    return warpgroups * (regs // SETMAXNREG_STEP * SETMAXNREG_STEP)


def spread_registers(problem: Problem, p: Placement) -> tuple[int, ...]:
    """The kernel-level register budget. Contracts state what each role's code needs and
    the model gives each warpgroup that much; what the launch pool has left goes, in equal
    steps of 8, to the warpgroups that run a warpgroup role (wgmma, umma, setmaxnreg):
    the math warpgroups, the way CUTLASS gives its consumers 232 beside a 40-register
    producer. Other warpgroups keep their need, so a producer still releases registers.
    A warpgroup role owns its four warps in its phase, so any other role on them runs in
    another phase (an elementwise pass between two GEMMs, say) and gains from the spare
    as well: it does not make the warpgroup give the spare up."""
    regs = list(p.warpgroup_regs)
    whole = {r.name for r in problem.roles if r.warpgroup}
    math = sorted({w // WARPGROUP_WARPS for name, slot in p.roles.items() if name in whole
                   for w in range(slot.warp_base, slot.warp_base + slot.warps)})
    spare = register_pool(len(regs), problem.limits["regs_per_sm"]) - sum(regs)
    if not math or spare < SETMAXNREG_STEP * len(math):
        return tuple(regs)
    share = spare // len(math) // SETMAXNREG_STEP * SETMAXNREG_STEP
    for g in math:
        regs[g] = min(regs[g] + share, SETMAXNREG_MAX)
    return tuple(regs)


# -- data ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Demand:
    """One thing the kernel asks for; the unit an infeasibility explanation is made of."""

    key: str                       # "smem:load.a_tiles"
    kind: str                      # smem | barrier | role | tmem
    name: str
    source: str


@dataclass(frozen=True)
class SmemGroup:
    """Buffers at one address: a buffer and the zero-copy buffers that are the same memory."""

    name: str                      # the first member in problem order
    members: tuple[Buffer, ...]
    size: Sized                    # the largest member, for every tunable combination
    align: int
    live: tuple[int, int]          # [first, last) phases, the hull of the members'


@dataclass(frozen=True)
class Data:
    """A problem checked and normalised for the model: tunable domains intersected with
    their equals, shared buffers grouped, lifetimes resolved, spans padded."""

    problem: Problem
    limits: dict[str, int]
    domains: dict[str, tuple[int, ...]]            # tunable -> allowed values, ascending
    groups: tuple[SmemGroup, ...]
    phases: int
    barrier_lives: dict[str, tuple[int, int]]
    spans: dict[str, int]                          # role -> warps it occupies
    demands: tuple[Demand, ...]

    @property
    def max_warpgroups(self) -> int:
        return self.limits["max_warps"] // WARPGROUP_WARPS

    @property
    def barrier_ids(self) -> int:
        return self.limits["named_barriers"] - 1   # id 0 is __syncthreads


def prepare(problem: Problem) -> Data:
    """Checks what a solver would only call infeasible without saying why, and normalises."""
    if problem.arch not in ARCH_LIMITS:
        raise PlacementError(f"unknown arch '{problem.arch}'",
                             hint="one of " + ", ".join(sorted(ARCH_LIMITS)))
    if problem.objective not in OBJECTIVES:
        raise PlacementError(f"unknown objective '{problem.objective}'",
                             hint="one of " + ", ".join(OBJECTIVES))
    limits = problem.limits
    _unique("tunable", [t.name for t in problem.tunables])
    _unique("shared-memory buffer", [b.name for b in problem.buffers])
    _unique("named barrier", [b.name for b in problem.barriers])
    _unique("role", [r.name for r in problem.roles])
    _unique("tensor-memory allocation", [t.name for t in problem.tmem])
    domains = _domains(problem)
    for sized, what, source in _sized_demands(problem):
        _check_table(sized, domains, what, source)
    phases = max([1] + [live[1] for live in _lives(problem)])
    for what, live, source in _named_lives(problem):
        if live is not None and not 0 <= live[0] < live[1]:
            raise PlacementError(f"{what}: lifetime {list(live)} is empty or negative",
                                 where=source or None,
                                 hint="live is [first, last) phase indices, first < last")
    groups = _groups(problem, domains, phases)
    _check_smem(problem, limits, groups, domains)
    _check_barriers(problem, limits, phases)
    spans = _check_roles(problem, limits)
    _check_tmem(problem, limits, domains)
    demands = tuple(
        [Demand(f"smem:{g.name}", "smem", g.name, _group_source(g)) for g in groups]
        + [Demand(f"barrier:{b.name}", "barrier", b.name, b.source) for b in problem.barriers]
        + [Demand(f"role:{r.name}", "role", r.name, r.source) for r in problem.roles]
        + [Demand(f"tmem:{t.name}", "tmem", t.name, t.source) for t in problem.tmem])
    lives = {b.name: b.live or (0, phases) for b in problem.barriers}
    return Data(problem, limits, domains, groups, phases, lives, spans, demands)


def _unique(what: str, names: list[str]) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise PlacementError(f"two {what}s are named '{name}'")
        seen.add(name)


def _domains(problem: Problem) -> dict[str, tuple[int, ...]]:
    """Each tunable's values, intersected across ``equal`` ties (they take one value)."""
    known = {t.name: t for t in problem.tunables}
    parent = {name: name for name in known}

    def find(name: str) -> str:
        while parent[name] != name:
            name = parent[name]
        return name

    for a, b in problem.equal:
        for name in (a, b):
            if name not in known:
                raise PlacementError(f"equal tunables ({a}, {b}): no tunable '{name}'")
        parent[find(b)] = find(a)
    for t in problem.tunables:
        if not t.values:
            raise PlacementError(f"tunable {t.name} allows no value", where=t.source or None)
    classes: dict[str, list[Tunable]] = {}
    for t in problem.tunables:
        classes.setdefault(find(t.name), []).append(t)
    domains = {}
    for members in classes.values():
        common = set(members[0].values).intersection(*(t.values for t in members[1:]))
        if not common:
            listing = ", ".join(f"{t.name} {list(t.values)} ({t.source})" for t in members)
            raise PlacementError(f"tunables that must be equal share no value: {listing}",
                                 hint="widen the pins so the ranges meet")
        for t in members:
            domains[t.name] = tuple(sorted(common))
    return domains


def _sized_demands(problem: Problem) -> list[tuple[Sized, str, str]]:
    return ([(b.size, f"shared memory {b.name}", b.source) for b in problem.buffers]
            + [(t.columns, f"tensor memory {t.name}", t.source) for t in problem.tmem])


def _check_table(sized: Sized, domains: dict[str, tuple[int, ...]], what: str,
                 source: str) -> None:
    for dep in sized.depends:
        if dep not in domains:
            raise PlacementError(f"{what}: size depends on unknown tunable '{dep}'",
                                 where=source or None)
    keys = {k for k, _ in sized.table}
    for combo in itertools.product(*(domains[d] for d in sized.depends)):
        if combo not in keys:
            at = ", ".join(f"{d} = {v}" for d, v in zip(sized.depends, combo, strict=True))
            raise PlacementError(f"{what}: no size for {at}", where=source or None)
    if any(v < 0 for _, v in sized.table):
        raise PlacementError(f"{what}: negative size", where=source or None)


def _lives(problem: Problem) -> list[tuple[int, int]]:
    return [x.live for x in (*problem.buffers, *problem.barriers, *problem.roles,
                             *problem.tmem) if x.live is not None]


def _named_lives(problem: Problem) -> list[tuple[str, tuple[int, int] | None, str]]:
    return ([(f"shared memory {b.name}", b.live, b.source) for b in problem.buffers]
            + [(f"named barrier {b.name}", b.live, b.source) for b in problem.barriers])


def _groups(problem: Problem, domains: dict[str, tuple[int, ...]],
            phases: int) -> tuple[SmemGroup, ...]:
    index = {b.name: i for i, b in enumerate(problem.buffers)}
    parent = list(range(len(problem.buffers)))

    def find(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    for a, b in problem.shared:
        for name in (a, b):
            if name not in index:
                raise PlacementError(f"zero-copy pair ({a}, {b}): no buffer '{name}'")
        ra, rb = find(index[a]), find(index[b])
        parent[max(ra, rb)] = min(ra, rb)   # the root stays the first in problem order
    members: dict[int, list[Buffer]] = {}
    for i, b in enumerate(problem.buffers):
        members.setdefault(find(i), []).append(b)
    order = [t.name for t in problem.tunables]
    groups = []
    for root in sorted(members):
        bufs = members[root]
        deps = tuple(sorted({d for b in bufs for d in b.size.depends}, key=order.index))
        table = []
        for combo in itertools.product(*(domains[d] for d in deps)):
            at = dict(zip(deps, combo, strict=True))
            table.append((combo, max(b.size.at(at) for b in bufs)))
        lives = [b.live or (0, phases) for b in bufs]
        groups.append(SmemGroup(bufs[0].name, tuple(bufs), Sized(deps, tuple(table)),
                                max(b.align for b in bufs),
                                (min(lv[0] for lv in lives), max(lv[1] for lv in lives))))
    return tuple(groups)


def _group_source(g: SmemGroup) -> str:
    return "; ".join(b.source for b in g.members if b.source)


def _check_smem(problem: Problem, limits: dict[str, int], groups: tuple[SmemGroup, ...],
                domains: dict[str, tuple[int, ...]]) -> None:
    for b in problem.buffers:
        if b.align < 1 or b.align & (b.align - 1):
            raise PlacementError(f"shared memory {b.name}: alignment {b.align} is not a power "
                                 "of two", where=b.source or None)
    limit = limits["smem_bytes"]
    for g in groups:
        least = min(v for _, v in g.size.table)
        if least > limit:
            names = " = ".join(b.name for b in g.members)
            raise DemandsDoNotFit(
                f"shared memory: {names} alone needs {describe_size(g, domains, least)}, more "
                f"than the {fmt_bytes(limit)} a block gets on {problem.arch}",
                (f"smem:{g.name}",), where=_group_source(g) or None,
                hint=_smem_hint([g], domains))


def _check_barriers(problem: Problem, limits: dict[str, int], phases: int) -> None:
    top = limits["named_barriers"] - 1
    fixed: dict[int, NamedBarrier] = {}
    for b in problem.barriers:
        if b.fixed is None:
            continue
        if not 1 <= b.fixed <= top:
            raise PlacementError(f"named barrier {b.name}: fixed id {b.fixed} is outside "
                                 f"1..{top} (0 is __syncthreads)", where=b.source or None)
        if b.fixed in fixed:
            other = fixed[b.fixed]
            raise DemandsDoNotFit(
                f"named barriers {other.name} ({other.source}) and {b.name} ({b.source}) both "
                f"hard-code id {b.fixed}", (f"barrier:{other.name}", f"barrier:{b.name}"),
                hint="make one of them take its id from the placement")
        fixed[b.fixed] = b
    # Free barriers share the ids nobody hard-codes; lifetimes are intervals, so they fit
    # exactly when no phase has more of them live than ids left (interval graphs colour
    # with as many colours as their largest clique). Solvers prove this only slowly.
    free = [b for b in problem.barriers if b.fixed is None]
    left = top - len(fixed)
    for p in range(phases):
        live = [b for b in free if (b.live or (0, phases))[0] <= p < (b.live or (0, phases))[1]]
        if len(live) > left:
            core = [*fixed.values(), *live[:left + 1]]
            ids = f"only ids 1..{top} exist on {problem.arch}"
            if fixed:
                ids = (f"only {left} of ids 1..{top} are left on {problem.arch} once "
                       + ", ".join(f"{b.name} hard-codes {b.fixed}" for b in fixed.values()))
            raise DemandsDoNotFit(
                f"named barriers: {', '.join(b.name for b in live[:left + 1])} are live "
                f"together in phase {p} and need {left + 1} distinct ids, but {ids}"
                + "".join(f"\n  {b.name}: {b.source or 'no source'}" for b in core),
                tuple(f"barrier:{b.name}" for b in core),
                hint="let components take barrier ids from the placement, or shorten "
                     "barrier lifetimes so fewer are live at once")


def _check_roles(problem: Problem, limits: dict[str, int]) -> dict[str, int]:
    most = limits["max_warps"]
    spans = {}
    for r in problem.roles:
        if r.warps < 1:
            raise PlacementError(f"role {r.name}: {r.warps} warps", where=r.source or None)
        if r.registers > SETMAXNREG_MAX:
            raise DemandsDoNotFit(
                f"registers: role {r.name} needs {r.registers} per thread, setmaxnreg gives at "
                f"most {SETMAXNREG_MAX}", (f"role:{r.name}",), where=r.source or None)
        # wgmma and setmaxnreg act on whole warpgroups: such a role owns all four warps
        spans[r.name] = _round_up(r.warps, WARPGROUP_WARPS) if r.warpgroup else r.warps
    # Roles of one phase run side by side; phases take turns on the warps.
    phases = max([1] + [r.live[1] for r in problem.roles if r.live])
    crowded = max((p for p in range(phases)), key=lambda p: sum(
        spans[r.name] for r in problem.roles if _live_in(r.live, p)))
    side_by_side = [r for r in problem.roles if _live_in(r.live, crowded)]
    if sum(spans[r.name] for r in side_by_side) > most:
        core = list(side_by_side)
        for r in side_by_side:    # drop what is not needed to go over: a minimal set
            if sum(spans[x.name] for x in core) - spans[r.name] > most:
                core.remove(r)
        listing = " + ".join(f"{r.name} {spans[r.name]}" for r in core)
        raise DemandsDoNotFit(
            f"warps: {listing} = {sum(spans[r.name] for r in core)} warps, more than {most} "
            f"on {problem.arch}" + "".join(f"\n  {r.name}: {r.source or 'no source'}"
                                            for r in core),
            tuple(f"role:{r.name}" for r in core),
            hint="fewer consumer warpgroups, or split the kernel")
    return spans


def _live_in(live: tuple[int, int] | None, phase: int) -> bool:
    return live is None or live[0] <= phase < live[1]


def _check_tmem(problem: Problem, limits: dict[str, int],
                domains: dict[str, tuple[int, ...]]) -> None:
    columns = limits["tmem_columns"]
    for t in problem.tmem:
        if columns == 0:
            raise DemandsDoNotFit(f"tensor memory: {t.name} asks for columns but "
                                  f"{problem.arch} has no Tensor Memory",
                                  (f"tmem:{t.name}",), where=t.source or None,
                                  hint="build this component for sm_100a only")
        for _, v in t.columns.table:
            if not tmem_allocatable(v):
                raise PlacementError(f"tensor memory {t.name}: {v} columns; allocations are "
                                     f"powers of two of at least {TMEM_MIN_COLUMNS}",
                                     where=t.source or None)
        least = min(t.columns.at(dict(zip(t.columns.depends, c, strict=True)))
                    for c in itertools.product(*(domains[d] for d in t.columns.depends)))
        if least > columns:
            raise DemandsDoNotFit(f"tensor memory: {t.name} alone needs {least} columns, "
                                  f"more than {columns} on {problem.arch}",
                                  (f"tmem:{t.name}",), where=t.source or None)


def _round_up(value: int, to: int) -> int:
    return -(-value // to) * to


def _reg_need(role: Role) -> int:
    return max(SETMAXNREG_MIN, _round_up(role.registers, SETMAXNREG_STEP))


# -- variables and constraints ------------------------------------------------------------


@dataclass
class Vars:
    """The model's variables, keyed by what they mean."""

    tunable: dict[str, cp_model.IntVar] = field(default_factory=dict)        # value
    tunable_index: dict[str, cp_model.IntVar] = field(default_factory=dict)  # into domain
    offset_unit: dict[str, cp_model.IntVar] = field(default_factory=dict)    # offset / align
    size: dict[str, cp_model.LinearExprT] = field(default_factory=dict)      # group bytes
    end: dict[str, cp_model.IntVar] = field(default_factory=dict)
    smem_bytes: cp_model.IntVar | None = None
    barrier: dict[str, cp_model.IntVar] = field(default_factory=dict)
    role_base: dict[str, cp_model.LinearExprT] = field(default_factory=dict)
    role_start: dict[str, cp_model.IntVar] = field(default_factory=dict)     # base / step
    warpgroups: cp_model.IntVar | None = None
    regs_step: list[cp_model.IntVar] = field(default_factory=list)  # setmaxnreg / 8 per wg
    tmem: dict[str, cp_model.LinearExprT] = field(default_factory=dict)      # columns
    score: cp_model.LinearExprT = 0       # weighted sum of tunable values
    tie: cp_model.LinearExprT = 0         # preference among equal scores
    present: dict[str, cp_model.IntVar] = field(default_factory=dict)  # explain: demand key

    def offset(self, g: SmemGroup) -> cp_model.LinearExprT:
        return self.offset_unit[g.name] * g.align


def build_model(data: Data, *, explain: bool = False) -> tuple[cp_model.CpModel, Vars]:
    """The whole SM as one CP-SAT model (no objective: each solve step sets its own).

    With ``explain`` every demand gets a presence literal (its buffer, barrier, role or
    allocation exists only when the literal holds), so assumptions on those literals find
    the demands that cannot fit together."""
    model, v = cp_model.CpModel(), Vars()
    if explain:
        for d in data.demands:
            v.present[d.key] = model.new_bool_var(f"present[{d.key}]")
    _tunables(model, v, data)
    _smem(model, v, data, explain)
    _barriers(model, v, data, explain)
    _warps(model, v, data, explain)
    _tmem(model, v, data)
    return model, v


def _when(v: Vars, key: str) -> list[cp_model.IntVar]:
    """Enforcement literals of a demand: none outside explain mode."""
    return [v.present[key]] if key in v.present else []


def _tunables(model: cp_model.CpModel, v: Vars, data: Data) -> None:
    problem = data.problem
    for t in problem.tunables:
        values = data.domains[t.name]
        idx = model.new_int_var(0, len(values) - 1, f"tunable_index[{t.name}]")
        val = model.new_int_var_from_domain(cp_model.Domain.from_values(values),
                                            f"tunable[{t.name}]")
        model.add_element(idx, values, val)
        v.tunable_index[t.name], v.tunable[t.name] = idx, val
    for a, b in problem.equal:
        model.add(v.tunable[a] == v.tunable[b])
    v.score = sum(t.weight * v.tunable[t.name] for t in problem.tunables)
    v.tie = sum(w * v.tunable_index[t] for t, w in _tie_weights(data).items())


def _sized_var(model: cp_model.CpModel, v: Vars, data: Data, sized: Sized,
               name: str) -> cp_model.LinearExprT:
    """A size from its table: a constant, an element of one tunable, or a table row."""
    values = sorted({val for _, val in sized.table})
    if len(values) == 1:
        return values[0]
    var = model.new_int_var_from_domain(cp_model.Domain.from_values(values), name)
    table = dict(sized.table)
    if len(sized.depends) == 1:
        dep = sized.depends[0]
        model.add_element(v.tunable_index[dep], [table[(x,)] for x in data.domains[dep]], var)
    else:
        rows = [(*combo, table[combo])
                for combo in itertools.product(*(data.domains[d] for d in sized.depends))]
        model.add_allowed_assignments([v.tunable[d] for d in sized.depends] + [var], rows)
    return var


def _present_size(model: cp_model.CpModel, size: cp_model.LinearExprT, most: int,
                  lits: list[cp_model.IntVar], name: str) -> cp_model.LinearExprT:
    """``size`` when the demand is present, 0 when it is not (explain mode)."""
    if not lits:
        return size
    if isinstance(size, int):
        return size * lits[0]
    eff = model.new_int_var(0, most, name)
    model.add(eff == size).only_enforce_if(lits[0])
    model.add(eff == 0).only_enforce_if(~lits[0])
    return eff


def _smem(model: cp_model.CpModel, v: Vars, data: Data, explain: bool) -> None:
    limit = data.limits["smem_bytes"]
    v.smem_bytes = model.new_int_var(0, limit, "smem_bytes")
    xs, ys, used = [], [], {}
    for g in data.groups:
        key, most = f"smem:{g.name}", g.size.max()
        lits = _when(v, key)
        size = _sized_var(model, v, data, g.size, f"size[{g.name}]")
        least = min(val for _, val in g.size.table)
        top = (limit + most if explain else limit) - least
        unit = model.new_int_var(0, max(0, top) // g.align, f"offset_unit[{g.name}]")
        end = model.new_int_var(0, limit + most if explain else limit, f"end[{g.name}]")
        start = unit * g.align
        first, last = g.live
        if lits:
            xs.append(model.new_optional_interval_var(start, size, end, lits[0],
                                                      f"address[{g.name}]"))
            ys.append(model.new_optional_fixed_size_interval_var(first, last - first, lits[0],
                                                                 f"phases[{g.name}]"))
            model.add(end <= limit).only_enforce_if(lits)
        else:
            xs.append(model.new_interval_var(start, size, end, f"address[{g.name}]"))
            ys.append(model.new_fixed_size_interval_var(first, last - first,
                                                        f"phases[{g.name}]"))
        model.add(v.smem_bytes >= end).only_enforce_if(lits)
        v.offset_unit[g.name], v.size[g.name], v.end[g.name] = unit, size, end
        used[g.name] = _present_size(model, size, most, lits, f"present_size[{g.name}]")
    # Buffers overlap in time -> not in address: rectangles in address x phase.
    model.add_no_overlap_2d(xs, ys)
    # Redundant, for the bound: what is live in one phase adds up to at most the total.
    live_sets = {frozenset(g.name for g in data.groups if g.live[0] <= p < g.live[1])
                 for p in range(data.phases)}
    for names in sorted((s for s in live_sets if len(s) > 1), key=sorted):
        if not any(names < other for other in live_sets):
            model.add(sum(used[n] for n in sorted(names)) <= v.smem_bytes)


def _overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def _barriers(model: cp_model.CpModel, v: Vars, data: Data, explain: bool) -> None:
    bars = data.problem.barriers
    top = data.barrier_ids
    fixed = [b for b in bars if b.fixed is not None]
    # Explain mode: an absent barrier takes a spare id above the hardware's.
    ceiling = top + len(bars) if explain else top
    for b in bars:
        ids = cp_model.Domain(1, ceiling)
        if not explain and b.fixed is None:   # ids that components hard-code are theirs
            taken = cp_model.Domain.from_values([f.fixed for f in fixed])
            ids = ids.intersection_with(taken.complement())
        v.barrier[b.name] = model.new_int_var_from_domain(ids, f"barrier[{b.name}]")
    for b in bars:
        lits, var = _when(v, f"barrier:{b.name}"), v.barrier[b.name]
        if b.fixed is not None:
            model.add(var == b.fixed).only_enforce_if(lits)
        if explain:
            model.add(var <= top).only_enforce_if(lits)
            if b.fixed is None:
                for f in fixed:
                    model.add(var != f.fixed).only_enforce_if(_when(v, f"barrier:{f.name}"))
    # Distinct while live: one all-different per phase's set of live barriers (two
    # lifetimes overlap iff they share a phase), so too many at once fails at once.
    live_sets = {frozenset(b.name for b in bars
                           if data.barrier_lives[b.name][0] <= p < data.barrier_lives[b.name][1])
                 for p in range(data.phases)}
    order = [b.name for b in bars]
    for names in sorted((s for s in live_sets if len(s) > 1), key=sorted):
        if not any(names < other for other in live_sets):
            model.add_all_different([v.barrier[n] for n in sorted(names, key=order.index)])


def _warps(model: cp_model.CpModel, v: Vars, data: Data, explain: bool) -> None:
    roles, most = data.problem.roles, data.limits["max_warps"]
    groups = data.max_warpgroups
    v.warpgroups = model.new_int_var(1 if roles else 0, groups, "warpgroups")
    intervals, times = [], []
    for r in roles:
        span, lits = data.spans[r.name], _when(v, f"role:{r.name}")
        step = WARPGROUP_WARPS if r.warpgroup else 1
        start = model.new_int_var(0, (most - span) // step, f"warp_start[{r.name}]")
        base = start * step
        v.role_base[r.name], v.role_start[r.name] = base, start
        first, last = r.live or (0, data.phases)
        if lits:
            intervals.append(model.new_optional_fixed_size_interval_var(base, span, lits[0],
                                                                        f"warps[{r.name}]"))
            times.append(model.new_optional_fixed_size_interval_var(
                first, last - first, lits[0], f"phases[{r.name}]"))
        else:
            intervals.append(model.new_fixed_size_interval_var(base, span, f"warps[{r.name}]"))
            times.append(model.new_fixed_size_interval_var(first, last - first,
                                                           f"phases[{r.name}]"))
        model.add(WARPGROUP_WARPS * v.warpgroups >= base + span).only_enforce_if(lits)
    if data.phases > 1:   # roles of different phases take turns on the same warps
        model.add_no_overlap_2d(intervals, times)
    else:
        model.add_no_overlap(intervals)
    lo, hi = SETMAXNREG_MIN // SETMAXNREG_STEP, SETMAXNREG_MAX // SETMAXNREG_STEP
    for w in range(groups):
        active = model.new_bool_var(f"warpgroup_active[{w}]")
        model.add(v.warpgroups >= w + 1).only_enforce_if(active)
        model.add(v.warpgroups <= w).only_enforce_if(~active)
        step = model.new_int_var(0, hi, f"setmaxnreg_step[{w}]")
        model.add(step >= lo).only_enforce_if(active)
        model.add(step == 0).only_enforce_if(~active)
        v.regs_step.append(step)
    # Every warpgroup a role touches gets at least that role's registers.
    for r in roles:
        need, span = _reg_need(r), data.spans[r.name]
        if need <= SETMAXNREG_MIN:
            continue
        base = v.role_base[r.name]
        for w in range(groups):
            first, last = w * WARPGROUP_WARPS, (w + 1) * WARPGROUP_WARPS
            starts_before = model.new_bool_var(f"starts_before[{r.name},{w}]")
            model.add(base <= last - 1).only_enforce_if(starts_before)
            model.add(base >= last).only_enforce_if(~starts_before)
            ends_after = model.new_bool_var(f"ends_after[{r.name},{w}]")
            model.add(base + span >= first + 1).only_enforce_if(ends_after)
            model.add(base + span <= first).only_enforce_if(~ends_after)
            model.add(SETMAXNREG_STEP * v.regs_step[w] >= need).only_enforce_if(
                [starts_before, ends_after, *_when(v, f"role:{r.name}")])
    regs_per_sm = data.limits["regs_per_sm"]
    pools = [register_pool(n, regs_per_sm) for n in range(groups + 1)]
    pool = model.new_int_var(0, max(pools), "register_pool")
    model.add_element(v.warpgroups, pools, pool)
    model.add(SETMAXNREG_STEP * sum(v.regs_step) <= pool)
    model.add(WARPGROUP_THREADS * SETMAXNREG_STEP * sum(v.regs_step) <= regs_per_sm)


def _tmem(model: cp_model.CpModel, v: Vars, data: Data) -> None:
    used = []
    for t in data.problem.tmem:
        cols = _sized_var(model, v, data, t.columns, f"tmem_columns[{t.name}]")
        v.tmem[t.name] = cols
        used.append(_present_size(model, cols, t.columns.max(), _when(v, f"tmem:{t.name}"),
                                  f"present_columns[{t.name}]"))
    # Powers of two packed largest first never leave a hole: the sum of what is live at
    # once (in one phase) is the whole test.
    for p in range(data.phases):
        live = [u for u, t in zip(used, data.problem.tmem, strict=True)
                if (t.live or (0, data.phases))[0] <= p < (t.live or (0, data.phases))[1]]
        if live:
            model.add(sum(live) <= data.limits["tmem_columns"])


# -- solve --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Optimum:
    status: str
    score: int
    smem_bytes: int
    tie: int
    tunables: dict[str, int]
    found: Placement | None = None     # the solution, when every run finds it alike
    solution: tuple[int, ...] = ()     # and all its variables, to start later solves from


def _solver(seed: int, dtime: float) -> cp_model.CpSolver:
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = seed
    solver.parameters.max_deterministic_time = dtime
    return solver


def _hint_all(model: cp_model.CpModel, solution: tuple[int, ...]) -> None:
    """Hints every variable of a model built by :func:`build_model` with a solution of
    another such model (same data: same variables, in the same order)."""
    n = len(model.proto.variables)
    model.proto.solution_hint.vars.extend(range(n))
    model.proto.solution_hint.values.extend(solution[:n])


def _tie_weights(data: Data) -> dict[str, int]:
    """Mixed-radix weights on tunable indices (larger values, earlier tunables first) while
    the choices are few enough to order exactly; plain sums beyond."""
    choices = 1
    for t in data.problem.tunables:
        choices *= len(data.domains[t.name])
    weights, radix = {}, 1
    for t in reversed(data.problem.tunables):
        weights[t.name] = radix
        if choices <= EXACT_TIE_CHOICES:
            radix *= len(data.domains[t.name])
    return weights


def _peak(smem: dict[str, tuple[int, int]]) -> int:
    return max([0] + [offset + size for offset, size in smem.values()])


def _solve(model: cp_model.CpModel, seed: int, dtime: float) -> tuple[int, cp_model.CpSolver]:
    """One thread, a fixed seed and a deterministic budget: the same answer on every run,
    machine and worker count. (Parallel CP-SAT workers race, and the winner of the race
    changes the solution: several workers gave other bytes, labelled a layout OPTIMAL that
    another run beat, and handed the layout step a start at other tunables.)"""
    solver = _solver(seed, dtime)
    status = solver.solve(model)
    if status == cp_model.MODEL_INVALID:
        raise PlacementError("the placement model is invalid; this is a bug in the placer",
                             log=model.validate())
    return status, solver


def _optimise(data: Data, seed: int) -> _Optimum | None:
    """Step 1, the recipe's objective in two solves: the largest weighted sum of tunables,
    then, with it fixed, the least shared memory and the preferred tunables among equals.
    None when nothing fits. The greedy baseline wins where the search did worse."""
    from .synth import first_fit
    problem = data.problem
    weights = _tie_weights(data)
    tie_span = 1 + sum(w * (len(data.domains[t]) - 1) for t, w in weights.items())
    best = None
    model, v = build_model(data)
    # Largest values first: the answer is usually near there and found before proving.
    model.add_decision_strategy([v.tunable_index[t.name] for t in problem.tunables],
                                cp_model.CHOOSE_FIRST, cp_model.SELECT_MAX_VALUE)
    model.maximize(v.score)
    status, solver = _solve(model, seed, OPTIMISE_DTIME)
    if status == cp_model.INFEASIBLE:
        return None
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        best = _optimum(data, solver, v, "FEASIBLE")
        model.clear_objective()
        if problem.tunables:
            model.add(v.score == best.score)
        if best.solution:
            _hint_all(model, best.solution)
        model.minimize(v.smem_bytes * tie_span - v.tie)
        second, solver = _solve(model, seed, SMEM_DTIME)
        if second in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            both = "OPTIMAL" if second == status == cp_model.OPTIMAL else "FEASIBLE"
            best = _optimum(data, solver, v, both)
    baseline = first_fit(problem, data=data)
    if baseline is not None:
        tie = sum(weights[t] * data.domains[t].index(x) for t, x in baseline.tunables.items())
        score = sum(t.weight * baseline.tunables[t.name] for t in problem.tunables)
        greedy = _Optimum("FIRST_FIT", score, baseline.smem_bytes, tie, baseline.tunables,
                          baseline)
        if best is None or (greedy.score, -greedy.smem_bytes, greedy.tie) > (
                best.score, -best.smem_bytes, best.tie):
            best = greedy
    if best is None:
        raise PlacementError(f"no placement found within the solver budget ({OPTIMISE_DTIME} "
                             "deterministic s) and the greedy one does not fit",
                             hint="report this kernel: it is a hard case")
    return best


def _optimum(data: Data, solver: cp_model.CpSolver, v: Vars, status: str) -> _Optimum:
    return _Optimum(status, int(solver.value(v.score)), int(solver.value(v.smem_bytes)),
                    int(solver.value(v.tie)),
                    {t: int(solver.value(x)) for t, x in v.tunable.items()},
                    _extract(data, solver, v), tuple(solver.response_proto.solution))


def _canonicalise(data: Data, best: _Optimum, seed: int) -> tuple[Placement, str]:
    """Step 2, single-threaded, in two solves of one model: the optimum's tunables fixed and
    at most its shared memory (or the greedy layout's at those tunables, if less), first the
    smallest offsets in problem order, then, those fixed too, the lowest barrier ids, the
    fewest warpgroups, the lowest warp bases and the fewest registers. Each solve starts
    from, and falls back to, a placement every run computes alike. Returns the placement
    and the status of the layout solve."""
    from .synth import first_fit_smem
    problem = data.problem
    greedy = first_fit_smem(problem, best.tunables, data=data)
    bound = min(best.smem_bytes, _peak(greedy))
    start = best.found
    if start is not None and start.tunables != best.tunables:
        start = None   # never lay out, or fall back to, a solution at other tunables
    if start is not None and start.smem_bytes <= bound:
        fallback = start.smem
    else:
        fallback = greedy
    model, v = build_model(data)
    for name, value in best.tunables.items():
        model.add(v.tunable[name] == value)
    model.add(v.smem_bytes <= bound)
    if best.solution and fallback is not greedy:
        _hint_all(model, best.solution)
    else:
        for g in data.groups:
            model.add_hint(v.offset_unit[g.name], fallback[g.name][0] // g.align)
    groups, bars, roles = data.groups, problem.barriers, problem.roles
    # Weight = rank x size: Smith's rule then orders equal-peak layouts by problem order.
    sizes = {g.name: g.size.at(best.tunables) for g in groups}
    model.minimize(sum((len(groups) - i) * max(1, -(-sizes[g.name] // 8)) * v.offset(g)
                       for i, g in enumerate(groups)))
    solver = _solver(seed, CANONICAL_DTIME)
    status = solver.solve(model)
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        layout = _extract(data, solver, v)
        offsets = layout.smem
        if status != cp_model.OPTIMAL:
            offsets = _compact(data, best.tunables, offsets)
        warps_start = layout
        model.clear_hints()
        _hint_all(model, tuple(solver.response_proto.solution))
    else:
        offsets, warps_start = _compact(data, best.tunables, fallback), start
    # Barriers, warps and registers do not depend on the layout: fix it, order the rest.
    model.clear_objective()
    for g in groups:
        model.add(v.offset(g) == offsets[g.name][0])
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE) and start is not None:
        _hint_warps(model, v, data, start)
    ids = sum((len(bars) - i) * v.barrier[b.name] for i, b in enumerate(bars))
    bases = sum((len(roles) - i) * v.role_base[r.name] for i, r in enumerate(roles))
    regs_weight = SETMAXNREG_MAX // SETMAXNREG_STEP * data.max_warpgroups + 1
    most_bases = len(roles) * (len(roles) + 1) // 2 * data.limits["max_warps"]
    groups_weight = (most_bases + 1) * regs_weight
    # Fewest warpgroups, then lowest bases, then fewest registers; ids beside them.
    model.minimize(ids + v.warpgroups * groups_weight + bases * regs_weight
                   + sum(v.regs_step))
    second = solver.solve(model)
    if second in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        placement = _extract(data, solver, v)
    elif warps_start is not None:
        placement = warps_start
    else:
        raise PlacementError("the placer found an optimum but could not lay it out again "
                             f"within {CANONICAL_DTIME} deterministic s",
                             hint="report this kernel: it is a hard case")
    return replace(placement, smem=offsets, smem_bytes=_peak(offsets)), \
        solver.status_name(status)


def _hint_warps(model: cp_model.CpModel, v: Vars, data: Data, p: Placement) -> None:
    for b in data.problem.barriers:
        model.add_hint(v.barrier[b.name], p.barriers[b.name])
    for r in data.problem.roles:
        model.add_hint(v.role_start[r.name],
                       p.roles[r.name].warp_base // (WARPGROUP_WARPS if r.warpgroup else 1))
    model.add_hint(v.warpgroups, len(p.warpgroup_regs))
    for w, step in enumerate(v.regs_step):
        regs = p.warpgroup_regs[w] if w < len(p.warpgroup_regs) else 0
        model.add_hint(step, regs // SETMAXNREG_STEP)


def _compact(data: Data, tunables: dict[str, int],
             smem: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    """Slides each buffer, in problem order, down to its lowest free aligned offset: what an
    unfinished canonical search leaves, tidied alike on every run; never raises the peak."""
    groups = data.groups
    offsets = [smem[g.name][0] for g in groups]
    sizes = [g.size.at(tunables) for g in groups]
    for i, g in enumerate(groups):
        busy = sorted((offsets[j], offsets[j] + sizes[j]) for j, h in enumerate(groups)
                      if j != i and sizes[j] and h.live[0] < g.live[1]
                      and g.live[0] < h.live[1])
        at = 0
        for lo, hi in busy:
            if at + sizes[i] <= lo or at >= offsets[i]:
                break
            if hi > at:
                at = _round_up(hi, g.align)
        offsets[i] = min(at, offsets[i])
    return {b.name: (offsets[i], b.size.at(tunables))
            for i, g in enumerate(groups) for b in g.members}


# -- extract ------------------------------------------------------------------------------


def _extract(data: Data, solver: cp_model.CpSolver, v: Vars) -> Placement:
    problem = data.problem
    tunables = {t.name: int(solver.value(v.tunable[t.name])) for t in problem.tunables}
    smem = {}
    for g in data.groups:
        offset = int(solver.value(v.offset(g)))
        for b in g.members:
            smem[b.name] = (offset, b.size.at(tunables))
    smem_bytes = max([0] + [o + s for o, s in smem.values()])
    barriers = {b.name: int(solver.value(v.barrier[b.name])) for b in problem.barriers}
    roles = {r.name: RoleSlot(int(solver.value(v.role_base[r.name])), r.warps)
             for r in problem.roles}
    n_wg = int(solver.value(v.warpgroups))
    regs = tuple(SETMAXNREG_STEP * int(solver.value(s)) for s in v.regs_step[:n_wg])
    columns = {t.name: t.columns.at(tunables) for t in problem.tmem}
    return Placement(problem.arch, tunables, smem, smem_bytes, barriers, roles, regs,
                     launch_regs(n_wg, data.limits["regs_per_sm"]), pack_tmem(problem, columns))


def pack_tmem(problem: Problem, columns: dict[str, int]) -> dict[str, tuple[int, int]]:
    """Column offsets: largest allocation first (then problem order), each at the running
    sum, which powers of two keep aligned to their own size. What lives in every phase
    goes first; each phase packs its own allocations after it, from the same column, so
    phases that never run together share columns."""
    whole = [t for t in problem.tmem if t.live is None]
    phases = sorted({t.live for t in problem.tmem if t.live is not None})
    out, base = {}, 0
    for t in sorted(whole, key=lambda t: -columns[t.name]):
        out[t.name] = (base, columns[t.name])
        base += columns[t.name]
    for live in phases:
        at = base
        for t in sorted((t for t in problem.tmem if t.live == live),
                        key=lambda t: -columns[t.name]):
            out[t.name] = (at, columns[t.name])
            at += columns[t.name]
    return {t.name: out[t.name] for t in problem.tmem}


# -- entry point --------------------------------------------------------------------------


def place(problem: Problem, *, workers: int = 1, seed: int = 0) -> Placement:
    """Places one kernel. Every solve is single-threaded, so the placement is the same bytes
    for any ``workers`` (kept for callers; it must be >= 1) and on every run; it is the
    same for any ``seed`` whenever the optimum is proven (``Placement.solver`` says so)."""
    if workers < 1:
        raise PlacementError(f"workers is {workers}; at least one solver thread is needed",
                             hint="pass workers >= 1")
    data = prepare(problem)
    best = _optimise(data, seed)
    if best is None:
        raise explain_infeasible(data, seed)
    placement, canonical = _canonicalise(data, best, seed)
    status = best.status
    if status == "OPTIMAL" and placement.smem_bytes > best.smem_bytes:
        status = "FEASIBLE"   # never label a layout optimal that the optimum beats
    placement = Placement(
        placement.arch, placement.tunables, placement.smem, placement.smem_bytes,
        placement.barriers, placement.roles, spread_registers(problem, placement),
        placement.launch_regs,
        placement.tmem, {"status": status, "canonical": canonical,
                         "objective": {"tunables": best.score,
                                       "smem_bytes": placement.smem_bytes}})
    broken = verify(problem, placement)
    if broken:
        raise PlacementError("the placer produced a placement that breaks its own rules; "
                             "this is a bug in the placer", log="\n".join(broken))
    return placement


# -- re-check -----------------------------------------------------------------------------


def verify(problem: Problem, placement: Placement) -> list[str]:
    """Every rule the model encodes, checked again in plain Python. Empty when all hold."""
    out: list[str] = []
    limits = problem.limits
    tun = placement.tunables
    for t in problem.tunables:
        if tun.get(t.name) not in t.values:
            out.append(f"tunable {t.name} = {tun.get(t.name)} not in {list(t.values)}")
    if out:
        return out
    for a, b in problem.equal:
        if tun[a] != tun[b]:
            out.append(f"tunables {a} = {tun[a]} and {b} = {tun[b]} must be equal")
    out += _verify_smem(problem, placement, limits)
    out += _verify_barriers(problem, placement, limits)
    out += _verify_warps(problem, placement, limits)
    out += _verify_tmem(problem, placement, limits)
    return out


def _verify_smem(problem: Problem, p: Placement, limits: dict[str, int]) -> list[str]:
    out = []
    phases = max([1] + [live[1] for live in _lives(problem)])
    rects = []
    for b in problem.buffers:
        if b.name not in p.smem:
            out.append(f"buffer {b.name} not placed")
            continue
        offset, size = p.smem[b.name]
        if size != b.size.at(p.tunables):
            out.append(f"buffer {b.name}: {size} bytes, expected {b.size.at(p.tunables)}")
        if offset % b.align:
            out.append(f"buffer {b.name}: offset {offset} not a multiple of {b.align}")
        if offset + size > p.smem_bytes or p.smem_bytes > limits["smem_bytes"]:
            out.append(f"buffer {b.name}: ends at {offset + size}, beyond {p.smem_bytes} or "
                       f"the limit {limits['smem_bytes']}")
        rects.append((b.name, offset, offset + size, b.live or (0, phases)))
    for a, b in problem.shared:
        if a in p.smem and b in p.smem and p.smem[a][0] != p.smem[b][0]:
            out.append(f"zero-copy buffers {a} and {b} are at different offsets")
    same = _shared_classes(problem)
    for (na, oa, ea, la), (nb, ob, eb, lb) in itertools.combinations(rects, 2):
        if same[na] != same[nb] and _overlaps(la, lb) and oa < eb and ob < ea:
            out.append(f"buffers {na} and {nb} overlap while both live")
    return out


def _shared_classes(problem: Problem) -> dict[str, str]:
    cls = {b.name: b.name for b in problem.buffers}

    def find(n: str) -> str:
        while cls[n] != n:
            n = cls[n]
        return n

    for a, b in problem.shared:
        cls[find(b)] = find(a)
    return {n: find(n) for n in cls}


def _verify_barriers(problem: Problem, p: Placement, limits: dict[str, int]) -> list[str]:
    out = []
    phases = max([1] + [live[1] for live in _lives(problem)])
    fixed = {b.fixed for b in problem.barriers if b.fixed is not None}
    for b in problem.barriers:
        got = p.barriers.get(b.name)
        if got is None or not 1 <= got < limits["named_barriers"]:
            out.append(f"barrier {b.name}: id {got} outside 1..{limits['named_barriers'] - 1}")
        elif b.fixed is not None and got != b.fixed:
            out.append(f"barrier {b.name}: id {got}, fixed at {b.fixed}")
        elif b.fixed is None and got in fixed:
            out.append(f"barrier {b.name}: id {got} is hard-coded by another component")
    for a, b in itertools.combinations(problem.barriers, 2):
        if (_overlaps(a.live or (0, phases), b.live or (0, phases))
                and p.barriers.get(a.name) == p.barriers.get(b.name)):
            out.append(f"barriers {a.name} and {b.name} share id {p.barriers.get(a.name)}")
    return out


def _verify_warps(problem: Problem, p: Placement, limits: dict[str, int]) -> list[str]:
    out = []
    if p.warps > limits["max_warps"]:
        out.append(f"{p.warps} warps, more than {limits['max_warps']}")
    spans = []
    for r in problem.roles:
        slot = p.roles.get(r.name)
        if slot is None or slot.warps != r.warps:
            out.append(f"role {r.name}: slot {slot}, expected {r.warps} warps")
            continue
        span = _round_up(r.warps, WARPGROUP_WARPS) if r.warpgroup else r.warps
        if r.warpgroup and slot.warp_base % WARPGROUP_WARPS:
            out.append(f"role {r.name}: base {slot.warp_base} not warpgroup-aligned")
        if slot.warp_base < 0 or slot.warp_base + span > p.warps:
            out.append(f"role {r.name}: warps {slot.warp_base}+{span} outside {p.warps}")
        spans.append((r, slot.warp_base, slot.warp_base + span))
        for w in range(slot.warp_base // WARPGROUP_WARPS,
                       _round_up(slot.warp_base + span, WARPGROUP_WARPS) // WARPGROUP_WARPS):
            if w < len(p.warpgroup_regs) and p.warpgroup_regs[w] < r.registers:
                out.append(f"role {r.name}: warpgroup {w} has {p.warpgroup_regs[w]} registers, "
                           f"needs {r.registers}")
    for (ra, a0, a1), (rb, b0, b1) in itertools.combinations(spans, 2):
        if a0 < b1 and b0 < a1 and _overlaps(ra.live or (0, 1 << 30), rb.live or (0, 1 << 30)):
            out.append(f"roles {ra.name} and {rb.name} share warps in one phase")
    for w, regs in enumerate(p.warpgroup_regs):
        if not SETMAXNREG_MIN <= regs <= SETMAXNREG_MAX or regs % SETMAXNREG_STEP:
            out.append(f"warpgroup {w}: setmaxnreg {regs} not in 24..256 step 8")
    n = len(p.warpgroup_regs)
    if p.launch_regs != launch_regs(n, limits["regs_per_sm"]):
        out.append(f"launch registers {p.launch_regs}, expected {launch_regs(n)}")
    if sum(p.warpgroup_regs) > register_pool(n, limits["regs_per_sm"]):
        out.append(f"setmaxnreg values {list(p.warpgroup_regs)} exceed the launch pool "
                   f"{register_pool(n, limits['regs_per_sm'])}")
    if WARPGROUP_THREADS * sum(p.warpgroup_regs) > limits["regs_per_sm"]:
        out.append("registers exceed the SM's register file")
    return out


def _verify_tmem(problem: Problem, p: Placement, limits: dict[str, int]) -> list[str]:
    out = []
    cols = []
    for t in problem.tmem:
        got = p.tmem.get(t.name)
        if got is None or got[1] != t.columns.at(p.tunables):
            out.append(f"tmem {t.name}: {got}, expected {t.columns.at(p.tunables)} columns")
            continue
        if got[0] % got[1] or got[0] + got[1] > limits["tmem_columns"]:
            out.append(f"tmem {t.name}: columns {got[0]}+{got[1]} misaligned or beyond "
                       f"{limits['tmem_columns']}")
        cols.append((t.name, got[0], got[0] + got[1], t.live or (0, 1 << 30)))
    for (na, a0, a1, la), (nb, b0, b1, lb) in itertools.combinations(cols, 2):
        if a0 < b1 and b0 < a1 and _overlaps(la, lb):
            out.append(f"tmem {na} and {nb} overlap in one phase")
    return out


# -- explain ------------------------------------------------------------------------------


def explain_infeasible(data: Data, seed: int = 0) -> DemandsDoNotFit:
    """The smallest set of demands that cannot fit together, as an error to raise.

    CP-SAT's sufficient assumptions give a first core; deleting each demand in turn and
    re-solving shrinks it until every demand left is needed (a minimal core). A re-solve
    that runs out of budget keeps its demand: the answer may then be larger, never wrong."""
    model, v = build_model(data, explain=True)
    keys = [d.key for d in data.demands]
    spent = [0.0]

    def infeasible(subset: list[str]) -> list[str] | None:
        model.clear_assumptions()
        model.add_assumptions([v.present[k] for k in subset])
        solver = _solver(seed, EXPLAIN_DTIME)
        status = solver.solve(model)
        spent[0] += solver.response_proto.deterministic_time
        if status != cp_model.INFEASIBLE:
            return None
        lits = {v.present[k].index: k for k in subset}
        core = {lits[i] for i in solver.sufficient_assumptions_for_infeasibility()
                if i in lits}
        return [k for k in subset if k in core] or subset

    core = infeasible(keys) or keys
    minimal = True
    for key in list(core):
        if spent[0] > EXPLAIN_TOTAL_DTIME:   # counted work, so where it stops is reproducible
            minimal = False
            break
        if key not in core:
            continue
        smaller = infeasible([k for k in core if k != key])
        if smaller is not None:
            core = smaller
    chosen = [d for d in data.demands if d.key in set(core)]
    message = _describe(data, chosen)
    if not minimal:
        message += "\n  (the search for a smaller set ran out of budget: some may not be needed)"
    return DemandsDoNotFit(message, tuple(d.key for d in chosen), hint=_hint(data, chosen))


# -- words --------------------------------------------------------------------------------


def fmt_bytes(n: int) -> str:
    if n >= 1024 and n % 1024 == 0:
        return f"{n // 1024} KiB"
    if n >= 1024:
        return f"{n / 1024:.2f} KiB"
    return f"{n} B"


def least_size(sized: Sized, domains: dict[str, tuple[int, ...]]) -> tuple[int, dict[str, int]]:
    """The smallest size over the allowed tunables, and the tunables that give it."""
    best = None
    for combo in itertools.product(*(domains[d] for d in sized.depends)):
        at = dict(zip(sized.depends, combo, strict=True))
        if best is None or sized.at(at) < best[0]:
            best = (sized.at(at), at)
    assert best is not None
    return best


def describe_size(g: SmemGroup, domains: dict[str, tuple[int, ...]], size: int) -> str:
    """``4 x 16 KiB`` when the size is one tunable times a fixed amount, else ``64 KiB``."""
    deps = g.size.depends
    if len(deps) == 1:
        table = dict(g.size.table)
        values = domains[deps[0]]
        per = {table[(x,)] // x if x and table[(x,)] % x == 0 else None for x in values}
        for x in values:
            if table[(x,)] == size and len(per) == 1 and None not in per:
                return f"{x} x {fmt_bytes(per.pop())}"
    return fmt_bytes(size)


def _describe(data: Data, chosen: list[Demand]) -> str:
    parts = []
    kinds = {d.kind for d in chosen}
    if "smem" in kinds:
        parts.append(_describe_smem(data, [d for d in chosen if d.kind == "smem"]))
    if "barrier" in kinds:
        parts.append(_describe_barriers(data, [d for d in chosen if d.kind == "barrier"]))
    if "role" in kinds:
        parts.append(_describe_roles(data, [d for d in chosen if d.kind == "role"]))
    if "tmem" in kinds:
        parts.append(_describe_tmem(data, [d for d in chosen if d.kind == "tmem"]))
    if len(parts) > 1:   # coupled through the tunables they share
        parts.insert(0, "these demands cannot all be met with one choice of tunables:")
    return "\n".join(parts)


def _group(data: Data, name: str) -> SmemGroup:
    return next(g for g in data.groups if g.name == name)


def _describe_smem(data: Data, chosen: list[Demand]) -> str:
    limit, arch = data.limits["smem_bytes"], data.problem.arch
    groups = [_group(data, d.name) for d in chosen]
    terms, total, lowest = [], 0, {}
    for g in groups:
        size, at = least_size(g.size, data.domains)
        lowest.update(at)
        total += size
        names = " = ".join(b.name for b in g.members)
        terms.append(f"{names} {describe_size(g, data.domains, size)}")
    together = all(_overlaps(a.live, b.live) for a, b in itertools.combinations(groups, 2))
    when = "live together" if together else "with their lifetimes"
    if total > limit:
        head = (f"shared memory: {' + '.join(terms)} = {fmt_bytes(total)} {when} exceeds "
                f"{fmt_bytes(limit)} on {arch}")
    else:
        head = (f"shared memory: {' + '.join(terms)} = {fmt_bytes(total)} {when} do not fit "
                f"in {fmt_bytes(limit)} on {arch} once aligned "
                f"({', '.join(f'{g.name} to {g.align} B' for g in groups)})")
    if lowest:
        head += " (already at " + ", ".join(f"{k} = {val}" for k, val in lowest.items()) + ")"
    return head + "".join(f"\n  {g.name}: {_group_source(g) or 'no source'}" for g in groups)


def _describe_barriers(data: Data, chosen: list[Demand]) -> str:
    bars = [b for b in data.problem.barriers if f"barrier:{b.name}" in {d.key for d in chosen}]
    fixed = [b for b in bars if b.fixed is not None]
    free = [b for b in bars if b.fixed is None]
    top = data.barrier_ids
    words = ", ".join(f"{b.name}" + (f" (fixed id {b.fixed})" if b.fixed is not None else "")
                      for b in bars)
    together = all(_overlaps(data.barrier_lives[a.name], data.barrier_lives[b.name])
                   for a, b in itertools.combinations(free, 2))
    head = (f"named barriers: {len(bars)} barriers {words} need distinct ids "
            f"{'while live together' if together else 'while their lifetimes overlap'}, "
            f"but only ids 1..{top} exist on {data.problem.arch}")
    if fixed:
        head += f" and {len(fixed)} of them are hard-coded"
    return head + "".join(f"\n  {b.name}: {b.source or 'no source'}" for b in bars)


def _describe_roles(data: Data, chosen: list[Demand]) -> str:
    keys = {d.key for d in chosen}
    roles = [r for r in data.problem.roles if f"role:{r.name}" in keys]
    regs_per_sm = data.limits["regs_per_sm"]
    terms = " + ".join(f"{r.name} {r.warps} warp{'s' if r.warps > 1 else ''} x {r.registers} "
                       f"registers{' (whole warpgroups)' if r.warpgroup else ''}" for r in roles)
    # A lower bound on the setmaxnreg values' sum: warpgroup roles own their warpgroups;
    # the others need at least enough warpgroups for their warps, one at their largest need.
    owned = [r for r in roles if r.warpgroup]
    others = [r for r in roles if not r.warpgroup]
    other_groups = _round_up(sum(r.warps for r in others), WARPGROUP_WARPS) // WARPGROUP_WARPS
    need = sum(_reg_need(r) * data.spans[r.name] // WARPGROUP_WARPS for r in owned)
    if others:
        need += max(_reg_need(r) for r in others) + SETMAXNREG_MIN * (other_groups - 1)
    least = other_groups + sum(data.spans[r.name] for r in owned) // WARPGROUP_WARPS
    # More warpgroups than needed change the launch count; each extra one holds >= 24.
    best = max(range(least, data.max_warpgroups + 1),
               key=lambda n: register_pool(n, regs_per_sm) - SETMAXNREG_MIN * (n - least))
    share = register_pool(best, regs_per_sm)
    return (f"warps and registers: {terms} need setmaxnreg values summing to at least "
            f"{need} over at least {least} warpgroup{'s' if least > 1 else ''}, but "
            f"{best * WARPGROUP_THREADS} threads launch with {launch_regs(best, regs_per_sm)} "
            f"registers each (setmaxnreg can share {share} among {best} warpgroups, and no "
            "other count of warpgroups gives more)"
            + "".join(f"\n  {r.name}: {r.source or 'no source'}" for r in roles))


def _describe_tmem(data: Data, chosen: list[Demand]) -> str:
    keys = {d.key for d in chosen}
    allocs = [t for t in data.problem.tmem if f"tmem:{t.name}" in keys]
    sizes = [least_size(t.columns, data.domains)[0] for t in allocs]
    terms = " + ".join(f"{t.name} {c}" for t, c in zip(allocs, sizes, strict=True))
    head = (f"tensor memory: {terms} = {sum(sizes)} columns, more than "
            f"{data.limits['tmem_columns']} on {data.problem.arch}")
    return head + "".join(f"\n  {t.name}: {t.source or 'no source'}" for t in allocs)


def _smem_hint(groups: list[SmemGroup], domains: dict[str, tuple[int, ...]]) -> str:
    """Sizes were taken at the lowest allowed tunables: what is left is lower pins (below
    the lowest allowed value), smaller tiles or shorter lifetimes."""
    tunables = sorted({d for g in groups for d in g.size.depends})
    text = "shrink the tiles (params such as tile_n)"
    if tunables:
        text = ("allow fewer " + ", ".join(f"{t} (lowest now {domains[t][0]})" for t in tunables)
                + " or " + text)
    return text + ", or give buffers shorter lifetimes so they can share memory"


def _hint(data: Data, chosen: list[Demand]) -> str:
    kinds = {d.kind for d in chosen}
    hints = []
    if "smem" in kinds:
        hints.append(_smem_hint([_group(data, d.name) for d in chosen if d.kind == "smem"],
                                data.domains))
    if "barrier" in kinds:
        hints.append("let components take barrier ids from the placement, or shorten "
                     "barrier lifetimes")
    if "role" in kinds:
        hints.append("use fewer warps or registers in a role")
    if "tmem" in kinds:
        hints.append("allocate fewer Tensor Memory columns (fewer accumulator stages)")
    return "; ".join(hints)

