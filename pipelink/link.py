"""The link step: objects + recipe -> check -> place -> glue -> nvJitLink -> cubin.

:func:`link_kernel` is what the CLI and the SCons tool call. It writes, atomically,
``<recipe>.cubin``, ``kernel.json`` (the launch ABI), ``placement.json``, the glue
source and a placement picture, and checks the linked code against the contracts
(:mod:`pipelink.verify`): the placement folded into immediates, barrier ids, static
shared memory and register spills.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import glue, header, verify
from .check import Kernel, arg_requires, check, check_autograd, check_dispatch, dispatch_on
from .compile import INCLUDE_DIR, CompileOptions, _materialise, nvcc_command, stage_sources
from .contract import BoundContract, canonical_json, load_contract, sha256_text
from .errors import LinkError, PipeLinkError, ToolchainError
from .objfile import ComponentObject, read_object, write_atomic
from .problem import Placement
from .recipe import ComponentIndex, Recipe
from .stage import temp_dir
from .toolchain import Toolchain, discover

KERNEL_JSON_FORMAT = 1
KERNELS_JSON_FORMAT = 1


@dataclass(frozen=True)
class LinkOptions:
    arch: str
    mode: str = "linked"              # linked | mono
    optimize: str = "-O3"             # nvJitLink -O / nvcc -O
    emit_ptx: bool = False            # also write <recipe>.ptx
    verify: bool = True               # check the linked code against the contracts (verify.py)
    workers: int = 1                  # CP-SAT workers (the result does not depend on it)
    # Record when each CTA finishes each phase (Op.phase_times): a profiling build, one
    # CTA barrier and one global store per CTA and phase more than a plain one.
    phase_clock: bool = False
    # mode="mono" only: compile the one translation unit to LTO-IR and finish it with
    # nvJitLink, as the linked path does, instead of nvcc's whole-program -cubin. Where
    # linked and monolithic SASS differ, this tells PipeLink's part (glue, split objects)
    # from the compiler's (NVVM shapes some code apart in the two compile modes).
    mono_via_lto: bool = False


@dataclass
class LinkResult:
    cubin: Path
    kernel_json: Path
    placement: Placement
    kernel: Kernel
    timings: dict[str, float] = field(default_factory=dict)


PHASE_CLOCK_CTAS = 1024        # CTAs a phase-clock build records (later CTAs are not)


def phase_clock(kernel: Kernel, opts: LinkOptions) -> glue.PhaseClock | None:
    """Where the phase clocks go: after the kernel's own workspace, 8-byte aligned."""
    if not opts.phase_clock:
        return None
    return glue.PhaseClock(-(-kernel.workspace_bytes // 8) * 8, PHASE_CLOCK_CTAS,
                           len(kernel.phases) + 1)


def nvjitlink_options(opts: LinkOptions) -> list[str]:
    return [f"-arch={opts.arch}", "-lto", opts.optimize]


LINK_THREADS = max(2, min(4, os.cpu_count() or 1))   # a kernel's links at a time


def run_nvjitlink(inputs: list[tuple[str, bytes]], options: list[str],
                  want_ptx: bool = False, info: list[str] | None = None) -> bytes:
    """Links LTO-IR inputs; returns the cubin (or PTX). Failures carry the full log;
    ``info`` (if given) receives the info log (ptxas's report under ``-verbose``)."""
    from cuda.bindings import nvjitlink

    opts = options + (["-ptx"] if want_ptx else [])
    handle = nvjitlink.create(len(opts), opts)
    try:
        try:
            for name, data in inputs:
                nvjitlink.add_data(handle, nvjitlink.InputType.LTOIR, data, len(data), name)
            nvjitlink.complete(handle)
        except nvjitlink.nvJitLinkError as exc:
            raise LinkError(f"nvJitLink failed: {exc}", log=_error_log(handle)) from None
        if info is not None:
            info.append(_info_log(handle))
        if want_ptx:
            out = bytearray(nvjitlink.get_linked_ptx_size(handle))
            nvjitlink.get_linked_ptx(handle, out)
            return bytes(out).rstrip(b"\0")
        out = bytearray(nvjitlink.get_linked_cubin_size(handle))
        nvjitlink.get_linked_cubin(handle, out)
        return bytes(out)
    finally:
        nvjitlink.destroy(handle)


def _error_log(handle: int) -> str:
    return _log(handle, "error")


def _info_log(handle: int) -> str:
    return _log(handle, "info")


def _log(handle: int, kind: str) -> str:
    """nvJitLink's error or info log as text."""
    from cuda.bindings import nvjitlink
    size = getattr(nvjitlink, f"get_{kind}_log_size")(handle)
    buf = bytearray(size)
    if size:
        getattr(nvjitlink, f"get_{kind}_log")(handle, buf)
    return bytes(buf).rstrip(b"\0").decode(errors="replace")


def bound_from_objects(objects: dict[str, ComponentObject],
                       index: ComponentIndex | None = None) -> dict[str, BoundContract]:
    """Each object's embedded contract, bound. Messages about it name the contract.yaml the
    user edits when ``index`` finds one the object was built from, else the object."""
    return {inst: obj.bound(_contract_file(obj, index)) for inst, obj in objects.items()}


def _contract_file(obj: ComponentObject, index: ComponentIndex | None) -> str | None:
    if index is None:
        return None
    try:
        path = index.path(obj.component)
        data = load_contract(path).data
    except PipeLinkError:
        return None
    return str(path) if sha256_text(canonical_json(data)) == obj.header["contract_sha256"] \
        else None


def check_objects(recipe: Recipe, arch: str, objects: dict[str, Path],
                  index: ComponentIndex | None = None) -> tuple[
        Kernel, dict[str, ComponentObject]]:
    loaded = {inst: read_object(path) for inst, path in objects.items()}
    for inst, obj in loaded.items():
        if obj.arch != arch:
            raise LinkError(f"object for instance '{inst}' was built for {obj.arch}, not {arch}",
                            where=obj.path, hint="rebuild it for the arch being linked")
    return check(recipe, arch, bound_from_objects(loaded, index)), loaded


UNRESOLVED = re.compile(r"Unresolved extern function '([A-Za-z0-9_]+)'")


def unresolved_symbol(kernel: Kernel, loaded: dict[str, ComponentObject],
                      error: PipeLinkError) -> LinkError | None:
    """ptxas's unresolved extern function (from nvJitLink, or nvcc on the monolithic
    unit), when a component owes it (a function of an interface it provides, or a role's
    entry or hook), as an error naming the component, instance and what to define; None
    otherwise."""
    found = UNRESOLVED.search(error.log or "")
    if found is None:
        return None
    return (_unprovided_function(kernel, loaded, found.group(1))
            or _undefined_entry(kernel, loaded, found.group(1)))


def _unprovided_function(kernel: Kernel, loaded: dict[str, ComponentObject],
                         symbol: str) -> LinkError | None:
    """A function a connected provider owes its interface (a provider written against an
    older interface, say): the definition to add."""
    for inst, provider in sorted(kernel.bound.items()):
        for key, name in provider.functions("out").items():
            if provider.symbol(name) != symbol:
                continue
            port, fn = key.split(".")
            interface = provider.contract.ports[port].spec["interface"]
            f = header.function_of(provider.contract, port, fn)
            first = header.leading_parameters(f"pl_place_{provider.name}",
                                              f"pl_args_{provider.name}", names=False)
            return LinkError(
                f"component '{provider.name}' (instance '{inst}') does not define function "
                f"'{fn}' of interface '{interface}', which its port '{port}' provides",
                where=loaded[inst].path if inst in loaded else None,
                hint=f'define extern "C" __device__ {f.returns} {name}({f.signature(first)}) '
                     f"in the component's source: {f.description}")
    return None


_HOOKS = {"init": "init hook", "tail": "tail hook"}


def _undefined_entry(kernel: Kernel, loaded: dict[str, ComponentObject],
                     symbol: str) -> LinkError | None:
    """A role's entry (or init/tail hook) the component's object does not define (a
    misspelt name, or an inline entry that was never emitted): the definition to write."""
    for inst, bound in sorted(kernel.bound.items()):
        for key, name in bound.entries().items():
            role, _, hook = key.partition(".")
            if (role not in bound.contract.roles or hook not in ("", *_HOOKS)
                    or bound.symbol(name) != symbol):
                continue
            what = f"the {_HOOKS[hook]} of role '{role}'" if hook else f"role '{role}'"
            return LinkError(
                f"component '{bound.name}' (instance '{inst}') does not define {name}, the "
                f"entry of {what}",
                where=loaded[inst].path if inst in loaded else None,
                hint=f'define it in the component\'s source as a plain extern "C" __device__ '
                     f"function with the signature pl_{bound.name}.h declares (the header "
                     "maps the name to the object's symbol), not inline or __forceinline__: "
                     "an entry nothing in its file calls is then never emitted")
    return None


def place_kernel(kernel: Kernel, workers: int = 1) -> Placement:
    from .place import place
    return place(kernel.problem, workers=workers)


def compile_glue(source: str, bound: dict[str, BoundContract], opts: LinkOptions,
                 tc: Toolchain, stage_root: Path, extra_includes: list[str] = ()) -> bytes:
    """Compiles the glue to LTO-IR from a content-addressed stage (so its bytes too
    depend on content alone)."""
    files = {"glue.cu": source.encode()}
    for b in bound.values():
        files[f"include/pl_{b.name}_{b.params_hash()}.h"] = header.generate(b).encode()
    for path in sorted(INCLUDE_DIR.rglob("*.cuh")):
        files[f"include/{path.relative_to(INCLUDE_DIR)}"] = path.read_bytes()
    stage = _materialise(stage_root, files)
    copts = CompileOptions(opts.arch, opt_level=opts.optimize, stage_root=str(stage_root))
    with temp_dir(stage_root, ".glue-") as out_dir:  # reaped if the link is killed
        out = Path(out_dir) / "glue.ltoir"
        cmd = nvcc_command(tc.nvcc, copts, "glue.cu", str(out),
                           [str(stage / "include"), *extra_includes])
        proc = subprocess.run(cmd, cwd=stage, capture_output=True, text=True)
        if proc.returncode != 0:
            raise ToolchainError("nvcc failed compiling the generated glue",
                                 where=str(stage / "glue.cu"), log=proc.stdout + proc.stderr)
        return out.read_bytes()


def compile_mono(kernel: Kernel, placement: Placement, index: ComponentIndex,
                 opts: LinkOptions, tc: Toolchain, stage_root: Path) -> tuple[bytes, str]:
    """The yardstick: the same sources and placement as one translation unit -> cubin."""
    stages, includes = {}, []
    for inst, b in kernel.bound.items():
        folder = index.path(b.name).parent
        stages[inst], inc, _ = stage_sources(b, folder, opts.arch, stage_root)
        includes += [i for i in inc if i not in includes]
    source = glue.generate(kernel, placement, glue.GlueOptions(
        mono=True, sources=glue.mono_sources(stages, kernel.bound, opts.arch),
        phase_clock=phase_clock(kernel, opts)))
    # Every ABI header, staged beside it: the unit includes them all up front (a
    # component's own stage holds only the headers it reaches).
    files = {"mono.cu": source.encode()}
    for path in sorted(INCLUDE_DIR.rglob("*.cuh")):
        files[f"include/{path.relative_to(INCLUDE_DIR)}"] = path.read_bytes()
    stage = _materialise(stage_root, files)
    includes = [str(stage / "include"), *includes]
    copts = CompileOptions(opts.arch, opt_level=opts.optimize, stage_root=str(stage_root))
    with temp_dir(stage_root, ".mono-") as out_dir:
        out = Path(out_dir) / ("mono.ltoir" if opts.mono_via_lto else "mono.cubin")
        cmd = nvcc_command(tc.nvcc, copts, "mono.cu", str(out), includes,
                           cubin=not opts.mono_via_lto)
        proc = subprocess.run(cmd, cwd=stage, capture_output=True, text=True)
        if proc.returncode != 0:
            raise ToolchainError("nvcc failed compiling the monolithic translation unit",
                                 where=str(stage / "mono.cu"), log=proc.stdout + proc.stderr)
        if opts.mono_via_lto:
            return run_nvjitlink([("mono.ltoir", out.read_bytes())],
                                 nvjitlink_options(opts)), source
        return out.read_bytes(), source


def kernel_json(kernel: Kernel, placement: Placement, objects: dict[str, ComponentObject],
                tc: Toolchain, mode: str, cubin: bytes,
                clock: glue.PhaseClock | None = None) -> dict[str, Any]:
    fields, size = glue.param_layout(kernel)
    counters = sorted([g.counter_offset, 4 * g.slots]
                      for g in kernel.workspace.values() if g.slots)
    workspace = {"bytes": kernel.workspace_bytes, "counters": counters}
    extra = {}
    if clock is not None:     # zeroed per launch like a counter: an unwritten row reads 0
        workspace = {"bytes": clock.offset + clock.bytes,
                     "counters": [*counters, [clock.offset, clock.bytes]]}
        extra["phase_clock"] = {"offset": clock.offset, "ctas": clock.ctas,
                                "slots": clock.slots,
                                "phases": [ph.name for ph in kernel.phases]}
    return {
        "format": KERNEL_JSON_FORMAT,
        "recipe": kernel.recipe.recipe_name,
        "kernel": kernel.recipe.kernel,
        "cubin": cubin_name(kernel.recipe),
        "arch": kernel.arch,
        "mode": mode,
        "entry": glue.entry_name(kernel.recipe.name),
        "block": [placement.threads, 1, 1],
        "dynamic_smem": placement.smem_bytes,
        "cluster": kernel.recipe.launch.get("cluster", [1, 1, 1]),
        # CTAs that wait for each other between phases must all be resident.
        "cooperative": any(ph.after for ph in kernel.phases),
        "params": {"bytes": size, "fields": [
            {"name": f.name, "instance": f.instance, "arg": f.arg, "type": f.type,
             "offset": f.offset, "size": f.size, **f.extra} for f in fields]},
        "components": {inst: {"component": b.name, "params": b.params,
                              "args": b.contract.data.get("args", [])}
                       for inst, b in kernel.bound.items()},
        "workspace": workspace,
        "launch": launch_spec(kernel.recipe.launch, arg_requires(kernel)),
        "toolchain": tc.versions(),
        "inputs": {inst: obj.header["ltoir_sha256"] for inst, obj in sorted(objects.items())},
        "cubin_sha256": sha256_text(cubin),
        **extra,
    }


def cubin_name(recipe: Recipe) -> str:
    """``<recipe>.cubin``, or ``<recipe>_<kernel>.cubin`` for a kernel of a multi-kernel
    recipe (named like its entry, so two kernels' files never pass for each other)."""
    return f"{recipe.name}.cubin"


def kernels_index(recipe: Recipe, arch: str) -> str:
    """``kernels.json`` of a multi-kernel recipe: the folder of each kernel built for
    ``arch``, the archs of those that are not, and the checked, normalised autograd and
    dispatch sections, as the runtime reads them."""
    doc = {"format": KERNELS_JSON_FORMAT, "recipe": recipe.recipe_name, "arch": arch,
           "kernels": {name: k.folder for name, k in recipe.select(None, arch).items()},
           "autograd": check_autograd(recipe)}
    elsewhere = recipe.elsewhere(arch)
    if elsewhere:                  # absent otherwise: older kernels.json stay byte-equal
        doc["elsewhere"] = {name: list(archs) for name, archs in elsewhere.items()}
    dispatch = check_dispatch(recipe)
    if dispatch is not None:       # absent otherwise: older kernels.json stay byte-equal
        doc["dispatch"] = dispatch_on(recipe, dispatch, arch)
    return json.dumps(doc, sort_keys=True, indent=1) + "\n"


def launch_spec(launch: dict[str, Any], requires: list[str] | None = None) -> dict[str, Any]:
    """The recipe's host-side launch, with inputs and outputs as ordered lists (the
    call's positional order must survive kernel.json's sorted keys), and ``requires``
    (the arguments' bounds, check.arg_requires) after the recipe's own conditions."""
    out = dict(launch)
    if requires:
        out["require"] = list(dict.fromkeys([*launch.get("require", []), *requires]))
    for key in ("inputs", "outputs"):
        if key in out:
            out[key] = [{"name": name, **spec} for name, spec in out[key].items()]
    return out


def link_kernel(recipe: Recipe, objects: dict[str, Path], out_dir: Path | str,
                opts: LinkOptions, *, index: ComponentIndex | None = None,
                toolchain: Toolchain | None = None, stage_root: Path | None = None
                ) -> LinkResult:
    """Links one recipe for one arch into ``out_dir``."""
    from . import report
    out_dir = Path(out_dir)
    stage_root = Path(stage_root or CompileOptions(opts.arch).stage_root)
    tc = toolchain or discover()
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    kernel, loaded = check_objects(recipe, opts.arch, objects, index)
    timings["check"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    placement = place_kernel(kernel, opts.workers)
    timings["place"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    if opts.mode == "mono":
        if index is None:
            raise LinkError("a monolithic build needs the component sources",
                            hint="pass the component index (components/ folder)")
        try:
            cubin, source = compile_mono(kernel, placement, index, opts, tc, stage_root)
        except ToolchainError as exc:
            raise unresolved_symbol(kernel, loaded, exc) or exc from None
        timings["glue"] = time.perf_counter() - t0
        ptx = None
    else:
        source = glue.generate(kernel, placement,
                               glue.GlueOptions(phase_clock=phase_clock(kernel, opts)))
        glue_ir = compile_glue(source, kernel.bound, opts, tc, stage_root)
        timings["glue"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        # Two instances of one (component, params) share one object: add it once.
        unique = {obj.header["ltoir_sha256"]: (inst, obj) for inst, obj in
                  reversed(list(loaded.items()))}
        inputs = [(f"{inst}.ltoir", obj.ltoir) for inst, obj in sorted(unique.values(),
                                                                      key=lambda e: e[0])]
        inputs.append(("glue.ltoir", glue_ir))
        options = nvjitlink_options(opts)
        # The cubin, its PTX and the verification's links are independent: they run side
        # by side (each nvJitLink call releases the GIL), and the checks then read them
        # in order.
        with ThreadPoolExecutor(max_workers=LINK_THREADS) as pool:
            cubin_job = pool.submit(run_nvjitlink, inputs, options)
            ptx_job = (pool.submit(run_nvjitlink, inputs, options, want_ptx=True)
                       if opts.verify or opts.emit_ptx else None)
            evidence = (verify.start_evidence(pool, inputs, loaded, kernel.arch, tc.nvcc,
                                              options) if opts.verify else None)
            try:
                cubin = cubin_job.result()
            except LinkError as exc:
                raise unresolved_symbol(kernel, loaded, exc) or exc from None
            ptx = ptx_job.result().decode() if ptx_job is not None else None
            timings["nvjitlink"] = time.perf_counter() - t0
            if evidence is not None:
                t0 = time.perf_counter()
                verify.verify_linked(ptx, kernel, placement, loaded, evidence)
                timings["verify"] = time.perf_counter() - t0
    name = recipe.name
    write_atomic(out_dir / cubin_name(recipe), cubin)
    write_atomic(out_dir / ("mono.cu" if opts.mode == "mono" else "glue.cu"), source)
    if ptx is not None and opts.emit_ptx:
        write_atomic(out_dir / f"{name}.ptx", ptx)
    write_atomic(out_dir / "placement.json", placement.to_json())
    write_atomic(out_dir / "placement.svg", report.svg(kernel.problem, placement))
    meta = kernel_json(kernel, placement, loaded, tc, opts.mode, cubin,
                       phase_clock(kernel, opts))
    write_atomic(out_dir / "kernel.json", json.dumps(meta, sort_keys=True, indent=1) + "\n")
    return LinkResult(out_dir / cubin_name(recipe), out_dir / "kernel.json", placement, kernel,
                      timings)


def link_recipe(recipe: Recipe, objects: dict[str, dict[str, Path]], out_dir: Path | str,
                opts: LinkOptions, *, kernels: list[str] | None = None,
                index: ComponentIndex | None = None, toolchain: Toolchain | None = None,
                stage_root: Path | None = None) -> dict[str, LinkResult]:
    """Links every kernel of a recipe (or those named) for one arch: a single-kernel
    recipe into ``out_dir`` as :func:`link_kernel` does; a multi-kernel one into
    ``out_dir/<kernel>/`` each, with ``out_dir/kernels.json`` indexing them.
    ``objects`` maps kernel -> instance -> object."""
    out_dir = Path(out_dir)
    tc = toolchain or discover()
    results = {}
    for name, kernel in recipe.select(kernels, opts.arch).items():
        results[name] = link_kernel(kernel, objects[name], out_dir / kernel.folder, opts,
                                    index=index, toolchain=tc, stage_root=stage_root)
    if recipe.multi:
        write_atomic(out_dir / "kernels.json", kernels_index(recipe, opts.arch))
    return results
