"""Synthetic kernels for the placer, and the first-fit baseline it is measured against.

- :func:`gemm`: a six-component Hopper GEMM (TMA loader with A/B rings, tile scheduler,
  two wgmma consumer warpgroups, bias and activation in registers, a staged TMA store)
  as the checker would describe it: the "real kernel" of the placer's tests and bench.
- :func:`synth`: random kernels of a given number of components and buffers, seeded.
- :func:`first_fit`: the greedy placement a hand-written allocator would make: largest
  tunables first, lowered one at a time until the buffers, packed each at the lowest free
  aligned offset in problem order, fit. The placer starts from it and never loses to it.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from .problem import (
    ARCH_LIMITS,
    SETMAXNREG_MIN,
    SETMAXNREG_STEP,
    WARPGROUP_WARPS,
    Buffer,
    NamedBarrier,
    Placement,
    Problem,
    Role,
    RoleSlot,
    Sized,
    TmemAlloc,
    Tunable,
)

if TYPE_CHECKING:
    from .place import Data

MBARRIER_BYTES = 8
TILE_ALIGN = 1024           # 128-byte swizzled TMA tiles want 1024-byte alignment
BF16, F32 = 2, 4


def _stage_sized(stages: str, values: tuple[int, ...], per_stage: int) -> Sized:
    return Sized((stages,), tuple(((s,), s * per_stage) for s in values))


def gemm(arch: str = "sm_90a", tile_m: int = 128, tile_n: int = 128, tile_k: int = 64,
         stages: tuple[int, ...] = tuple(range(2, 9))) -> Problem:
    """C = act(A @ B^T + bias) on one CTA per tile, as six components.

    load: one TMA warp filling A and B rings (stages x tile each, full/empty mbarriers);
    sched: one warp handing out work tiles through a two-slot ring;
    mma: two consumer warpgroups (tile_m // 16 warps) running wgmma, whose accumulators
    flow through registers into bias, act and store (one Role: they share warps);
    store: a staging tile for the TMA store and a named barrier over the two warpgroups.
    load.stages and mma.stages are tied (zero-copy ports share the rings)."""
    src = "components/{}/contract.yaml: {}"
    consumer_warps = tile_m // 16
    a_stage, b_stage = tile_m * tile_k * BF16, tile_n * tile_k * BF16
    tunables = (Tunable("load.stages", stages, 1, src.format("tma_loader", "tunables.stages")),
                Tunable("mma.stages", stages, 1, src.format("wgmma_mainloop", "tunables.stages")))
    mbar = MBARRIER_BYTES
    buffers = [
        Buffer("load.a_tiles", _stage_sized("load.stages", stages, a_stage), TILE_ALIGN, None,
               src.format("tma_loader", "smem.a_tiles")),
        Buffer("load.b_tiles", _stage_sized("load.stages", stages, b_stage), TILE_ALIGN, None,
               src.format("tma_loader", "smem.b_tiles")),
    ]
    for name in ("a_full", "a_empty", "b_full", "b_empty"):
        buffers.append(Buffer(f"load.mbar.{name}", _stage_sized("load.stages", stages, mbar),
                              mbar, None, src.format("tma_loader", f"mbarriers.{name}")))
    buffers += [
        Buffer("sched.work", Sized.const(2 * 16), 16, None,
               src.format("tile_scheduler", "smem.work")),
        Buffer("sched.mbar.full", Sized.const(2 * mbar), mbar, None,
               src.format("tile_scheduler", "mbarriers.full")),
        Buffer("sched.mbar.empty", Sized.const(2 * mbar), mbar, None,
               src.format("tile_scheduler", "mbarriers.empty")),
        Buffer("bias.tile", Sized.const(tile_n * F32), 16, None,
               src.format("bias_epilogue", "smem.tile")),
        Buffer("store.c_stage", Sized.const(tile_m * tile_n * F32), TILE_ALIGN, None,
               src.format("store_epilogue", "smem.c_stage")),
    ]
    barriers = (NamedBarrier("store.sync", consumer_warps * 32, None, None,
                             src.format("store_epilogue", "named_barriers.sync")),)
    roles = (
        Role("load.producer", 1, 40, False, ("load.producer",),
             src.format("tma_loader", "roles.producer")),
        Role("sched.scheduler", 1, 40, False, ("sched.scheduler",),
             src.format("tile_scheduler", "roles.scheduler")),
        Role("mma.mma+bias.apply+act.apply+store.store", consumer_warps, 232, True,
             ("mma.mma", "bias.apply", "act.apply", "store.store"),
             src.format("wgmma_mainloop", "roles.mma")),
    )
    tmem = ()
    if ARCH_LIMITS[arch]["tmem_columns"]:
        tmem = (TmemAlloc("mma.acc", Sized.const(tile_n), src.format("umma_mainloop",
                                                                     "tmem.acc")),)
    return Problem(arch, tunables, (("load.stages", "mma.stages"),), tuple(buffers), (),
                   barriers, roles, tmem)


def synth(components: int, buffers: int, seed: int = 0, arch: str = "sm_90a",
          phases: int | None = None) -> Problem:
    """A random kernel: ``components`` components sharing ``buffers`` buffers, each component
    live over a window of phases with a ``stages`` tunable, stage rings with their
    mbarriers, fixed scratch, some zero-copy pairs, a named barrier, and a few roles.
    Sizes are scaled so the smallest stages fit and the largest do not."""
    rng = random.Random(seed)
    limit = ARCH_LIMITS[arch]["smem_bytes"]
    phases = phases or max(1, components // 4)
    stages = (1, 2, 3, 4, 5, 6)
    windows = []
    for _ in range(components):
        first = rng.randrange(phases)
        windows.append((first, min(phases, first + rng.randint(1, 3))))
    counts = [buffers // components + (1 if i < buffers % components else 0)
              for i in range(components)]
    tunables, bufs, shared, bars = [], [], [], []
    for c, (window, count) in enumerate(zip(windows, counts, strict=True)):
        name = f"c{c}"
        tunables.append(Tunable(f"{name}.stages", stages, rng.choice((1, 1, 2)),
                                f"synth/{name}.yaml: tunables.stages"))
        for i in range(count):
            live = window
            if window[1] - window[0] > 1 and rng.random() < 0.3:
                first = rng.randrange(window[0], window[1])
                live = (first, first + 1)
            kind = i % 4
            if kind == 3:
                size, align = _stage_sized(f"{name}.stages", stages, MBARRIER_BYTES), 8
            elif kind == 2:
                size, align = Sized.const(rng.choice((256, 512, 2048, 4096))), 128
            else:
                per_stage = rng.choice((1024, 2048, 4096, 8192))
                size, align = _stage_sized(f"{name}.stages", stages, per_stage), TILE_ALIGN
            bufs.append(Buffer(f"{name}.b{i}", size, align, live,
                               f"synth/{name}.yaml: smem.b{i}"))
        if c > 0 and count and counts[c - 1] and rng.random() < 0.15 \
                and windows[c - 1] == window:
            shared.append((f"c{c - 1}.b0", f"{name}.b0"))
        bars.append(NamedBarrier(f"{name}.sync", 128, None, window,
                                 f"synth/{name}.yaml: named_barriers.sync"))
    # Scale so the smallest stages use about half the memory at the busiest phase.
    lowest = {t.name: t.values[0] for t in tunables}
    busiest = max(sum(b.size.at(lowest) for b in bufs
                      if (b.live or (0, phases))[0] <= p < (b.live or (0, phases))[1])
                  for p in range(phases))
    scale = max(1, -(-2 * busiest // limit))
    if scale > 1:   # tiles and scratch shrink; an mbarrier stays 8 bytes
        bufs = [b if b.align == MBARRIER_BYTES else
                Buffer(b.name, Sized(b.size.depends, tuple(
                    (k, _scaled(v, scale, b.align)) for k, v in b.size.table)),
                       b.align, b.live, b.source) for b in bufs]
    bars = _keep_barriers(bars, ARCH_LIMITS[arch]["named_barriers"] - 1)
    roles = _roles(rng, components)
    tmem = []
    if ARCH_LIMITS[arch]["tmem_columns"]:
        for c in range(0, components, max(1, components // 3))[:3]:
            tmem.append(TmemAlloc(f"c{c}.acc", Sized((f"c{c}.stages",), tuple(
                ((s,), 64 if s <= 2 else 128) for s in stages)), f"synth/c{c}.yaml: tmem.acc"))
    return Problem(arch, tuple(tunables), (), tuple(bufs), tuple(shared), tuple(bars),
                   roles, tuple(tmem))


def _scaled(value: int, scale: int, align: int) -> int:
    return max(align, value // scale // align * align) if value else 0


def _keep_barriers(bars: list[NamedBarrier], ids: int) -> list[NamedBarrier]:
    """Drops barriers where more than ``ids - 3`` would be live at once."""
    kept: list[NamedBarrier] = []
    for b in bars:
        lo, hi = b.live or (0, 1)
        busy = max(sum(1 for k in kept if (k.live or (0, 1))[0] <= p < (k.live or (0, 1))[1])
                   for p in range(lo, hi))
        if busy < ids - 3:
            kept.append(b)
    return kept


def _roles(rng: random.Random, components: int) -> tuple[Role, ...]:
    """A producer warp, a scheduler warp, small helper warps and consumer warpgroups whose
    registers use what the producers leave; each role is one component's."""
    consumers = rng.choice((1, 2, 2, 3))
    helpers = min(2, max(0, components - consumers - 2))
    kinds = [("producer", 1, 40, False), ("scheduler", 1, 40, False)]
    kinds += [("helper", 1, 40, False)] * helpers
    warpgroups = 1 + consumers
    pool = warpgroups * min(255, 65536 // (warpgroups * 128)) // 8 * 8
    regs = min(232, (pool - 40) // consumers // 8 * 8)
    kinds += [("mma", 4, rng.choice((regs, regs - 16, regs - 32)), True)] * consumers
    roles = []
    for c, (kind, warps, registers, warpgroup) in enumerate(kinds):
        name = f"c{c % components}.{kind}{c // components or ''}"
        roles.append(Role(name, warps, registers, warpgroup, (name,),
                          f"synth/c{c % components}.yaml: roles.{kind}"))
    return tuple(roles)


# -- the first-fit baseline ---------------------------------------------------------------


def first_fit_smem(problem: Problem, tunables: dict[str, int], *,
                   data: Data | None = None) -> dict[str, tuple[int, int]]:
    """Each buffer (zero-copy partners with it) at the lowest offset, a multiple of its
    alignment, clear of every earlier buffer live at the same time; problem order.
    ``data``: the problem as :func:`pipelink.place.prepare` made it, if at hand."""
    from .place import prepare
    return _Packer(data or prepare(problem)).layout(tunables)


class _Packer:
    """First-fit over the shared-memory groups, with who-overlaps-whom worked out once."""

    def __init__(self, data: Data) -> None:
        self.groups = data.groups
        self.tables = [(g.size.depends, dict(g.size.table)) for g in self.groups]
        lives = [g.live for g in self.groups]
        self.overlapping = [[j for j, other in enumerate(lives)
                             if j != i and live[0] < other[1] and other[0] < live[1]]
                            for i, live in enumerate(lives)]
        self.earlier = [[j for j in near if j < i] for i, near in enumerate(self.overlapping)]

    def sizes(self, tunables: dict[str, int]) -> list[int]:
        return [table[tuple(tunables[d] for d in deps)] for deps, table in self.tables]

    def pack(self, tunables: dict[str, int]) -> list[tuple[int, int]]:
        """(offset, end) of every group."""
        out: list[tuple[int, int]] = []
        for i, (g, size) in enumerate(zip(self.groups, self.sizes(tunables), strict=True)):
            offset = 0
            for lo, hi in sorted([out[j] for j in self.earlier[i]]):
                if offset + size <= lo:
                    break
                if hi > offset:
                    offset = -(-hi // g.align) * g.align
            out.append((offset, offset + size))
        return out

    def layout(self, tunables: dict[str, int]) -> dict[str, tuple[int, int]]:
        return {b.name: (offset, b.size.at(tunables))
                for g, (offset, _) in zip(self.groups, self.pack(tunables), strict=True)
                for b in g.members}


def first_fit(problem: Problem, *, data: Data | None = None) -> Placement | None:
    """The greedy baseline; None when it cannot place the kernel. ``data`` as above."""
    from .place import launch_regs, pack_tmem, prepare, register_pool
    data = data or prepare(problem)
    limits = data.limits
    packer = _Packer(data)
    tunables = _greedy_tunables(problem, data, packer)
    if tunables is None:
        return None
    smem = packer.layout(tunables)
    barriers = _first_fit_barriers(problem, data)
    slots = _first_fit_warps(problem, data)
    if barriers is None or slots is None:
        return None
    warps = max([0] + [s.warp_base + data.spans[n] for n, s in slots.items()])
    n_wg = -(-warps // WARPGROUP_WARPS)
    regs = []
    for w in range(n_wg):
        lo, hi = w * WARPGROUP_WARPS, (w + 1) * WARPGROUP_WARPS
        needs = [r.registers for r in problem.roles
                 if slots[r.name].warp_base < hi and slots[r.name].warp_base
                 + data.spans[r.name] > lo]
        regs.append(max([SETMAXNREG_MIN] + [-(-x // SETMAXNREG_STEP) * SETMAXNREG_STEP
                                            for x in needs]))
    if sum(regs) > register_pool(n_wg, limits["regs_per_sm"]):
        return None
    columns = {t.name: t.columns.at(tunables) for t in problem.tmem}
    return Placement(problem.arch, tunables, smem,
                     max([0] + [o + s for o, s in smem.values()]), barriers, slots,
                     tuple(regs), launch_regs(n_wg, limits["regs_per_sm"]),
                     pack_tmem(problem, columns), {"status": "FIRST_FIT"})


def _greedy_tunables(problem: Problem, data: Data, packer: _Packer) -> dict[str, int] | None:
    """Largest values first; while something ends beyond the limit, lower (with its
    equals) the tunable on which most bytes live beside it depend, one per overflow."""
    domains, limits = data.domains, data.limits
    order = [t.name for t in problem.tunables]
    cls = {name: name for name in order}

    def find(n: str) -> str:
        while cls[n] != n:
            n = cls[n]
        return n

    for a, b in problem.equal:
        cls[find(b)] = find(a)
    root = {name: find(name) for name in order}
    index = {name: len(domains[name]) - 1 for name in order}

    def worst(stake: dict[str, int]) -> str | None:
        movable = [c for c in stake if index[c] > 0]
        return max(movable, key=lambda c: (stake[c], -order.index(c)), default=None)

    while True:
        tun = {name: domains[name][i] for name, i in index.items()}
        ends = packer.pack(tun)
        sizes = packer.sizes(tun)
        lower = set()
        for i, (_, end) in enumerate(ends):
            if end <= limits["smem_bytes"]:
                continue
            stake: dict[str, int] = {}
            for j in [i, *packer.overlapping[i]]:
                for d in packer.tables[j][0]:
                    stake[root[d]] = stake.get(root[d], 0) + sizes[j]
            lower.add(worst(stake))
        if problem.tmem and sum(t.columns.at(tun) for t in problem.tmem) > limits["tmem_columns"]:
            stake = {}
            for t in problem.tmem:
                for d in t.columns.depends:
                    stake[root[d]] = stake.get(root[d], 0) + t.columns.at(tun)
            lower.add(worst(stake))
        if not lower:
            return tun
        lower.discard(None)
        if not lower:   # something overflows with everything beside it already lowest
            return None
        for name in order:
            if root[name] in lower:
                index[name] -= 1


def _first_fit_barriers(problem: Problem, data: Data) -> dict[str, int] | None:
    fixed = {b.fixed for b in problem.barriers if b.fixed is not None}
    lives = data.barrier_lives
    out: dict[str, int] = {}
    for b in problem.barriers:
        if b.fixed is not None:
            out[b.name] = b.fixed
    for b in problem.barriers:
        if b.fixed is not None:
            continue
        lo, hi = lives[b.name]
        taken = fixed | {out[n] for n in out if lives[n][0] < hi and lo < lives[n][1]}
        free = [i for i in range(1, data.barrier_ids + 1) if i not in taken]
        if not free:
            return None
        out[b.name] = free[0]
    return {b.name: out[b.name] for b in problem.barriers}


def _first_fit_warps(problem: Problem, data: Data) -> dict[str, RoleSlot] | None:
    most = data.limits["max_warps"]
    used: list[tuple[int, int, tuple[int, int]]] = []
    out = {}
    for r in problem.roles:
        span = data.spans[r.name]
        step = WARPGROUP_WARPS if r.warpgroup else 1
        live = r.live or (0, data.phases)
        # Roles of disjoint phases may share warps.
        base = next((b for b in range(0, most - span + 1, step)
                     if all(b + span <= u0 or u1 <= b or live[1] <= t[0] or t[1] <= live[0]
                            for u0, u1, t in used)), None)
        if base is None:
            return None
        used.append((base, base + span, live))
        out[r.name] = RoleSlot(base, r.warps)
    return out
