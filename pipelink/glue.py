"""The glue generator: one readable, deterministic CUDA file per linked kernel.

From the checked kernel and its placement it writes the per-instance placement
constants, the kernel parameter struct, mbarrier initialisation (arrival counts from
both sides of each port), the warp-role dispatch with one ``setmaxnreg`` per
warpgroup branch, each role's work loop (the scheduler's, which fills the work ring,
and every other lane's, which reads it and calls the role entries per record), and the
transfers: zero-copy (the consumer's port is the producer's ring), register
hand-offs (an array owned by the loop), generated conversions (a converter role
with its own ring) and global hand-offs (workspace slots and counters).

The same generator writes the monolithic translation unit: every component source
included once per param set, each in its own namespace, followed by the same glue.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import header
from .check import (
    CONVERTER_STAGES,
    CONVERTER_WARPS,
    TMEM_ADDRESS_SLOT,
    Kernel,
    Lane,
    Transfer,
    WorkRing,
    phase_counter,
    team_key,
    tmem_cta_group,
    turn_key,
)
from .compile import INCLUDE_DIR
from .contract import RING_PORTS, BoundContract
from .errors import GlueError
from .interfaces import INTERFACES, caller_symbol
from .problem import (
    THREADS_PER_WARP,
    TMEM_MIN_COLUMNS,
    UNPLACED_BARRIER,
    WARPGROUP_WARPS,
    Placement,
)
from .work import PER_TILE_WORK, RECORD_BYTES

MBARRIER_BYTES = 8
CONVERTER_THREADS = CONVERTER_WARPS * THREADS_PER_WARP
TENSORMAP_BYTES = 128
_ARG_LAYOUT = {  # kernel-parameter type, size, alignment per contract arg type
    "tensormap": ("pl::TensorMap", TENSORMAP_BYTES, 64), "u64": ("uint64_t", 8, 8),
    "ptr": (None, 8, 8), "u32": ("uint32_t", 4, 4), "i32": ("int32_t", 4, 4),
    "f32": ("float", 4, 4),
}


@dataclass(frozen=True)
class ParamField:
    name: str                  # field of the kernel parameter struct
    instance: str | None       # None for the workspace pointer and the launch token
    arg: str
    type: str                  # contract arg type
    ctype: str
    offset: int
    size: int
    extra: dict                # dtype, box, swizzle for tensormaps and pointers


def param_layout(kernel: Kernel) -> tuple[list[ParamField], int]:
    """The kernel parameter struct: tensormaps first, then 8-, then 4-byte fields,
    each in recipe order, then the workspace pointer and the launch token (set by the
    runtime per launch, see pl::KernelInfo). Offsets follow C layout rules
    and the glue static_asserts them, so kernel.json and the device agree."""
    entries = []
    for inst, b in kernel.bound.items():
        for ctype, arg in zip(header.arg_fields(b), b.contract.data.get("args", []), strict=True):
            kind = arg["type"]
            cty, size, align = _ARG_LAYOUT[kind]
            extra = {}
            if "dtype" in arg:
                extra["dtype"] = b.dtype(arg["dtype"], f"args.{arg['name']}.dtype")
            if kind == "tensormap":
                extra["box"] = [b.eval(v, f"args.{arg['name']}.box") for v in arg["box"]]
                extra["swizzle"] = b.eval(arg.get("swizzle", 0), f"args.{arg['name']}.swizzle")
            if "align" in arg:
                extra["align"] = arg["align"]
            entries.append((-align, inst, arg["name"], kind, cty or ctype[0], size, align, extra))
    ordered = sorted(enumerate(entries), key=lambda e: (e[1][0], e[0]))
    fields, offset = [], 0
    for _, (_, inst, arg, kind, cty, size, align, extra) in ordered:
        offset = -(-offset // align) * align
        fields.append(ParamField(f"{inst}_{arg}", inst, arg, kind, cty, offset, size, extra))
        offset += size
    offset = -(-offset // 8) * 8
    fields.append(ParamField("workspace", None, "workspace", "ptr", "void*", offset, 8, {}))
    fields.append(ParamField("launch", None, "launch", "u64", "uint64_t", offset + 8, 8, {}))
    total = -(-(offset + 16) // 64) * 64
    return fields, total


class _Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.depth = 0

    def __call__(self, line: str = "") -> None:
        self.lines.append(("  " * self.depth + line) if line else "")

    def open(self, line: str) -> None:
        self(line + " {")
        self.depth += 1

    def close(self, suffix: str = "") -> None:
        self.depth -= 1
        self("}" + suffix)

    def reopen(self, line: str) -> None:
        """Closes a block and opens the next on the same line: `} else {`."""
        self.depth -= 1
        self("} " + line + " {")
        self.depth += 1

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


@dataclass(frozen=True)
class PhaseClock:
    """Where a build with phase clocks records them: ``ctas`` rows of ``slots`` u64
    (%globaltimer ns; slot 0 a CTA's start, slot i + 1 its end of phase i) at
    ``offset`` in the workspace, zeroed before each launch."""

    offset: int
    ctas: int
    slots: int

    @property
    def bytes(self) -> int:
        return self.ctas * self.slots * 8


@dataclass(frozen=True)
class GlueOptions:
    mono: bool = False
    # Monolithic builds include each staged component source: (instance -> path).
    sources: tuple[tuple[str, str], ...] = ()
    phase_clock: PhaseClock | None = None


def entry_name(recipe: str) -> str:
    return f"pl_{recipe}"


def generate(kernel: Kernel, placement: Placement, opts: GlueOptions | None = None) -> str:
    return _Glue(kernel, placement, opts or GlueOptions()).emit()


CLOCK_REGISTERS = 128    # a warpgroup budget that holds the phase clocks' few registers


class _Glue:
    def __init__(self, kernel: Kernel, placement: Placement, opts: GlueOptions) -> None:
        self.k, self.p, self.opts = kernel, placement, opts
        self.w = _Writer()
        self.params, self.params_bytes = param_layout(kernel)
        self.lane_slots = {lane.name: placement.roles[lane.name] for lane in kernel.lanes}
        self.ring: WorkRing | None = None     # the work ring of the lane being written
        self.distinct = self._distinct_bounds()

    def _distinct_bounds(self) -> dict[tuple[str, str], BoundContract]:
        out = {}
        for b in self.k.bound.values():
            out.setdefault((b.name, b.params_hash()), b)
        return out

    def ns(self, b: BoundContract) -> str:
        return f"pl_mono_{b.name}_{b.params_hash()}::" if self.opts.mono else ""

    def tunables(self, inst: str) -> dict[str, int]:
        prefix = f"{inst}."
        return {k[len(prefix):]: v for k, v in self.p.tunables.items() if k.startswith(prefix)}

    # -- the file ---------------------------------------------------------------------

    def emit(self) -> str:
        w, k = self.w, self.k
        mode = "monolithic translation unit" if self.opts.mono else "link-time glue"
        w(f"// {mode} for recipe '{k.recipe.name}' ({k.arch}), generated by PipeLink "
          "from the recipe, the contracts and the placement; do not edit.")
        w(f"// Placement: {self.p.threads} threads, {self.p.smem_bytes} bytes of dynamic "
          f"shared memory, setmaxnreg per warpgroup {list(self.p.warpgroup_regs)}.")
        w("#include <cstddef>")
        w("#include <cstdint>")
        w("#include <cuda_bf16.h>")
        w("#include <cuda_fp16.h>")
        w("#include <cuda_fp8.h>")
        w('#include "pipelink/pipelink.cuh"')
        w()
        self.includes()
        self.placement_constants()
        self.param_struct()
        if any(t.kind == "conversion" for t in k.transfers):
            self.converter_function()
        self.function_forwarders()
        self.kernel_entry()
        return w.text()

    def includes(self) -> None:
        w = self.w
        if self.opts.mono:
            # Everything a component may include goes first, at global scope: included
            # again inside a component's namespace, its guard makes it a no-op.
            w("#include <type_traits>")
            for path in sorted(INCLUDE_DIR.rglob("*.cuh")):
                w(f'#include "pipelink/{path.relative_to(INCLUDE_DIR / "pipelink")}"')
            # A contract's header sets (includes: [cutlass]) too: CuTe and CUTLASS open
            # namespaces and pull in the standard library, neither of which survives
            # nesting in a component's namespace. A component includes these, or
            # headers they already include.
            header_sets = {"cutlass": ("cute/tensor.hpp", "cute/atom/mma_atom.hpp",
                                       "cute/arch/mma_sm90.hpp")}
            wanted = {s for b in self.distinct.values()
                      for s in b.contract.data.get("includes", [])}
            for name in sorted(wanted):
                for path in header_sets[name]:
                    w(f"#include <{path}>")
            sources = dict(self.opts.sources)
            for (name, h), b in sorted(self.distinct.items()):
                inst = next(i for i, bb in self.k.bound.items() if bb is b)
                w(f"namespace pl_mono_{name}_{h} {{")
                w(f'#include "{sources[inst]}"')
                w(f"}}  // namespace pl_mono_{name}_{h}")
        else:
            w("#define PL_GLUE 1")
            for (name, h) in sorted(self.distinct):
                w(f'#include "pl_{name}_{h}.h"')
        w()

    # -- placement ----------------------------------------------------------------------

    def placement_constants(self) -> None:
        w = self.w
        w("// Where every instance sits. extern: stable names (byte-reproducible) and, once")
        w("// LTO inlines the entries, every field folds into an immediate.")
        for inst, b in self.k.bound.items():
            t = header.type_names(b)
            for team in range(self.teams(inst)):
                sections = []
                for _, fields in header.place_fields(b):
                    values = [self.place_value(inst, b, key, team) for _, _, key in fields]
                    sections.append("{" + ", ".join(values) + "}")
                init = "{" + ", ".join(sections) + "}"
                at = self.at(inst, team)
                w(f'extern "C" __device__ const {self.ns(b)}{t["place"]} {at};')
                w(f"__device__ const {self.ns(b)}{t['place']} {at} = {init};")
        for t in self.k.transfers:
            if t.kind == "conversion":
                src, dst = self.port_of(t.src.instance, t.src.port), self.converter_port(t)
                w(f'extern "C" __device__ const pl::PipePort pl_cvt_from_{t.converter};')
                w(f"__device__ const pl::PipePort pl_cvt_from_{t.converter} = {src};")
                w(f'extern "C" __device__ const pl::PipePort pl_cvt_to_{t.converter};')
                w(f"__device__ const pl::PipePort pl_cvt_to_{t.converter} = {dst};")
        for ring in self.rings():
            w(f'extern "C" __device__ const pl::WorkRing {self.work_ring(ring)};')
            w(f"__device__ const pl::WorkRing {self.work_ring(ring)} = "
              f"{self.work_ring_value(ring)};")
        w()

    def rings(self) -> list[WorkRing]:
        """The kernel's work rings: one per phase that has a scheduler."""
        return [r for r in self.k.works if r is not None]

    def work_ring(self, ring: WorkRing | None = None) -> str:
        """The placed WorkRing constant of `ring` (the lane being written's, by default)."""
        return f"pl_work_{(ring or self.ring).producer.instance}"

    def work_ring_value(self, ring: WorkRing) -> str:
        inst, port = ring.producer.instance, ring.producer.port
        records, size = self.p.smem[f"{inst}.{port}.records"]
        full = self.p.smem[f"{inst}.mbar.{port}.full"][0]
        empty = self.p.smem[f"{inst}.mbar.{port}.empty"][0]
        return f"{{{records}, {full}, {empty}, {size // RECORD_BYTES}}}"

    def teams(self, inst: str) -> int:
        """Copies of an instance's placement: one per pingpong team of its lane."""
        return max((lane.teams for lane in self.k.lanes
                    if any(i == inst for i, _ in lane.members)), default=1)

    @staticmethod
    def at(inst: str, team: int = 0) -> str:
        """The placement constant of an instance (of its pingpong team `team`)."""
        return f"pl_at_{inst}" if team == 0 else f"pl_at_{inst}_t{team}"

    def place_value(self, inst: str, b: BoundContract, key: str, team: int = 0) -> str:
        section, name = key.split(".", 1)
        p = self.p
        if section == "roles":
            lane = self.lane_of(inst, name)
            slot = self.lane_slots[lane.name]
            # A pingpong team is a role of its own to the component: its warps only.
            return f"{{{slot.warp_base + team * lane.warps}, {lane.warps}}}"
        if section == "smem":
            return str(p.smem[team_key(f"{inst}.{name}", team)][0])
        if section == "mbarriers":
            return str(p.smem[team_key(f"{inst}.mbar.{name}", team)][0])
        if section == "named_barriers":
            if not b.places(name):   # its `when` is false: only dead code reads the field
                return f"{UNPLACED_BARRIER:#x}"
            return str(p.barriers[team_key(f"{inst}.{name}", team)])
        if section == "tmem":
            return str(p.tmem[f"{inst}.{name}"][0])
        if section == "tunables":
            return str(p.tunables[f"{inst}.{name}"])
        if section == "counters":
            return str(self.k.workspace[f"{inst}.counter.{name}"].counter_offset)
        if section == "scratch":
            return str(self.k.workspace[f"{inst}.scratch.{name}"].slot_offset)
        port = b.contract.ports[name]
        if port.dir == "out":
            return self.port_of(inst, name) if port.kind in RING_PORTS \
                else self.global_port(f"{inst}.{name}")
        feed = self.k.peer(inst, name)
        if feed is None:
            raise GlueError(f"input port '{inst}.{name}' has no producer")
        if feed.kind == "conversion":
            return self.converter_port(feed)
        if feed.kind == "global":
            return self.global_port(str(feed.src))
        return self.port_of(feed.src.instance, feed.src.port)

    def port_of(self, inst: str, port_name: str) -> str:
        """The PipePort (shared-memory stages) or TmemPort (Tensor Memory columns) of a
        producer's ring out port, as a C aggregate: {first, per stage, full, empty,
        stages}."""
        b = self.k.bound[inst]
        port = b.contract.ports[port_name]
        stages = b.eval(port.spec["stages"], f"ports.{port_name}.stages", self.tunables(inst))
        placed = self.p.tmem if port.kind == "tmem" else self.p.smem
        first, size = placed[f"{inst}.{port.spec['buffer']}"]
        full = self.p.smem[f"{inst}.mbar.{port.spec['full']}"][0]
        empty = self.p.smem[f"{inst}.mbar.{port.spec['empty']}"][0]
        return f"{{{first}, {size // stages}, {full}, {empty}, {stages}}}"

    def converter_port(self, t: Transfer) -> str:
        offset, size = self.p.smem[f"{t.converter}.tiles"]
        full = self.p.smem[f"{t.converter}.mbar.full"][0]
        empty = self.p.smem[f"{t.converter}.mbar.empty"][0]
        return (f"{{{offset}, {size // CONVERTER_STAGES}, {full}, {empty}, "
                f"{CONVERTER_STAGES}}}")

    def global_port(self, producer: str) -> str:
        g = self.k.workspace[producer]
        return f"{{{g.slot_offset}ull, {g.slot_bytes}ull, {g.counter_offset}ull, {g.slots}}}"

    def lane_of(self, inst: str, role: str) -> Lane:
        return next(lane for lane in self.k.lanes if (inst, role) in lane.members)

    # -- parameters -------------------------------------------------------------------

    def param_struct(self) -> None:
        w = self.w
        name = f"pl_params_{self.k.recipe.name}"
        w("// The kernel's one parameter, passed as __grid_constant__ (tensor maps by value).")
        w.open(f"struct {name}")
        for f in self.params:
            w(f"{f.ctype} {f.name};")
        w.close(";")
        for f in self.params:
            w(f"static_assert(offsetof({name}, {f.name}) == {f.offset}, "
              f"\"kernel.json records {f.name} at byte {f.offset}\");")
        w(f"static_assert(sizeof({name}) <= {self.params_bytes}, \"parameter block size\");")
        w()

    def args_init(self, inst: str, b: BoundContract) -> str:
        values = []
        for arg in b.contract.data.get("args", []):
            field = f"p.{inst}_{arg['name']}"
            values.append(f"&{field}" if arg["type"] == "tensormap" else field)
        return "{" + ", ".join(values) + "}"

    # -- function ports -----------------------------------------------------------------

    def function_forwarders(self) -> None:
        """Defines each caller's function symbols as calls of the connected provider's
        (its placement and runtime arguments added), so LTO inlines the provider into the
        caller. A provider's arguments are read from the kernel's parameter block. Two
        instances of one caller object share their symbols (the checker gave them one
        provider): each symbol is defined once."""
        w = self.w
        defined = set()
        for t in self.k.transfers:
            if t.kind != "function":
                continue
            caller, provider = self.k.bound[t.dst.instance], self.k.bound[t.src.instance]
            args_type = self.ns(provider) + header.type_names(provider)["args"]
            interface = caller.contract.ports[t.dst.port].spec["interface"]
            for f in INTERFACES[interface].functions:
                symbol = caller.symbol(caller_symbol(caller.name, t.dst.port, f.name))
                if symbol in defined:
                    continue
                defined.add(symbol)
                target = provider.symbol(caller_symbol(provider.name, t.src.port, f.name))
                w(f"// {t.dst} -> {t.src}: function '{f.name}'.")
                w.open(f'extern "C" __device__ {f.returns} {symbol}('
                       f"{f.signature('const pl::KernelInfo& k')})")
                init = "{}"
                if provider.contract.data.get("args"):
                    w(f"const pl_params_{self.k.recipe.name}& p = "
                      f"*static_cast<const pl_params_{self.k.recipe.name}*>(k.params);")
                    init = self.args_init(t.src.instance, provider)
                w(f"const {args_type} args = {init};")
                first = f"{self.at(t.src.instance)}, args, k"
                w(f"return {self.ns(provider)}{target}({f.arguments(first)});")
                w.close()
        if defined:
            w()

    # -- the converter ------------------------------------------------------------------

    def converter_function(self) -> None:
        w = self.w
        w("// A generated conversion, run by every thread of its warps: waits on the")
        w("// producer's stage and its own empty stage, converts element by element (dtype")
        w("// and/or row/column-major), then each thread releases the producer's stage and")
        w("// fills its own (both barriers count every converter thread).")
        w("template <class From, class To, bool kTranspose, int kRows, int kCols>")
        w.open("__device__ __forceinline__ void pl_convert_stage("
               "const pl::PipePort& from, pl::PipeState& sf, const pl::PipePort& to, "
               "pl::PipeState& st, uint32_t thread, uint32_t threads)")
        w("pl::consumer_wait(from, sf);")
        w("pl::producer_acquire(to, st);")
        w("const From* src = pl::smem_ptr<const From>(pl::stage_offset(from, sf));")
        w("To* dst = pl::smem_ptr<To>(pl::stage_offset(to, st));")
        w.open("for (uint32_t e = thread; e < uint32_t(kRows * kCols); e += threads)")
        w("const uint32_t row = e / kCols, col = e % kCols;")
        w("const uint32_t out = kTranspose ? col * kRows + row : e;")
        w("dst[out] = To(float(src[e]));")
        w.close()
        w("// Ordinary loads and stores meet TMA (async proxy) writes and reads on both rings.")
        w("pl::fence_proxy_async_smem();")
        w("pl::consumer_release(from, sf);")
        w("pl::producer_commit(to, st);")
        w("sf.advance(from);")
        w("st.advance(to);")
        w.close()
        w()

    # -- the kernel -------------------------------------------------------------------

    def kernel_entry(self) -> None:
        w, k, p = self.w, self.k, self.p
        cluster = self.cluster()
        dims = f" __cluster_dims__({', '.join(map(str, cluster))})" if self.clustered() else ""
        w(f'extern "C" __global__ void __launch_bounds__({p.threads}, 1){dims}')
        w.open(f"{entry_name(k.recipe.name)}(const __grid_constant__ "
               f"pl_params_{k.recipe.name} p)")
        for inst, b in k.bound.items():
            w(f"const {self.ns(b)}{header.type_names(b)['args']} args_{inst} = "
              f"{self.args_init(inst, b)};")
        self.barrier_init()
        self.tmem_alloc()
        runs = self.warpgroup_runs()
        # The phase clocks' thread: the first of the first warpgroups with registers to
        # spare for them (not a 40-register producer warpgroup, nor, where another has
        # them, the math warpgroups, whose budgets are their epilogues' to the register).
        clock_run = next((run for run in runs if run[2] >= CLOCK_REGISTERS),
                         max(runs, key=lambda run: run[2]))
        self.clock_thread = clock_run[0] * WARPGROUP_WARPS * 32
        self.clock(0, "the CTA starts")
        w("const uint32_t warp = __shfl_sync(0xffffffffu, threadIdx.x / 32, 0);")
        w(f"const uint32_t warpgroup = warp / {WARPGROUP_WARPS};")
        for run in runs:
            first, last, regs = run
            # (No 'warpgroup >= 0': nvcc warns of an unsigned compared with zero.)
            lo = f"warpgroup >= {first} && " if first else ""
            cond = (f"warpgroup == {first}" if first == last else f"{lo}warpgroup <= {last}")
            w.open(f"if ({cond})")
            self.setmaxnreg(regs)
            for index, phase in enumerate(k.phases):
                if k.phased:
                    w(f"// Phase {index}: {phase.name}.")
                for lane_name, slot in self.lanes_in(first, last):
                    if self.lane_phase(lane_name) == index:
                        self.lane_branches(lane_name, slot)
                if index + 1 < len(k.phases):
                    self.phase_boundary(index, timed=run == clock_run)
            w.close()
        if self.opts.phase_clock:
            w(f"pl::phase::end({p.threads});")
            self.clock(len(k.phases), f"phase '{k.phases[-1].name}' ends")
        self.tmem_free()
        w.close()

    def lane_branches(self, lane_name: str, slot: object) -> None:
        """The lane's warps run its body (each pingpong team in a branch of its own)."""
        w = self.w
        lane = self.lane_named(lane_name)
        for team in range(lane.teams if lane else 1):
            base = slot.warp_base + team * (lane.warps if lane else 0)
            end = base + (lane.warps if lane and lane.teams > 1 else slot.warps)
            lo = f"warp >= {base} && " if base else ""
            w.open(f"if ({lo}warp < {end})")
            self.lane_body(lane_name, team)
            w.close()

    def lane_phase(self, lane_name: str) -> int:
        lane = self.lane_named(lane_name)
        if lane is not None:
            return lane.phase
        converter = next(t for t in self.k.transfers if t.converter == lane_name)
        return self.k.phase_of(converter.dst.instance)

    def phase_boundary(self, index: int, timed: bool) -> None:
        """Every thread of the CTA, between phase `index` and the next: the CTA meets; a
        phase that others wait for is counted done, grid-wide, and the next phase waits
        for every CTA to have finished the phases it names (pipelink/phase.cuh). ``timed``:
        the branch that holds the phase clocks' thread."""
        w, k = self.w, self.k
        threads = self.p.threads
        done, then = k.phases[index], k.phases[index + 1]
        # The next phase's MMAs may write the columns this phase's epilogues read.
        tmem = bool(self.tmem_columns())
        if tmem:
            w('asm volatile("tcgen05.fence::before_thread_sync;" ::: "memory");')
        w(f"pl::phase::end({threads});")
        if timed:
            self.clock(index + 1, f"phase '{done.name}' ends")
        counters = [(op, k.workspace[phase_counter(name)].counter_offset, name)
                    for op, names in (("arrive", [done.name]), ("wait", then.after))
                    for name in names if phase_counter(name) in k.workspace]
        if counters:
            w.open("if (threadIdx.x == 0)")
            for op, offset, name in counters:
                w(f"pl::phase::{op}(k, {offset});  // phase '{name}'")
            w.close()
        if then.after:
            w(f"pl::phase::begin({threads});")
        if tmem:
            w('asm volatile("tcgen05.fence::after_thread_sync;" ::: "memory");')

    def clock(self, index: int, what: str) -> None:
        """A phase clock (builds with LinkOptions.phase_clock only)."""
        c = self.opts.phase_clock
        if c is not None:
            self.w(f"pl::phase::clock(k, {c.offset}, {c.ctas}, {c.slots}, {index}, "
                   f"{self.clock_thread});  // {what}")

    def cluster(self) -> list[int]:
        return list(self.k.recipe.launch.get("cluster") or [1, 1, 1])

    def clustered(self) -> bool:
        return self.cluster() != [1, 1, 1]

    def block_sync(self) -> str:
        """Every thread of the CTA, and of every CTA of the cluster when there is one."""
        return "pl::cluster::sync();" if self.clustered() else "__syncthreads();"

    def tmem_columns(self) -> int:
        """Columns to allocate: the placed extent rounded up to a power of two."""
        extent = max((col + cols for col, cols in self.p.tmem.values()), default=0)
        return max(TMEM_MIN_COLUMNS, 1 << (extent - 1).bit_length()) if extent else 0

    def tmem_warp(self) -> int:
        """The warp that allocates and frees Tensor Memory: the first warp of the role
        whose contract says uses: [tmem_alloc]."""
        if self.k.tmem_allocator is None:
            raise GlueError("the kernel asks for Tensor Memory but no role allocates it",
                            hint="give one role 'uses: [tmem_alloc]'")
        return self.lane_slots[self.lane_of(*self.k.tmem_allocator).name].warp_base

    def tmem_alloc(self) -> None:
        """The allocating role's first warp allocates the kernel's Tensor Memory once and
        gives up the permit (no other CTA on the SM may wait for it); every role reads the
        base address after the barrier, and the same warp frees it when every role has
        returned."""
        w = self.w
        columns = self.tmem_columns()
        if not columns:
            w("const pl::KernelInfo k = {p.workspace, 0, p.launch, &p};")
            return
        slot = self.p.smem[TMEM_ADDRESS_SLOT][0]
        warp = self.tmem_warp()
        group = tmem_cta_group(self.k.bound)
        w(f"// Tensor Memory: {columns} columns for {sorted(self.p.tmem)}, allocated by "
          f"{'.'.join(self.k.tmem_allocator)}.")
        w.open(f"if (threadIdx.x / 32 == {warp})")
        w(f'asm volatile("tcgen05.alloc.cta_group::{group}.sync.aligned.shared::cta.b32 [%0], '
          f'{columns};" :: "r"(pl::smem_addr({slot})) : "memory");')
        w(f'asm volatile("tcgen05.relinquish_alloc_permit.cta_group::{group}.sync.aligned;" '
          '::: "memory");')
        w.close()
        w('asm volatile("tcgen05.fence::before_thread_sync;" ::: "memory");')
        w(self.block_sync())
        w('asm volatile("tcgen05.fence::after_thread_sync;" ::: "memory");')
        w(f"const pl::KernelInfo k = {{p.workspace, *pl::smem_ptr<uint32_t>({slot}), p.launch, "
          "&p};")

    def tmem_free(self) -> None:
        columns = self.tmem_columns()
        if not columns:
            if self.clustered():   # no CTA leaves while a peer may still reach its memory
                self.w(self.block_sync())
            return
        w = self.w
        w('asm volatile("tcgen05.fence::before_thread_sync;" ::: "memory");')
        w(self.block_sync())
        w.open(f"if (threadIdx.x / 32 == {self.tmem_warp()})")
        w('asm volatile("tcgen05.fence::after_thread_sync;" ::: "memory");')
        w(f'asm volatile("tcgen05.dealloc.cta_group::{tmem_cta_group(self.k.bound)}.sync.'
          f'aligned.b32 %0, {columns};" :: "r"(k.tmem_base) : "memory");')
        w.close()

    def barrier_init(self) -> None:
        w = self.w
        inits = self.mbarrier_counts()
        named = sorted(set(self.p.barriers.values()))
        w(f"// mbarriers: {len(inits)} arrays; named barriers in use: {named}.")
        w.open("if (threadIdx.x == 0)")
        for offset, count, arrivals, what in inits:
            w(f"for (uint32_t i = 0; i < {count}; ++i) "
              f"pl::mbar::init({offset} + i * {MBARRIER_BYTES}, {arrivals});  // {what}")
        w("pl::mbar::fence_init();")
        w.close()
        # A peer may arrive on these barriers (or land TMA bytes on them) as soon as it
        # passes: with a cluster, every CTA of it initialises first.
        w(self.block_sync())

    def mbarrier_counts(self) -> list[tuple[int, int, int, str]]:
        """(offset, count, arrivals, what) of every mbarrier array."""
        out = []
        port_bars: dict[str, tuple[str, int]] = {}
        for inst, b in self.k.bound.items():
            for port in b.contract.ports.values():
                if port.kind not in RING_PORTS or port.dir != "out":
                    continue
                arrivals = b.eval(port.spec["arrivals"], f"ports.{port.name}.arrivals",
                                  self.tunables(inst))
                port_bars[f"{inst}.{port.spec['full']}"] = (f"{inst}.{port.name} full", arrivals)
                # A CTA pair's buffers, and a multicast ring's stages, are released by the
                # readers of every CTA involved.
                field = "cta_group" if port.kind == "tmem" else "multicast"
                pair = b.eval(port.spec.get(field, 1), f"ports.{port.name}.{field}",
                              self.tunables(inst))
                port_bars[f"{inst}.{port.spec['empty']}"] = (
                    f"{inst}.{port.name} empty", pair * self.consumer_arrivals(inst, port.name))
        for inst, b in self.k.bound.items():
            for name, spec in sorted(b.contract.section("mbarriers").items()):
                what, arrivals = port_bars.get(f"{inst}.{name}", (f"{inst}.{name}", None))
                if arrivals is None:
                    arrivals = b.eval(spec.get("arrivals", 1) if isinstance(spec, dict) else 1,
                                      f"mbarriers.{name}.arrivals", self.tunables(inst))
                for team in range(self.teams(inst)):
                    offset, size = self.p.smem[team_key(f"{inst}.mbar.{name}", team)]
                    out.append((offset, size // MBARRIER_BYTES, arrivals,
                                team_key(what, team)))
        for ring in self.rings():
            inst, port = ring.producer.instance, ring.producer.port
            full, size = self.p.smem[f"{inst}.mbar.{port}.full"]
            empty = self.p.smem[f"{inst}.mbar.{port}.empty"][0]
            # One lane of the scheduler fills a record; every consuming warp releases it.
            out.append((full, size // MBARRIER_BYTES, 1, f"{inst}.{port} full"))
            out.append((empty, size // MBARRIER_BYTES, ring.arrivals,
                        f"{inst}.{port} empty ({', '.join(ring.consumers)})"))
        for t in self.k.transfers:
            if t.kind == "conversion":
                full = self.p.smem[f"{t.converter}.mbar.full"][0]
                empty = self.p.smem[f"{t.converter}.mbar.empty"][0]
                out.append((full, CONVERTER_STAGES, CONVERTER_THREADS, f"{t.converter} full"))
                out.append((empty, CONVERTER_STAGES, self.arrivals_of(t.dst),
                            f"{t.converter} empty"))
        return out

    def consumer_arrivals(self, inst: str, port: str) -> int:
        feeds = [t for t in self.k.transfers if (t.src.instance, t.src.port) == (inst, port)]
        if not feeds:
            raise GlueError(f"output ring '{inst}.{port}' has no consumer: its producer "
                            "would wait forever for an empty stage",
                            hint="connect it, or remove the instance")
        # Every converter thread releases the producer's stage.
        return sum(CONVERTER_THREADS if t.kind == "conversion" else self.arrivals_of(t.dst)
                   for t in feeds)

    def arrivals_of(self, end: object) -> int:
        b = self.k.bound[end.instance]
        spec = b.contract.ports[end.port].spec
        return b.eval(spec["arrivals"], f"ports.{end.port}.arrivals",
                      self.tunables(end.instance))

    def warpgroup_runs(self) -> list[tuple[int, int, int]]:
        """Consecutive warpgroups with one setmaxnreg value share a branch (all of
        them, when no role moves registers)."""
        if not self.uses_setmaxnreg():
            last = len(self.p.warpgroup_regs) - 1
            return [(0, last, self.p.launch_regs)]
        runs: list[tuple[int, int, int]] = []
        for wg, regs in enumerate(self.p.warpgroup_regs):
            if runs and runs[-1][2] == regs and self.same_lanes(runs[-1][1], wg):
                runs[-1] = (runs[-1][0], wg, regs)
            else:
                runs.append((wg, wg, regs))
        return runs

    def same_lanes(self, wg_a: int, wg_b: int) -> bool:
        """Two warpgroups may share a branch when one lane spans both."""
        return any(s.warp_base <= wg_a * WARPGROUP_WARPS
                   and s.warp_base + s.warps >= (wg_b + 1) * WARPGROUP_WARPS
                   for s in self.p.roles.values())

    def lanes_in(self, first: int, last: int) -> list[tuple[str, object]]:
        """Lanes overlapping the warpgroups [first, last]: a lane that straddles two
        branches runs in both, each thread in the branch of its own warp."""
        lo, hi = first * WARPGROUP_WARPS, (last + 1) * WARPGROUP_WARPS
        return sorted(((name, s) for name, s in self.p.roles.items()
                       if s.warp_base < hi and s.warp_base + s.warps > lo),
                      key=lambda e: e[1].warp_base)

    def setmaxnreg(self, regs: int) -> None:
        if not self.uses_setmaxnreg():
            return
        if regs < self.p.launch_regs:
            self.w(f'asm volatile("setmaxnreg.dec.sync.aligned.u32 {regs};");')
        elif regs > self.p.launch_regs:
            self.w(f'asm volatile("setmaxnreg.inc.sync.aligned.u32 {regs};");')

    def uses_setmaxnreg(self) -> bool:
        return any("setmaxnreg" in b.contract.roles[r].uses
                   for lane in self.k.lanes for i, r in lane.members
                   for b in [self.k.bound[i]])

    def lane_named(self, name: str) -> Lane | None:
        """The lane called `name` (None for a generated converter's warps)."""
        return next((lane for lane in self.k.lanes if lane.name == name), None)

    def lane_body(self, lane_name: str, team: int = 0) -> None:
        converter = next((t for t in self.k.transfers if t.converter == lane_name), None)
        if converter is not None:
            works = self.k.works
            self.ring = works[self.k.phase_of(converter.dst.instance)] if works else None
            return self.converter_body(converter)
        lane = self.lane_named(lane_name)
        w = self.w
        if lane.teams > 1:
            w(f"// Pingpong team {team} of {lane.teams}: records {team}, "
              f"{team} + {lane.teams}, ...; it steps over the others' stages.")
        for inst, role in lane.members:
            b = self.k.bound[inst]
            w(f"{self.ns(b)}{header.type_names(b)[f'state.{role}']} st_{inst}_{role}{{}};")
        self.hooks(lane, "init", team)
        self.ring = self.k.work_of(lane)
        if self.ring is not None and lane_name == self.ring.lane:
            self.scheduler_loop(lane)
        else:
            self.work_loop(lane, team)
        self.hooks(lane, "tail", team)
        return None

    def scheduler_loop(self, lane: Lane) -> None:
        """One lane asks the scheduler for each record and commits it to the ring; the
        end marker (an invalid record) is committed too, so every consumer sees it."""
        w = self.w
        inst, role = lane.members[0]
        b = self.k.bound[inst]
        ring = self.work_ring()
        w.open("if (pl::lane() == 0)")
        w("pl::WorkState work{};")
        w.open("for (uint32_t iteration = 0;; ++iteration)")
        w(f"const pl::WorkTile tile = {self.ns(b)}{b.symbol(b.contract.roles[role].entry)}("
          f"pl_at_{inst}, args_{inst}, k, iteration, st_{inst}_{role});")
        w(f"pl::work_acquire({ring}, work);")
        w(f"pl::work_commit({ring}, work, tile);")
        w(f"work.advance({ring});")
        w("if (!tile.is_valid()) break;")
        w.close()
        w.close()
        w("__syncwarp();  // the scheduler's warp reconverges before any later barrier")

    def next_record(self, at_end: str = "") -> None:
        """Declares `tile`, the next work record, and leaves the loop at the end marker:
        a reference into the work ring, held until :meth:`done_record` (so roles read
        fields where they use them), or, without a scheduler, this CTA's one tile from
        blockIdx."""
        w = self.w
        if self.ring is None:
            w("const pl::WorkTile tile{int32_t(blockIdx.x), int32_t(blockIdx.y), "
              "int32_t(blockIdx.z), 0, 0, int32_t(iteration == 0), 0, pl::kRowsUnbounded};")
            w("if (!tile.is_valid()) break;")
            return
        ring = self.work_ring()
        w(f"const pl::WorkTile& tile = pl::work_wait({ring}, work);")
        w.open("if (!tile.is_valid())")
        if at_end:
            w(at_end)
        w(f"pl::work_release({ring}, work);")
        w("break;")
        w.close()

    def done_record(self) -> None:
        """Hands the record's stage back once every role of the warp is done with it."""
        if self.ring is None:
            return
        ring = self.work_ring()
        self.w(f"pl::work_release({ring}, work);")
        self.w(f"work.advance({ring});")

    def open_loop(self) -> None:
        if self.ring is None:
            self.w.open("for (uint32_t iteration = 0;; ++iteration)")
        else:
            self.w("pl::WorkState work{};")
            self.w.open("for (;;)")

    def work_loop(self, lane: Lane, team: int = 0) -> None:
        w = self.w
        teams = lane.teams
        turns = teams > 1 and any(header.pipeline_ports(self.k.bound[i], r)
                                  for i, r in lane.members)
        if teams > 1:
            w("uint32_t record = 0;")
        if turns and team == teams - 1:
            w("// The first turn is team 0's.")
            w(self.turn("arrive", lane, 0))
        self.open_loop()
        # The turn handed over by the last record, which no team takes: this team's when
        # the end marker falls on it (every arrive then meets its sync).
        self.next_record(f"if (record % {teams} == {team}) {self.turn('sync', lane, team)}"
                         if turns else "")
        if teams > 1:
            w.open(f"if (record++ % {teams} != {team})")
            self.skip_record(lane, team)
            w.reopen("else")
        arrays = self.register_arrays(lane)
        for decl in sorted(set(arrays.values())):
            w(decl[1])
        last_ring = max((n for n, (i, r) in enumerate(lane.members)
                         if header.pipeline_ports(self.k.bound[i], r)), default=-1)
        if turns:
            w(f"{self.turn('sync', lane, team)}  // this team's turn on the rings")
        for n, (inst, role) in enumerate(lane.members):
            b = self.k.bound[inst]
            regs = "".join(f", {arrays[(inst, port)][0]}"
                           for _, port, _ in header.register_ports(b, role))
            w(f"{self.ns(b)}{b.symbol(b.contract.roles[role].entry)}({self.at(inst, team)}, "
              f"args_{inst}, k, tile, st_{inst}_{role}{regs});")
            if turns and n == last_ring:
                w(f"{self.turn('arrive', lane, (team + 1) % teams)}  // the next team's turn")
        if teams > 1:
            w.close()
        self.done_record()
        w.close()

    def turn(self, op: str, lane: Lane, team: int) -> str:
        """Sync on (or arrive at) the named barrier that gives `team` its turn."""
        barrier = self.p.barriers[turn_key(lane.name, team)]
        return f"pl::named_{op}({barrier}, {lane.total_warps * THREADS_PER_WARP});"

    def skip_record(self, lane: Lane, team: int) -> None:
        """Another team's record: step this team's ring states over its stages."""
        for inst, role in lane.members:
            b = self.k.bound[inst]
            for port in header.pipeline_ports(b, role):
                self.w(f"st_{inst}_{role}.{port}.skip({self.at(inst, team)}.port.{port}, "
                       f"{self.per_tile_count(inst, port)});")

    def per_tile_count(self, inst: str, port_name: str) -> str:
        """The stages a ring port hands over per work record, as a C expression."""
        b = self.k.bound[inst]
        per_tile = str(b.contract.ports[port_name].spec.get("per_tile", 1))
        if per_tile == PER_TILE_WORK:
            return "tile.k_tiles()"
        if per_tile.startswith("args."):
            return f"args_{inst}.{per_tile[5:]}"
        return str(b.eval(per_tile, f"ports.{port_name}.per_tile", self.tunables(inst)))

    def hooks(self, lane: Lane, hook: str, team: int = 0) -> None:
        for inst, role in lane.members:
            b = self.k.bound[inst]
            spec = b.contract.roles[role]
            if getattr(spec, hook):
                self.w(f"{self.ns(b)}{b.symbol(spec.entry + '_' + hook)}"
                       f"({self.at(inst, team)}, args_{inst}, k, st_{inst}_{role});")

    def register_arrays(self, lane: Lane) -> dict[tuple[str, str], tuple[str, str]]:
        """(instance, port) -> (array name, declaration) for the lane's hand-offs."""
        out = {}
        for t in self.k.transfers:
            if t.kind != "registers" or (t.src.instance, self.k.bound[t.src.instance]
                                         .contract.ports[t.src.port].role) not in lane.members:
                continue
            b = self.k.bound[t.src.instance]
            port = b.contract.ports[t.src.port]
            ctype = header.CXX_DTYPE[b.dtype(port.dtype, port.name)]
            count = b.eval(port.spec["count"], f"ports.{port.name}.count")
            name = f"regs_{t.src.instance}_{t.src.port}"
            decl = (name, f"{ctype} {name}[{count}];  // {t.src} -> {t.dst}, stays in registers")
            out[(t.src.instance, t.src.port)] = decl
            out[(t.dst.instance, t.dst.port)] = decl
        return out

    def converter_body(self, t: Transfer) -> None:
        w = self.w
        sb, db = self.k.bound[t.src.instance], self.k.bound[t.dst.instance]
        sport, dport = sb.contract.ports[t.src.port], db.contract.ports[t.dst.port]
        from_t = header.CXX_DTYPE[sb.dtype(sport.dtype, sport.name)]
        to_t = header.CXX_DTYPE[db.dtype(dport.dtype, dport.name)]
        rows, cols = (db.eval(v, f"ports.{dport.name}.shape") for v in dport.spec["shape"][:2])
        transpose = "true" if sb.layout(sport.name) != db.layout(dport.name) else "false"
        slot = self.p.roles[t.converter]
        count = self.per_tile_count(t.src.instance, t.src.port)
        w("pl::PipeState from_state{}, to_state{};")
        w(f"const uint32_t thread = threadIdx.x - {slot.warp_base * THREADS_PER_WARP};")
        self.open_loop()
        self.next_record()
        w(f"const uint32_t stages = {count};")
        w.open("for (uint32_t i = 0; i < stages; ++i)")
        w(f"pl_convert_stage<{from_t}, {to_t}, {transpose}, {rows}, {cols}>("
          f"pl_cvt_from_{t.converter}, from_state, pl_cvt_to_{t.converter}, to_state, thread, "
          f"{CONVERTER_THREADS});")
        w.close()
        self.done_record()
        w.close()


def mono_sources(stages: dict[str, Path], bound: dict[str, BoundContract],
                 arch: str) -> tuple[tuple[str, str], ...]:
    """(instance, staged source path) for a monolithic build."""
    return tuple((inst, str(stages[inst] / "component" / b.contract.source_for(arch)))
                 for inst, b in bound.items())
