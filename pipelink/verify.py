"""What the linked code does versus what the contracts promise.

The placer trusts the contracts; this module checks them against the code after
nvJitLink, so a component that hard-codes a barrier id, declares no static shared
memory, or runs out of registers is an error at link time, not a hang or a launch
failure on the GPU:

- **folded placement** (:func:`verify_folded`): no call to a component entry and no
  run-time load of a placement constant survives LTO;
- **named barriers**: every id a component's own code names as a constant is one its
  contract declares ``fixed`` (with that barrier's thread count), and every id the linked
  kernel uses is 0 or a placed one, with the thread count of a barrier placed there;
- **static shared memory**: each component's static ``__shared__`` bytes are at most its
  contract's ``static_smem``, and the kernel's static plus dynamic bytes fit in a block;
- **registers**: ptxas spilled nothing (a ``setmaxnreg`` budget below what a warpgroup's
  code uses shows up as spills).

A linked kernel inlines everything, so blame needs each component's code alone. A *probe*
does that: a tiny translation unit that only takes the address of every component entry
is linked with the objects to PTX. Nothing calls the entries, so each stays a function of
its own whose placement arrives through a pointer: an id that is still a constant there is
one the component's source hard-codes.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections.abc import Iterable
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from pathlib import Path

from .check import Kernel
from .compile import INCLUDE_DIR
from .errors import LinkError, ToolchainError
from .objfile import ComponentObject
from .problem import (
    ARCH_LIMITS,
    DYNAMIC_SMEM_ALIGN,
    UNPLACED_BARRIER,
    Placement,
    static_footprint,
)

# PTX scalar type -> bytes (a .shared declaration's element size).
_PTX_BYTES = {"b8": 1, "u8": 1, "s8": 1, "b16": 2, "u16": 2, "s16": 2, "f16": 2, "bf16": 2,
              "b32": 4, "u32": 4, "s32": 4, "f32": 4, "b64": 8, "u64": 8, "s64": 8, "f64": 8,
              "b128": 16}
_FUNC_HEAD = re.compile(r"^\s*(?:\.(?:visible|weak|extern)\s+)*\.(func|entry)\s+"
                        r"(?:\([^)]*\)\s*)?([A-Za-z_$%][\w$]*)")
_SHARED = re.compile(r"^\s*(?:\.(?:visible|weak|global)\s+)*(\.extern\s+)?\.shared\s+"
                     r"(?:\.align\s+\d+\s+)?(?:\.v(\d)\s+)?\.(\w+)\s+([A-Za-z_$][\w$]*)"
                     r"((?:\[\d*\])*)")
# bar.sync / bar.arrive / bar.red / barrier.sync[.aligned] / barrier.cta.* (not bar.warp.sync,
# not mbarrier: both start differently or carry .warp).
_BARRIER = re.compile(r"^\s*(?:@!?%\w+\s+)?(bar(?:rier)?(?:\.cta)?\.(sync|arrive|red)"
                      r"(?:\.[\w:]+)*)\s+([^;]*);")
_MOV_IMM = re.compile(r"^\s*mov\.[bsu]32\s+(%\w+),\s*(-?(?:0[xX][0-9a-fA-F]+|\d+))\s*;")
_DEST = re.compile(r"^\s*(?:@!?%\w+\s+)?([a-z][\w.:]*)\s+(%\w+)\s*[,;]")
_TOKEN = re.compile(r"[A-Za-z_$][\w$]*")
_PTXAS = {"spill_stores": re.compile(r"(\d+) bytes spill stores"),
          "spill_loads": re.compile(r"(\d+) bytes spill loads"),
          "stack": re.compile(r"(\d+) bytes stack frame"),
          "registers": re.compile(r"Used (\d+) registers"),
          "smem": re.compile(r"(\d+) bytes smem")}


class ContractViolation(LinkError):
    """The linked code does something its component's contract does not declare."""

    def __init__(self, message: str, *, instance: str | None = None,
                 component: str | None = None, **kw: str | None) -> None:
        self.instance = instance
        self.component = component
        super().__init__(message, **kw)


@dataclass(frozen=True)
class BarrierUse:
    """One named-barrier instruction: its id and thread count when they are constants
    (``threads`` is None for a whole-block barrier or a count that is not a constant)."""

    op: str
    id: int | None
    threads: int | None
    all_threads: bool
    text: str


@dataclass(frozen=True)
class PtxFunction:
    name: str
    barriers: tuple[BarrierUse, ...]
    tokens: frozenset[str]         # every identifier the body names (callees, variables)


@dataclass(frozen=True)
class PtxModule:
    functions: dict[str, PtxFunction]
    shared: dict[str, int]         # static .shared variable -> bytes (extern/dynamic left out)

    def reachable(self, roots: Iterable[str]) -> set[str]:
        """Functions a set of entries reaches through calls or address-taking."""
        seen: set[str] = set()
        todo = [r for r in roots if r in self.functions]
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            todo += [t for t in self.functions[name].tokens if t in self.functions]
        return seen

    def shared_of(self, functions: Iterable[str]) -> dict[str, int]:
        """Static shared variables the given functions name."""
        names = set().union(*(self.functions[f].tokens for f in functions))
        return {v: n for v, n in sorted(self.shared.items()) if v in names}


def parse_ptx(ptx: str) -> PtxModule:
    """Functions (with their named-barrier uses) and static shared variables of a module."""
    functions: dict[str, PtxFunction] = {}
    shared: dict[str, int] = {}
    name, body, depth = None, [], 0
    for line in ptx.splitlines():
        code = line.split("//", 1)[0]
        m = _SHARED.match(code)
        if m and not m.group(1) and m.group(5) and "[]" not in m.group(5):
            count = 1
            for dim in re.findall(r"\[(\d+)\]", m.group(5)):
                count *= int(dim)
            shared[m.group(4)] = count * int(m.group(2) or 1) * _PTX_BYTES.get(m.group(3), 1)
        elif m and not m.group(1) and not m.group(5):
            shared[m.group(4)] = int(m.group(2) or 1) * _PTX_BYTES.get(m.group(3), 1)
        if depth == 0:
            head = _FUNC_HEAD.match(code)
            if head:
                name, body = head.group(2), []
            elif name is not None and code.strip().startswith(";"):
                name = None            # a prototype, not a definition
        opened, closed = code.count("{"), code.count("}")
        if name is not None and depth + opened > 0:
            body.append(code)
        depth += opened - closed
        if name is not None and depth == 0 and closed:
            functions[name] = _function(name, body)
            name = None
    return PtxModule(functions, shared)


def _function(name: str, body: list[str]) -> PtxFunction:
    consts = _constants(body)
    uses = []
    for line in body:
        m = _BARRIER.match(line)
        if not m:
            continue
        operands = [o.strip() for o in m.group(3).split(",")]
        if m.group(2) == "red":          # bar.red.op.type d, a{, b}, {!}c
            operands = operands[1:-1]
        ident = _value(operands[0], consts)
        count = _value(operands[1], consts) if len(operands) > 1 else None
        uses.append(BarrierUse(m.group(1), ident, count, len(operands) == 1, line.strip()))
    tokens = frozenset(t for line in body for t in _TOKEN.findall(line))
    return PtxFunction(name, tuple(uses), tokens - {name})


def _constants(body: list[str]) -> dict[str, int]:
    """Registers whose every definition moves one immediate into them."""
    moved: dict[str, set[int]] = {}
    other: set[str] = set()
    for line in body:
        m = _MOV_IMM.match(line)
        if m:
            moved.setdefault(m.group(1), set()).add(int(m.group(2), 0))
            continue
        d = _DEST.match(line)
        if d and not d.group(1).startswith(("bar", "st.", "red.", "atom")):
            other.add(d.group(2))
    return {r: next(iter(v)) for r, v in moved.items() if len(v) == 1 and r not in other}


def _value(operand: str, consts: dict[str, int]) -> int | None:
    if re.fullmatch(r"-?(0[xX][0-9a-fA-F]+|\d+)", operand):
        return int(operand, 0)
    return consts.get(operand)


# -- the probe ----------------------------------------------------------------------------


def probe_source(symbols: Iterable[str], stubs: Iterable[str] = ()) -> str:
    """A translation unit that keeps every entry alive without calling it (the declared
    type does not matter: LTO links by name and only the address is taken), and defines
    ``stubs``: the functions the objects call through function ports, which the glue
    defines in a kernel."""
    names = sorted(set(symbols))
    lines = ["// Keeps each component entry a function of its own, for verification."]
    stubs = sorted(set(stubs))
    if stubs:
        lines += ['#include "pipelink/pipelink.cuh"', *stubs]
    lines += [f'extern "C" __device__ void {s}();' for s in names]
    lines.append("__device__ void* pl_probe_keep[] = {"
                 + ", ".join(f"(void*)&{s}" for s in names) + "};")
    return "\n".join(lines) + "\n"


def function_stubs(objects: dict[str, ComponentObject]) -> list[str]:
    """A definition returning a zero value for each function an object calls through a
    function in port (the probe links the objects without their providers)."""
    from .header import function_of
    out = []
    for obj in objects.values():
        b = obj.bound()
        for key, name in b.functions("in").items():
            f = function_of(b.contract, *key.split("."))
            out.append(f'extern "C" __device__ {f.returns} {b.symbol(name)}('
                       f"{f.signature('const pl::KernelInfo&')}) {{ return {{}}; }}")
    return out


def probe_ptx(objects: dict[str, ComponentObject], arch: str, nvcc: str,
              options: list[str]) -> PtxModule:
    """The objects linked beside the probe into PTX: each entry as its own function."""
    from .link import run_nvjitlink
    unique = {o.header["ltoir_sha256"]: o for _, o in sorted(objects.items())}
    symbols = [s for o in unique.values() for s in o.header["symbols"].values()]
    num = arch.removeprefix("sm_")
    with tempfile.TemporaryDirectory(prefix="pipelink-probe-") as tmp:
        src, out = Path(tmp) / "probe.cu", Path(tmp) / "probe.ltoir"
        src.write_text(probe_source(symbols, function_stubs(unique)))
        proc = subprocess.run([nvcc, "-rdc=true", "-ltoir", f"-I{INCLUDE_DIR}",
                               f"-gencode=arch=compute_{num},code=lto_{num}",
                               "-o", str(out), str(src)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise ToolchainError("nvcc failed compiling the verification probe",
                                 log=proc.stdout + proc.stderr)
        inputs = [(f"{sha[:12]}.ltoir", o.ltoir) for sha, o in sorted(unique.items())]
        inputs.append(("probe.ltoir", out.read_bytes()))
    return parse_ptx(run_nvjitlink(inputs, options, want_ptx=True).decode())


# -- checks -------------------------------------------------------------------------------


def check_component_code(kernel: Kernel, objects: dict[str, ComponentObject],
                         probe: PtxModule) -> None:
    """Each component's own code against its own contract: hard-coded barrier ids and
    static shared memory."""
    for inst, obj in sorted(objects.items()):
        b = kernel.bound[inst]
        funcs = probe.reachable(obj.header["symbols"].values())
        label = f"component '{b.name}' (instance '{inst}')"
        placed = b.named_barriers()
        threads = {name: b.eval(spec["threads"], f"named_barriers.{name}.threads")
                   for name, spec in placed.items()}
        fixed = {spec["fixed"]: (name, threads[name])
                 for name, spec in placed.items() if spec.get("fixed")}
        for f in sorted(funcs):
            for use in probe.functions[f].barriers:
                _check_own_barrier(use, fixed, label, inst, b.name, obj.path)
                _check_placed_barrier(use, threads, label, inst, b.name, obj.path)
        shared = probe.shared_of(funcs)
        used = sum(shared.values())
        declared = b.eval(b.contract.data.get("static_smem", 0), "static_smem")
        if used > declared:
            names = ", ".join(f"{v} ({n} B)" for v, n in shared.items())
            raise ContractViolation(
                f"{label} declares {used} bytes of static __shared__ memory ({names}) but "
                f"its contract states static_smem: {declared}", instance=inst,
                component=b.name, where=obj.path,
                hint=f"set 'static_smem: {used}' in {b.name}'s contract.yaml so the placer "
                     "counts it, or move the buffer into a placed 'smem:' entry")


def _check_own_barrier(use: BarrierUse, fixed: dict[int, tuple[str, int]], label: str,
                       inst: str, component: str, path: str) -> None:
    if use.id is None or use.id == 0:
        return                          # placed (a run-time id) or the block-wide barrier 0
    if use.id not in fixed:
        declared = ", ".join(f"{n} = {i}" for i, (n, _) in sorted(fixed.items())) or "none"
        raise ContractViolation(
            f"{label} hard-codes named barrier id {use.id} ('{use.text}'), which its contract "
            f"does not declare fixed (fixed ids: {declared}); the placer may give id "
            f"{use.id} to another barrier", instance=inst, component=component, where=path,
            hint=f"read the id from the placement (at.bar.<name>), or declare it: "
                 f"named_barriers: {{<name>: {{threads: ..., fixed: {use.id}}}}}")
    name, threads = fixed[use.id]
    if use.threads is not None and use.threads != threads:
        raise ContractViolation(
            f"{label} uses named barrier {use.id} with {use.threads} threads "
            f"('{use.text}'), but its contract declares named_barriers.{name}.threads: "
            f"{threads}", instance=inst, component=component, where=path,
            hint=f"make named_barriers.{name}.threads {use.threads}, or the code's count "
                 f"{threads}")


def _check_placed_barrier(use: BarrierUse, threads: dict[str, int], label: str, inst: str,
                          component: str, path: str) -> None:
    """A barrier whose id arrives at run time is one of the contract's: its count, where
    the code states one, is one the contract declares."""
    if use.id is not None:
        return
    if not threads:
        raise ContractViolation(
            f"{label} uses a named barrier ('{use.text}') but its contract declares none",
            instance=inst, component=component, where=path,
            hint="declare it: named_barriers: {<name>: {threads: ...}}, and read its id "
                 "from the placement (at.bar.<name>)")
    if use.threads is not None and use.threads not in threads.values():
        shown = ", ".join(f"{n}: {t}" for n, t in sorted(threads.items()))
        raise ContractViolation(
            f"{label} syncs a named barrier with {use.threads} threads ('{use.text}'), but "
            f"its contract declares named_barriers threads {shown}", instance=inst,
            component=component, where=path,
            hint="make the contract's named_barriers.<name>.threads the count the code uses")


def check_linked_barriers(ptx: str, kernel: Kernel, placement: Placement) -> None:
    """Every named barrier of the linked kernel is 0 or a placed id, with the thread
    count of a barrier placed there."""
    threads = {b.name: b.threads for b in kernel.problem.barriers}
    at_id: dict[int, dict[str, int]] = {}
    for name, ident in placement.barriers.items():
        at_id.setdefault(ident, {})[name] = threads[name]
    for f in parse_ptx(ptx).functions.values():
        for use in f.barriers:
            if use.id is None or use.id == 0:
                continue
            if use.id % 2**32 == UNPLACED_BARRIER:   # PTX may write it as -1
                _unplaced_barrier(use, kernel)
            if use.id not in at_id:
                placed = ", ".join(f"{n} = {i}" for n, i in sorted(placement.barriers.items()))
                raise ContractViolation(
                    f"the linked kernel uses named barrier id {use.id} ('{use.text}'), which "
                    f"the placement gives no barrier (placed: {placed or 'none'})",
                    hint="a component hard-codes it: declare it fixed in its contract")
            if use.threads is not None and use.threads not in at_id[use.id].values():
                owners = ", ".join(f"{n} ({t} threads)" for n, t in
                                   sorted(at_id[use.id].items()))
                raise ContractViolation(
                    f"the linked kernel uses named barrier {use.id} with {use.threads} "
                    f"threads ('{use.text}'), but it is placed for {owners}",
                    hint="the code's thread count and the contract's "
                         "named_barriers.<name>.threads must agree")


def _unplaced_barrier(use: BarrierUse, kernel: Kernel) -> None:
    """A sync on the id the glue gives a barrier whose `when` is false: code the
    component meant to be dead for these params is not."""
    unplaced = sorted(f"{inst}.{name}" for inst, b in kernel.bound.items()
                      for name in b.contract.section("named_barriers")
                      if not b.places(name))
    raise ContractViolation(
        f"the linked kernel uses named barrier id {UNPLACED_BARRIER:#x} ('{use.text}'), the "
        "id of a barrier that is not placed (its contract's when is false for the params: "
        f"{', '.join(unplaced) or 'none'})",
        hint="the code that reads such a barrier must be dead for those params: test the "
             "same condition as the contract's when (if constexpr), or widen the when")


@dataclass(frozen=True)
class PtxasReport:
    """What ptxas said about the linked kernel (nvJitLink -verbose)."""

    registers: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    stack: int = 0
    smem: int = 0                  # static shared bytes

    @staticmethod
    def parse(log: str) -> PtxasReport:
        values = {k: max([0] + [int(v) for v in p.findall(log)]) for k, p in _PTXAS.items()}
        return PtxasReport(**values)


def check_resources(report: PtxasReport, kernel: Kernel, placement: Placement) -> None:
    """Spills and static plus dynamic shared memory of the linked kernel."""
    limit = ARCH_LIMITS[kernel.arch]["smem_bytes"]
    total = static_footprint(report.smem) + placement.smem_bytes
    if total > limit:
        raise ContractViolation(
            f"the linked kernel needs {report.smem} bytes of static plus "
            f"{placement.smem_bytes} bytes of dynamic shared memory, {total} B with the "
            f"dynamic part aligned to {DYNAMIC_SMEM_ALIGN}, more than the {limit} B a block "
            f"gets on {kernel.arch}",
            hint="declare each component's static __shared__ bytes as static_smem in its "
                 "contract so the placer counts them")
    if report.spill_stores or report.spill_loads:
        roles = sorted(kernel.problem.roles, key=lambda r: placement.roles[r.name].warp_base)
        needs = ", ".join(f"{r.name} needs {r.registers} (warps "
                          f"{placement.roles[r.name].warp_base}.."
                          f"{placement.roles[r.name].warp_base + r.warps - 1})" for r in roles)
        raise ContractViolation(
            f"ptxas spilled registers in the linked kernel: {report.spill_stores} bytes "
            f"spill stores, {report.spill_loads} bytes spill loads, {report.stack} bytes "
            f"stack frame; {report.registers} registers per thread at launch, setmaxnreg "
            f"budgets per warpgroup {list(placement.warpgroup_regs)}; the contracts say: "
            f"{needs}",
            hint="a role's code uses more registers than its budget: raise that role's "
                 "'registers' in its contract to what the code uses, or use fewer warps")


# One call statement, whatever lines ptxas's printer spreads it over (the callee
# usually sits on the line after `call.uni`).
_CALL = re.compile(r"\bcall(?:\.uni)?\b[^;]*;")


def verify_folded(ptx: str, kernel: Kernel) -> None:
    """The linked PTX must call no component entry and load no placement constant."""
    owners: dict[str, set[str]] = {}
    for inst, b in kernel.bound.items():
        for e in [*b.entries().values(), *b.functions("in").values()]:
            owners.setdefault(b.symbol(e), set()).add(f"instance '{inst}' ({b.name})")
    calls, called = [], set()
    for m in _CALL.finditer(ptx):
        symbols = owners.keys() & set(_TOKEN.findall(m.group(0)))
        if symbols:
            calls.append(" ".join(m.group(0).split()))
            called.update(o for s in symbols for o in owners[s])
    who = ", ".join(sorted(called))
    loads = [line.strip() for line in ptx.splitlines()
             if re.search(r"\bld\.", line) and re.search(r"\bpl_(at|cvt|work)_", line)]
    if calls or loads:
        raise LinkError("LTO did not fold the placement: "
                        f"{len(calls)} entry call(s), {len(loads)} placement load(s) remain"
                        + (f"; still called: {who}" if who else ""),
                        hint="component entries must be plain extern \"C\" __device__ "
                             "functions (not inline/__forceinline__/__noinline__)",
                        log="\n".join(calls[:5] + loads[:5]))


@dataclass(frozen=True)
class Evidence:
    """What the checks read besides the linked PTX, each from a link of its own that
    runs beside the kernel's (nvJitLink releases the GIL and its handles are separate):
    the probe, and ptxas's report (-verbose changes a cubin's bytes, so the shipped
    cubin is linked without it)."""

    probe: Future[PtxModule]
    report: Future[PtxasReport]


def start_evidence(pool: Executor, inputs: list[tuple[str, bytes]],
                   objects: dict[str, ComponentObject], arch: str, nvcc: str,
                   options: list[str]) -> Evidence:
    """Starts the links the checks need on ``pool``."""
    return Evidence(pool.submit(probe_ptx, objects, arch, nvcc, options),
                    pool.submit(ptxas_report, inputs, options))


def ptxas_report(inputs: list[tuple[str, bytes]], options: list[str]) -> PtxasReport:
    from .link import run_nvjitlink
    log: list[str] = []
    run_nvjitlink(inputs, [*options, "-verbose"], info=log)
    return PtxasReport.parse("".join(log))


def verify_linked(ptx: str, kernel: Kernel, placement: Placement,
                  objects: dict[str, ComponentObject], evidence: Evidence) -> None:
    """Every check above, components' own code first so an error can name its author."""
    verify_folded(ptx, kernel)
    check_component_code(kernel, objects, evidence.probe.result())
    check_linked_barriers(ptx, kernel, placement)
    check_resources(evidence.report.result(), kernel, placement)
