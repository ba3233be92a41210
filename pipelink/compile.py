"""Compiling one component into a PipeLink object.

Before nvcc runs, the component's folder, its generated ABI header and PipeLink's
device headers are copied into a *stage*: a folder named by the hash of everything
in it, under one fixed root (``$PIPELINK_STAGE``, else ``/tmp/pipelink-stage-<uid>``;
:mod:`pipelink.stage` checks a stage's content before each use). nvcc
hashes the real path of a source and of its headers into the LTO-IR's module id, so
compiling from a content-addressed path makes the object depend on content alone:
two checkouts in two folders produce the same bytes, and a shared cache can hand
them out.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from . import header
from .contract import BoundContract, load_contract
from .errors import ContractError, ToolchainError
from .objfile import ComponentObject, pack, unpack, write_atomic
from .stage import digest, include_closure, materialise, stage_root, stage_tree, temp_dir
from .toolchain import Toolchain, discover

INCLUDE_DIR = Path(__file__).parent / "include"
# -I folders of a component's compile, inside its stage: ABI headers, then its folder.
STAGE_INCLUDES = ("include", "component")
SOURCE_SUFFIXES = {".cu", ".cuh", ".h", ".hpp", ".inl"}


@dataclass(frozen=True)
class CompileOptions:
    arch: str
    opt_level: str = "-O3"                   # nvcc -O
    std: str = "c++17"                       # nvcc -std
    extra: tuple[str, ...] = field(default_factory=tuple)   # appended verbatim
    stage_root: str = field(default_factory=stage_root)

    def gencode(self, code: str = "lto") -> str:
        """-gencode for LTO-IR of the arch (sm_90a -> arch=compute_90a,code=lto_90a), or
        with code="sm" for its SASS."""
        num = self.arch.removeprefix("sm_")
        return f"-gencode=arch=compute_{num},code={code}_{num}"


def nvcc_command(nvcc: str, opts: CompileOptions, source: str, output: str,
                 includes: list[str], cubin: bool = False) -> list[str]:
    """The one nvcc command line for a component (a pure function, testable alone);
    ``cubin``: the whole program to SASS instead (the monolithic yardstick), with the
    same flags otherwise."""
    target = ["-cubin", opts.gencode("sm")] if cubin else ["-rdc=true", "-ltoir",
                                                           opts.gencode()]
    cmd = [nvcc, f"-std={opts.std}", opts.opt_level, *target,
           "--expt-relaxed-constexpr", "-Xcudafe", "--diag_suppress=177"]
    cmd += [f"-I{inc}" for inc in includes]
    return cmd + [*opts.extra, "-o", output, source]


def _component_files(folder: Path) -> dict[str, bytes]:
    files = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.suffix in SOURCE_SUFFIXES and not path.name.startswith("pl_"):
            files[str(path.relative_to(folder))] = path.read_bytes()
    return files


def cutlass_include() -> Path:
    """CUTLASS/CuTe headers from the nvidia-cutlass wheel, which installs them as data of
    its ``cutlass_library`` package: ``<site-packages>/cutlass_library/source/include``
    (holding ``cute/`` and ``cutlass/``). Found without importing the package."""
    from importlib.util import find_spec
    try:
        spec = find_spec("cutlass_library")
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec else []
    for base in map(Path, locations):
        candidate = base / "source" / "include"
        if (candidate / "cute").is_dir() and (candidate / "cutlass").is_dir():
            return candidate
    raise ToolchainError("CUTLASS headers not found",
                         hint="pip install nvidia-cutlass==4.2.0.0 (the component lists "
                              "includes: [cutlass])")


def object_inputs(bound: BoundContract, folder: Path, arch: str) -> dict[str, bytes]:
    """Everything a component's compile reads besides CUDA and CUTLASS, under its staged
    name: the component's folder, its generated header and the ABI headers they include.
    The one definition of an object's inputs: the stage is made of it, and the SCons
    tool depends on exactly these files (:func:`abi_headers`)."""
    files = _component_files(folder)
    source = bound.contract.source_for(arch)
    if source not in files:
        path = Path(source)
        if path.is_absolute() or ".." in path.parts:   # the stage holds this folder alone
            raise ContractError(f"source '{source}' for {arch} lies outside {folder}",
                                where=bound.contract.where("source"),
                                hint="a component compiles from its own folder: put the "
                                     "file there and name it relative to the folder")
        raise ContractError(f"source '{source}' for {arch} not found in {folder}",
                            where=bound.contract.where("source"),
                            hint="set source: (or sources: {arch: file}) in the contract")
    staged = {f"component/{k}": v for k, v in files.items()}
    staged[f"component/pl_{bound.name}.h"] = header.generate(bound).encode()
    abi = {f"include/{p.relative_to(INCLUDE_DIR)}": p.read_bytes()
           for p in sorted(INCLUDE_DIR.rglob("*.cuh"))}
    reached = include_closure({**staged, **abi}, staged, STAGE_INCLUDES)
    staged.update({k: v for k, v in abi.items() if k in reached})
    return staged


def abi_headers(bound: BoundContract, folder: Path, arch: str) -> list[Path]:
    """The ABI headers (``pipelink/include``) a component's compile reads."""
    return [INCLUDE_DIR / name.removeprefix("include/")
            for name in sorted(object_inputs(bound, folder, arch))
            if name.startswith("include/")]


def stage_sources(bound: BoundContract, folder: Path, arch: str,
                  stage_root: Path) -> tuple[Path, list[str], str]:
    """Stages a component; returns (stage dir, include dirs, sha256 of what it staged:
    the object records it, and :mod:`pipelink.build` compares it with today's inputs)."""
    staged = object_inputs(bound, folder, arch)
    source_sha = digest(staged)
    stage = materialise(stage_root, staged)
    includes = [str(stage / d) for d in STAGE_INCLUDES]
    if "cutlass" in bound.contract.data.get("includes", []):
        includes.append(str(stage_tree(cutlass_include(), stage_root,
                                       f"cutlass-{cutlass_version()}")))
    return stage, includes, source_sha


def cutlass_version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("nvidia-cutlass")
    except PackageNotFoundError:
        return "unknown"


def compile_component(contract_path: Path | str, params: dict[str, int | str] | None,
                      opts: CompileOptions, output: Path | str,
                      toolchain: Toolchain | None = None) -> ComponentObject:
    """Builds ``output`` (a PipeLink object) from a component's contract and source."""
    contract_path = Path(contract_path)
    bound = load_contract(contract_path).bind(params)
    if opts.arch not in bound.contract.archs:
        raise ContractError(f"component '{bound.name}' does not support {opts.arch}",
                            where=bound.contract.where("arch"),
                            hint="its arch list: " + ", ".join(bound.contract.archs))
    tc = toolchain or discover()
    tc.require_arch(opts.arch)
    stage, includes, source_sha = stage_sources(bound, contract_path.parent, opts.arch,
                                                Path(opts.stage_root))
    ltoir = run_nvcc(tc, opts, stage, bound.contract.source_for(opts.arch), includes,
                     bound.name)
    data = pack(bound, opts.arch, ltoir, source_sha256=source_sha, toolchain=tc.versions())
    write_atomic(output, data)
    return unpack(data, str(output))


def run_nvcc(tc: Toolchain, opts: CompileOptions, stage: Path, source: str,
             includes: list[str], component: str) -> bytes:
    with temp_dir(stage.parent, ".out-") as out_dir:
        out = out_dir / "component.ltoir"
        cmd = nvcc_command(tc.nvcc, opts, f"component/{source}", str(out), includes)
        proc = subprocess.run(cmd, cwd=stage, capture_output=True, text=True)
        if proc.returncode != 0:
            raise ToolchainError(f"nvcc failed compiling component '{component}' for "
                                 f"{opts.arch}", where=source,
                                 log=proc.stdout + proc.stderr)
        return out.read_bytes()


def inputs_hash(bound: BoundContract, folder: Path, arch: str) -> str:
    """The hash an object records of what its compile read (``source_sha256``)."""
    return digest(object_inputs(bound, folder, arch))


# The glue and mono compiles (link.py) stage through the same function.
_materialise = materialise
