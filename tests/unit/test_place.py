"""The placer on hand-made problems: feasible ones with a known optimum (one row each), and
infeasible ones whose explanation names exactly the demands in conflict, never the
innocent ones. No compiler, no GPU."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest

from pipelink.errors import PlacementError
from pipelink.place import DemandsDoNotFit, launch_regs, place, register_pool, verify
from pipelink.problem import (
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
from pipelink.synth import first_fit, gemm, synth

KiB = 1024
LIMIT = 227 * KiB


def per_stage(tunable: str, values: tuple[int, ...], each: int) -> Sized:
    return Sized((tunable,), tuple(((v,), v * each) for v in values))


def buf(name: str, size: int | Sized, align: int = 16,
        live: tuple[int, int] | None = None) -> Buffer:
    sized = size if isinstance(size, Sized) else Sized.const(size)
    return Buffer(name, sized, align, live, f"{name.split('.')[0]}.yaml: smem.{name}")


def role(name: str, warps: int, registers: int = 40, warpgroup: bool = False) -> Role:
    return Role(name, warps, registers, warpgroup, (name,), f"{name.split('.')[0]}.yaml")


def bar(name: str, fixed: int | None = None, live: tuple[int, int] | None = None) -> NamedBarrier:
    return NamedBarrier(name, 128, fixed, live, f"{name.split('.')[0]}.yaml")


STAGES = (1, 2, 3, 4)


@dataclass(frozen=True)
class Case:
    """A problem and what its optimal placement must show."""

    problem: Problem
    tunables: dict[str, int] = field(default_factory=dict)
    smem_bytes: int | None = None
    smem: dict[str, tuple[int, int]] = field(default_factory=dict)
    barriers: dict[str, int] = field(default_factory=dict)
    roles: dict[str, int] = field(default_factory=dict)          # name -> warp base
    warpgroup_regs: tuple[int, ...] | None = None
    launch_regs: int | None = None
    tmem: dict[str, tuple[int, int]] = field(default_factory=dict)


FEASIBLE = {
    # 5 stages of 32 KiB A+B tiles + the 64 KiB C stage is the most that fits in 227 KiB.
    "gemm_sm90": Case(gemm(), {"load.stages": 5, "mma.stages": 5}, 230112,
                      {"load.a_tiles": (0, 80 * KiB), "load.b_tiles": (80 * KiB, 80 * KiB),
                       "store.c_stage": (160 * KiB, 64 * KiB)},
                      {"store.sync": 1},
                      {"load.producer": 0, "sched.scheduler": 1,
                       "mma.mma+bias.apply+act.apply+store.store": 4},
                      (40, 232, 232), 168),
    "gemm_sm100_tmem": Case(gemm("sm_100a"), {"load.stages": 5}, 230112,
                            tmem={"mma.acc": (0, 128)}),
    # Lifetimes that do not overlap share addresses.
    "phases_reuse": Case(Problem("sm_90a", buffers=(buf("a.x", 100 * KiB, live=(0, 1)),
                                                    buf("b.y", 120 * KiB, live=(1, 2)))),
                         smem_bytes=120 * KiB, smem={"a.x": (0, 100 * KiB),
                                                     "b.y": (0, 120 * KiB)}),
    # The 1 KiB-aligned buffer goes first; the 8-byte one after it, not before.
    "alignment": Case(Problem("sm_90a", buffers=(buf("a.mbar", 8, 8), buf("a.tile", 1024, 1024))),
                      smem_bytes=1032, smem={"a.tile": (0, 1024), "a.mbar": (1024, 8)}),
    # Weight 2 on x: x gets 4 stages, y the 3 that still fit (7 x 32 KiB = 224 KiB).
    "weighted_tunables": Case(Problem(
        "sm_90a", tunables=(Tunable("x.stages", STAGES, 2), Tunable("y.stages", STAGES, 1)),
        buffers=(buf("x.t", per_stage("x.stages", STAGES, 32 * KiB), 1024),
                 buf("y.t", per_stage("y.stages", STAGES, 32 * KiB), 1024))),
        {"x.stages": 4, "y.stages": 3}, 224 * KiB),
    # Zero-copy partners are one region, as large as the larger of them.
    "zero_copy": Case(Problem("sm_90a", buffers=(buf("p.out", 64 * KiB, 1024),
                                                 buf("c.in", 32 * KiB, 1024),
                                                 buf("c.other", 4 * KiB, 1024)),
                              shared=(("p.out", "c.in"),)),
                      smem_bytes=68 * KiB, smem={"p.out": (0, 64 * KiB), "c.in": (0, 32 * KiB),
                                                 "c.other": (64 * KiB, 4 * KiB)}),
    # Tied tunables take one value: 2 x (2 x 40 KiB) fits, 3 does not.
    "equal_tunables": Case(Problem(
        "sm_90a", tunables=(Tunable("a.stages", STAGES), Tunable("b.stages", STAGES)),
        equal=(("a.stages", "b.stages"),),
        buffers=(buf("a.t", per_stage("a.stages", STAGES, 40 * KiB), 1024),
                 buf("b.t", per_stage("b.stages", STAGES, 40 * KiB), 1024))),
        {"a.stages": 2, "b.stages": 2}, 160 * KiB),
    # A fixed id is kept and avoided; barriers live at different times share the lowest id.
    "barriers": Case(Problem("sm_90a", barriers=(bar("a.sync"), bar("b.sync", fixed=1),
                                                 bar("c.sync", live=(0, 1)),
                                                 bar("d.sync", live=(1, 2)))),
                     barriers={"a.sync": 2, "b.sync": 1, "c.sync": 3, "d.sync": 3}),
    # One-warp roles pack into one warpgroup; warpgroup roles start on multiples of 4. Bases
    # weighted by problem order: two one-warp roles first beat one warpgroup first.
    "warps": Case(Problem("sm_90a", roles=(role("mma", 4, 232, True), role("load", 1),
                                           role("sched", 1), role("mma2", 4, 232, True))),
                  roles={"mma": 4, "load": 0, "sched": 1, "mma2": 8},
                  warpgroup_regs=(40, 232, 232), launch_regs=168),
    # Registers decide the warpgroup count: 4 consumer warpgroups at 232 do not fit, so the
    # kernel runs 4 warpgroups with the producer's on its own: 40 + 3 x 152 <= 4 x 128.
    "registers": Case(Problem("sm_90a", roles=(role("load", 1), role("a", 4, 152, True),
                                               role("b", 4, 152, True),
                                               role("c", 4, 152, True))),
                      roles={"load": 0, "a": 4, "b": 8, "c": 12},
                      warpgroup_regs=(40, 152, 152, 152), launch_regs=128),
    # TMEM: largest first, each at a multiple of its size; stages limited by 512 columns.
    "tmem": Case(Problem(
        "sm_100a", tunables=(Tunable("m.stages", (1, 2, 4)),),
        tmem=(TmemAlloc("e.scratch", Sized.const(64), "e.yaml"),
              TmemAlloc("m.acc", Sized(("m.stages",), (((1,), 128), ((2,), 256), ((4,), 512))),
                        "m.yaml"))),
        {"m.stages": 2}, tmem={"m.acc": (0, 256), "e.scratch": (256, 64)}),
}


@pytest.mark.parametrize("case", FEASIBLE.values(), ids=FEASIBLE.keys())
def test_optimal_placement(case: Case):
    p = place(case.problem)
    assert verify(case.problem, p) == []
    assert p.solver["status"] == "OPTIMAL"
    for name, value in case.tunables.items():
        assert p.tunables[name] == value, name
    if case.smem_bytes is not None:
        assert p.smem_bytes == case.smem_bytes
    for name, where in case.smem.items():
        assert p.smem[name] == where, name
    assert {k: p.barriers[k] for k in case.barriers} == case.barriers
    assert {k: p.roles[k].warp_base for k in case.roles} == case.roles
    if case.warpgroup_regs is not None:
        assert p.warpgroup_regs == case.warpgroup_regs
    if case.launch_regs is not None:
        assert p.launch_regs == case.launch_regs
    for name, where in case.tmem.items():
        assert p.tmem[name] == where, name


@dataclass(frozen=True)
class Bad:
    """An infeasible problem, the demands its explanation must name (exactly), and words
    its message must contain."""

    problem: Problem
    demands: tuple[str, ...]
    words: tuple[str, ...] = ()


G = gemm()
HIGH = tuple(replace(t, values=(6, 7, 8)) for t in G.tunables)

INFEASIBLE = {
    # The example: A and B rings at their lowest pinned stages and the C stage;
    # mbarriers, scheduler and bias are innocent.
    "smem_stages": Bad(replace(G, tunables=HIGH),
                       ("smem:load.a_tiles", "smem:load.b_tiles", "smem:store.c_stage"),
                       ("load.a_tiles 6 x 16 KiB", "store.c_stage 64 KiB", "= 256 KiB",
                        "exceeds 227 KiB on sm_90a", "load.stages = 6",
                        "components/store_epilogue/contract.yaml: smem.c_stage")),
    # Only the buffers live in phase 0 conflict; the phase-1 buffer is innocent.
    "smem_phases": Bad(Problem("sm_90a", buffers=(buf("a.x", 150 * KiB, live=(0, 1)),
                                                  buf("b.y", 100 * KiB, live=(0, 1)),
                                                  buf("c.z", 200 * KiB, live=(1, 2)),
                                                  buf("d.w", 1 * KiB, live=(1, 2)))),
                       ("smem:a.x", "smem:b.y"), ("live together", "= 250 KiB")),
    # 2 x 113.5 KiB is exactly 227 KiB, but 64 KiB alignment leaves a hole between them.
    "smem_alignment": Bad(Problem("sm_90a", buffers=(buf("a.x", 116224, 65536),
                                                     buf("b.y", 116224, 65536),
                                                     buf("c.z", 64, 16, live=(1, 2)))),
                          ("smem:a.x", "smem:b.y"), ("once aligned",)),
    "smem_one_buffer": Bad(Problem("sm_90a", buffers=(buf("a.huge", 300 * KiB), buf("b.ok", 1))),
                           ("smem:a.huge",), ("alone needs 300 KiB",)),
    "barriers_too_many": Bad(Problem("sm_90a", barriers=tuple(
                                bar(f"x{i}.sync", live=(0, 1)) for i in range(16))
                                + (bar("late.sync", live=(1, 2)),)),
                             tuple(f"barrier:x{i}.sync" for i in range(16)),
                             ("live together in phase 0", "only ids 1..15")),
    "barriers_fixed": Bad(Problem("sm_90a", barriers=(bar("a.sync", fixed=13),)
                                  + tuple(bar(f"x{i}.sync") for i in range(15))),
                          ("barrier:a.sync",) + tuple(f"barrier:x{i}.sync" for i in range(15)),
                          ("a.sync hard-codes 13",)),
    "barriers_same_fixed": Bad(Problem("sm_90a", barriers=(bar("a.sync", 13), bar("b.sync", 13),
                                                           bar("c.sync"))),
                               ("barrier:a.sync", "barrier:b.sync"), ("both hard-code id 13",)),
    # 3 x 232-register warpgroups cannot share 3 x 168; the producer warp is innocent.
    "registers": Bad(Problem("sm_90a", roles=(role("load", 1), role("a", 4, 232, True),
                                              role("b", 8, 232, True))),
                     ("role:a", "role:b"), ("setmaxnreg can share 504",)),
    "warps": Bad(Problem("sm_90a", roles=(role("a", 1), role("b", 24), role("c", 8),
                                          role("d", 1))),
                 ("role:b", "role:c", "role:d"), ("33 warps, more than 32",)),
    "registers_one_role": Bad(Problem("sm_90a", roles=(role("a", 4, 300, True),)),
                              ("role:a",), ("at most 256",)),
    "tmem_columns": Bad(Problem("sm_100a", buffers=(buf("a.x", 1),), tmem=(
                            TmemAlloc("a.acc", Sized.const(512), "a.yaml"),
                            TmemAlloc("b.acc", Sized.const(32), "b.yaml"))),
                        ("tmem:a.acc", "tmem:b.acc"), ("544 columns, more than 512",)),
    "tmem_on_hopper": Bad(Problem("sm_90a", tmem=(TmemAlloc("a.acc", Sized.const(128),
                                                            "a.yaml"),)),
                          ("tmem:a.acc",), ("no Tensor Memory",)),
}


@pytest.mark.parametrize("bad", INFEASIBLE.values(), ids=INFEASIBLE.keys())
def test_infeasible_names_exactly_the_conflict(bad: Bad):
    with pytest.raises(DemandsDoNotFit) as info:
        place(bad.problem)
    assert info.value.demands == bad.demands
    text = str(info.value)
    for word in bad.words:
        assert word in text


def test_explanation_carries_sources_and_a_hint():
    with pytest.raises(DemandsDoNotFit) as info:
        place(replace(G, tunables=HIGH))
    err = info.value
    assert "components/tma_loader/contract.yaml: smem.a_tiles" in err.message
    assert "mbar" not in err.message and "sched" not in err.message
    assert "load.stages" in err.hint


BROKEN = {
    "fixed_id_range": (Problem("sm_90a", barriers=(bar("a.sync", fixed=16),)),
                       "fixed id 16 is outside 1..15"),
    "fixed_id_zero": (Problem("sm_90a", barriers=(bar("a.sync", fixed=0),)), "0 is __syncthreads"),
    "equal_disjoint": (Problem("sm_90a", tunables=(Tunable("a.s", (1, 2)), Tunable("b.s", (3,))),
                               equal=(("a.s", "b.s"),)), "share no value"),
    "unknown_tunable": (Problem("sm_90a", buffers=(buf("a.x", per_stage("a.s", (1,), 8)),)),
                        "unknown tunable 'a.s'"),
    "empty_lifetime": (Problem("sm_90a", buffers=(buf("a.x", 8, live=(2, 2)),)), "empty"),
    "alignment": (Problem("sm_90a", buffers=(buf("a.x", 8, 24),)), "not a power of two"),
    "tmem_not_pow2": (Problem("sm_100a", tmem=(TmemAlloc("a.acc", Sized.const(96), "a.yaml"),)),
                      "powers of two"),
    "unknown_arch": (Problem("sm_75"), "unknown arch"),
    "duplicate": (Problem("sm_90a", buffers=(buf("a.x", 8), buf("a.x", 16))), "two shared"),
    "objective": (Problem("sm_90a", objective="min_warps"), "unknown objective"),
}


@pytest.mark.parametrize("problem,words", BROKEN.values(), ids=BROKEN.keys())
def test_sanity_checks(problem: Problem, words: str):
    with pytest.raises(PlacementError, match=words):
        place(problem)


def test_launch_registers():
    # __launch_bounds__(threads, 1): the register file per thread, to 8, at most 255.
    assert [launch_regs(n) for n in range(1, 9)] == [255, 255, 168, 128, 96, 80, 72, 64]
    assert register_pool(3) == 504 and register_pool(1) == 248


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_synthetic_never_worse_than_first_fit(seed: int):
    problem = synth(8, 48, seed=seed, arch="sm_100a" if seed == 3 else "sm_90a")
    p, greedy = place(problem), first_fit(problem)
    assert verify(problem, p) == []
    assert greedy is not None and verify(problem, greedy) == []

    def score(x: Placement) -> int:
        return sum(t.weight * x.tunables[t.name] for t in problem.tunables)

    assert (score(p), -p.smem_bytes) >= (score(greedy), -greedy.smem_bytes)


@pytest.mark.parametrize("components,buffers,arch", [(1, 3, "sm_90a"), (6, 24, "sm_90a"),
                                                    (64, 512, "sm_100a")])
def test_synth_is_seeded_and_sized(components: int, buffers: int, arch: str):
    problem = synth(components, buffers, seed=7, arch=arch)
    assert problem == synth(components, buffers, seed=7, arch=arch)
    assert problem != synth(components, buffers, seed=8, arch=arch)
    assert len(problem.buffers) == buffers and len(problem.tunables) == components
    assert sum(r.warps for r in problem.roles) <= 32
    assert bool(problem.tmem) == (arch == "sm_100a")
    greedy = first_fit(problem)     # the generator makes kernels that fit
    assert greedy is not None and verify(problem, greedy) == []


CORRUPT = {
    "overlap": lambda p: replace(p, smem={**p.smem, "load.b_tiles": (0, 80 * KiB)}),
    "misaligned": lambda p: replace(p, smem={**p.smem, "load.a_tiles": (8, 80 * KiB)}),
    "barrier_clash": lambda p: replace(p, barriers={"store.sync": 0}),
    "warps_overlap": lambda p: replace(p, roles={**p.roles, "sched.scheduler": RoleSlot(0, 1)}),
    "registers": lambda p: replace(p, warpgroup_regs=(40, 232, 200)),
    "pool": lambda p: replace(p, warpgroup_regs=(256, 232, 232)),
    "tunable": lambda p: replace(p, tunables={**p.tunables, "mma.stages": 4}),
}


@pytest.mark.parametrize("corrupt", CORRUPT.values(), ids=CORRUPT.keys())
def test_verify_catches(corrupt):
    good = place(G)
    assert verify(G, good) == []
    assert verify(G, corrupt(good)) != []
