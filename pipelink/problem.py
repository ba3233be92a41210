"""The placement problem: what one kernel demands of an SM, as plain data.

The checker builds a :class:`Problem` from the recipe and the contracts; the placer
(:mod:`pipelink.place`) turns it into a :class:`Placement`. Keeping this a small set of
frozen dataclasses lets the placer be tested on hand-made and synthetic problems
without any contract, compiler or GPU.

Names are ``instance.field`` (``load.a_tiles``), the way a kernel author reads them.
``source`` says where a demand came from (``components/tma_loader/contract.yaml:
smem.a_tiles``) so explanations can point at the file to edit.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

# Per-arch SM limits, in one table (read by the placer, the glue and the checker).
# cluster_ctas: the portable cluster size. A larger cluster (16 on some sm_90a and
# sm_100a parts) launches only with the non-portable cluster size attribute set, and only
# where the GPU has it.
ARCH_LIMITS: dict[str, dict[str, int]] = {
    "sm_90a": {"smem_bytes": 227 * 1024, "max_warps": 32, "regs_per_sm": 65536,
               "named_barriers": 16, "tmem_columns": 0, "cluster_ctas": 8},
    "sm_100a": {"smem_bytes": 227 * 1024, "max_warps": 32, "regs_per_sm": 65536,
                "named_barriers": 16, "tmem_columns": 512, "cluster_ctas": 8},
    "sm_120a": {"smem_bytes": 99 * 1024, "max_warps": 48, "regs_per_sm": 65536,
                "named_barriers": 16, "tmem_columns": 0, "cluster_ctas": 8},
}

# The id in the placement struct of a named barrier that is not placed (its contract's
# `when` is false for the instance's params): the struct has a field for every declared
# barrier, and code that reads this one is dead for those params. It is no hardware id
# (0..15) and no placed one, so the linked PTX naming it fails verification
# (verify.check_linked_barriers) rather than syncing on whatever id ptxas would make
# of it (ptxas keeps only the low four bits of a folded id, silently).
UNPLACED_BARRIER = 0xFFFF_FFFF
WARPGROUP_WARPS = 4
DYNAMIC_SMEM_ALIGN = 1024      # pl_dynamic_smem's __align__ (smem.cuh): it follows the static
THREADS_PER_WARP = 32
SETMAXNREG_MIN, SETMAXNREG_MAX, SETMAXNREG_STEP = 24, 256, 8
TMEM_MIN_COLUMNS = 32


def tmem_allocatable(columns: int) -> bool:
    """tcgen05.alloc takes a power of two of at least TMEM_MIN_COLUMNS columns."""
    return columns >= TMEM_MIN_COLUMNS and columns & (columns - 1) == 0


@dataclass(frozen=True)
class Sized:
    """An integer that may depend on tunables: ``table`` maps each combination of the
    values of ``depends`` (in that order) to the integer. With no ``depends`` the
    table has the single key ``()``."""

    depends: tuple[str, ...]
    table: tuple[tuple[tuple[int, ...], int], ...]

    @staticmethod
    def const(value: int) -> Sized:
        return Sized((), (((), value),))

    def at(self, tunables: dict[str, int]) -> int:
        key = tuple(tunables[d] for d in self.depends)
        return dict(self.table)[key]

    def max(self) -> int:
        return max(v for _, v in self.table)


@dataclass(frozen=True)
class Tunable:
    name: str                      # "load.stages"
    values: tuple[int, ...]        # allowed values, ascending
    weight: int = 1                # objective weight (more is better), 0: no preference
    source: str = ""


@dataclass(frozen=True)
class Buffer:
    """A shared-memory region (a buffer or an mbarrier array)."""

    name: str                      # "load.a_tiles", "load.mbar.full"
    size: Sized                    # bytes
    align: int                     # offset is a multiple of this (power of two)
    live: tuple[int, int] | None = None   # [first, last) phase indices; None: whole kernel
    source: str = ""


@dataclass(frozen=True)
class NamedBarrier:
    name: str                      # "epi.sync"
    threads: int
    fixed: int | None = None       # a hard-coded id from third-party code
    live: tuple[int, int] | None = None
    source: str = ""


@dataclass(frozen=True)
class Role:
    """A set of warps running one role of one or more components.

    Component roles joined by a register hand-off are one Role (they share warps).
    """

    name: str                      # "mma" or "mma+epi"
    warps: int
    registers: int                 # per thread this role needs (setmaxnreg floor)
    warpgroup: bool = False        # must start on a warpgroup boundary and span whole ones
    members: tuple[str, ...] = ()  # "instance.role" this Role stands for
    source: str = ""
    live: tuple[int, int] | None = None   # [first, last) phases; roles of disjoint phases
                                          # may share warps


@dataclass(frozen=True)
class TmemAlloc:
    name: str
    columns: Sized                 # power of two >= 32
    source: str = ""
    live: tuple[int, int] | None = None   # [first, last) phases; disjoint ones share columns


@dataclass(frozen=True)
class Problem:
    arch: str
    tunables: tuple[Tunable, ...] = ()
    equal: tuple[tuple[str, str], ...] = ()    # tunables that must take one value
    buffers: tuple[Buffer, ...] = ()
    shared: tuple[tuple[str, str], ...] = ()   # zero-copy: second buffer is the first one
    barriers: tuple[NamedBarrier, ...] = ()
    roles: tuple[Role, ...] = ()
    tmem: tuple[TmemAlloc, ...] = ()
    objective: str = "max_tunables_then_min_smem"
    static_smem: int = 0                       # components' static __shared__ bytes

    @property
    def limits(self) -> dict[str, int]:
        """The arch's limits, less the static shared memory and the padding that aligns
        the dynamic shared memory after it."""
        limits = ARCH_LIMITS[self.arch]
        if not self.static_smem:
            return limits
        return {**limits, "smem_bytes": limits["smem_bytes"] - static_footprint(self.static_smem)}


def static_footprint(static_bytes: int) -> int:
    """Bytes a block's static shared memory keeps from the dynamic, which starts aligned."""
    return -(-static_bytes // DYNAMIC_SMEM_ALIGN) * DYNAMIC_SMEM_ALIGN


@dataclass(frozen=True)
class RoleSlot:
    warp_base: int
    warps: int


@dataclass(frozen=True)
class Placement:
    """The solved placement. Every dict is emitted sorted so ``to_json`` is stable."""

    arch: str
    tunables: dict[str, int]
    smem: dict[str, tuple[int, int]]           # name -> (offset, bytes)
    smem_bytes: int                            # dynamic shared memory the kernel needs
    barriers: dict[str, int]                   # name -> hardware id 1..15
    roles: dict[str, RoleSlot]
    warpgroup_regs: tuple[int, ...]            # setmaxnreg value per warpgroup
    launch_regs: int                           # registers per thread at launch
    tmem: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (column, columns)
    solver: dict[str, object] = field(default_factory=dict)         # status, objective

    @property
    def warps(self) -> int:
        return len(self.warpgroup_regs) * WARPGROUP_WARPS

    @property
    def threads(self) -> int:
        return self.warps * THREADS_PER_WARP

    def to_json(self) -> str:
        data = asdict(self)
        data["roles"] = {k: asdict(v) for k, v in self.roles.items()}
        return json.dumps(data, sort_keys=True, indent=1) + "\n"

    @staticmethod
    def from_json(text: str) -> Placement:
        d = json.loads(text)
        return Placement(
            arch=d["arch"], tunables=d["tunables"],
            smem={k: tuple(v) for k, v in d["smem"].items()}, smem_bytes=d["smem_bytes"],
            barriers=d["barriers"], roles={k: RoleSlot(**v) for k, v in d["roles"].items()},
            warpgroup_regs=tuple(d["warpgroup_regs"]), launch_regs=d["launch_regs"],
            tmem={k: tuple(v) for k, v in d.get("tmem", {}).items()}, solver=d.get("solver", {}))
