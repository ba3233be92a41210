"""The library side of PipeLink's SCons tool (``site_scons/site_tools/pipelink``).

The tool stays thin: it asks this module what a recipe needs (:func:`plan`), which
values its outputs depend on beyond their files (:func:`code_digest`,
:func:`compile_versions`, :func:`link_versions`), and runs each step as a separate
process through this module's command line (started by :mod:`pipelink.buildstep`),
so that ``scons -j`` compiles in parallel and a crash in one step cannot take the
build down with it::

    python -m pipelink.buildstep compile components/x/contract.yaml --arch sm_90a \\
        -o build/obj/sm_90a/x-1234abcd.sm_90a.o -p dtype=bf16 -p rows=128
    python -m pipelink.buildstep link recipes/r.yaml --arch sm_90a -o build/dev/sm_90a/r \\
        --object load=build/obj/sm_90a/x-1234abcd.sm_90a.o ... [--mode mono] [--kernel K]

Both are silent on success; a user mistake prints one message and exits 2. Nothing
here imports SCons.
"""

from __future__ import annotations

import argparse
import ast
import functools
import hashlib
import json
import os
import platform
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import buildcache, header  # noqa: F401  (buildcache: the SCons tool's cache checks)
from .build import object_name
from .compile import (
    INCLUDE_DIR,
    CompileOptions,
    _component_files,
    abi_headers,
    cutlass_include,
    nvcc_command,
)
from .contract import BoundContract, Contract, canonical_json, load_contract, sha256_text
from .errors import PipeLinkError, RecipeError, ToolchainError
from .recipe import ComponentIndex, Recipe, load_recipe, resolve_components
from .toolchain import Toolchain, discover

PACKAGE_DIR = Path(__file__).parent
MANIFEST_FORMAT = 1
# Distributions whose versions change what a step writes: nvcc and the host compiler
# write the objects; the placer (OR-Tools) and nvJitLink write the kernel.
COMPILE_DISTRIBUTIONS = ("nvidia-cutlass",)
LINK_DISTRIBUTIONS = ("ortools", "nvidia-nvjitlink", "cuda-bindings")
MANIFEST_DISTRIBUTIONS = ("scons", "pyyaml", "jsonschema", *LINK_DISTRIBUTIONS,
                          *COMPILE_DISTRIBUTIONS)


@dataclass(frozen=True)
class ObjectPlan:
    """One component object: a component, its compile-time params and an arch."""

    bound: BoundContract
    arch: str
    contract_path: Path
    files: tuple[str, ...]          # what the compile stages from the component's folder
    headers: tuple[Path, ...]       # the ABI headers it stages (compile.object_inputs)

    @property
    def component(self) -> str:
        return self.bound.name

    @property
    def params_hash(self) -> str:
        return self.bound.params_hash()

    @property
    def folder(self) -> Path:
        return self.contract_path.parent

    @property
    def source(self) -> Path:
        """The source compiled for this arch (the one scanned for includes)."""
        return self.folder / self.bound.contract.source_for(self.arch)

    @property
    def object_name(self) -> str:
        return object_name(self.component, self.params_hash, self.arch)

    @property
    def header_name(self) -> str:
        return f"pl_{self.component}.h"

    @property
    def header_dir(self) -> str:
        """Folder of the generated header, unique per param set (not per arch)."""
        return f"{self.component}-{self.params_hash}"

    def header_text(self) -> str:
        return header.generate(self.bound)

    def embedded(self) -> str:
        """What the object embeds and is compiled from, besides its files: the contract
        as validated (by hash: it is long), the bound params and the arch."""
        return canonical_json({"component": self.component, "arch": self.arch,
                               "params": self.bound.params,
                               "contract_sha256": sha256_text(canonical_json(
                                   self.bound.contract.data))})

    def param_args(self) -> list[str]:
        """``-p name=value`` for every bound param, so one object has one command line
        whichever recipe asks for it."""
        out = []
        for key, value in sorted(self.bound.params.items()):
            out += ["-p", f"{key}={value}"]
        return out

    @property
    def uses_cutlass(self) -> bool:
        return "cutlass" in self.bound.contract.data.get("includes", [])


@dataclass(frozen=True)
class KernelPlan:
    """A recipe for one arch, checked: its objects and what the link depends on."""

    recipe: Recipe
    arch: str
    objects: dict[str, ObjectPlan]  # instance -> object; instances may share one
    warnings: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.recipe.name

    @property
    def folder(self) -> str:
        """Where the kernel's outputs go under ``<build>/<arch>/``: ``<recipe>``, or
        ``<recipe>/<kernel>`` for a kernel of a multi-kernel recipe."""
        r = self.recipe
        return f"{r.recipe_name}/{r.folder}" if r.folder else r.name

    @property
    def cubin(self) -> str:
        from .link import cubin_name
        return cubin_name(self.recipe)

    def recipe_content(self) -> str:
        """The recipe as data: a comment or key order does not relink."""
        return canonical_json(self.recipe.data)


def object_plan(contract_path: Path | str, params: dict[str, int | str] | None, arch: str,
                *, where: str | None = None, contract: Contract | None = None) -> ObjectPlan:
    contract_path = Path(contract_path)
    contract = contract or load_contract(contract_path)
    bound = contract.bind(params, where=where)
    files = tuple(sorted(_component_files(contract_path.parent)))
    headers = tuple(abi_headers(bound, contract_path.parent, arch))
    return ObjectPlan(bound, arch, contract_path, files, headers)


def plan(recipe_path: Path | str, arch: str, index: ComponentIndex,
         contracts: dict[Path, Contract] | None = None, kernel: str | None = None
         ) -> KernelPlan:
    """Loads, binds and checks a recipe for ``arch`` without compiling anything:
    every recipe mistake (unknown component or arch, bad param, miswired or missing
    port) surfaces here, naming the recipe file and key. ``kernel`` picks one kernel
    of a multi-kernel recipe (see :func:`plans` for all of them)."""
    recipe = load_recipe(recipe_path)
    if recipe.multi and kernel is None:
        raise RecipeError(f"recipe '{recipe.name}' defines several kernels; name one",
                          where=recipe.where("kernels"),
                          hint="its kernels: " + ", ".join(recipe.kernels()))
    view = recipe.select([kernel] if kernel else None, arch)
    return kernel_plan(next(iter(view.values())), arch, index, contracts)


def plans(recipe_path: Path | str, arch: str, index: ComponentIndex,
          contracts: dict[Path, Contract] | None = None) -> list[KernelPlan]:
    """One :class:`KernelPlan` per kernel of a recipe, in recipe order (one for a
    single-kernel recipe); a multi-kernel recipe's autograd and dispatch sections are
    checked too."""
    from .check import check_autograd, check_dispatch
    recipe = load_recipe(recipe_path)
    check_autograd(recipe)
    check_dispatch(recipe)
    contracts = {} if contracts is None else contracts
    return [kernel_plan(view, arch, index, contracts)
            for view in recipe.select(None, arch).values()]


def kernel_plan(recipe: Recipe, arch: str, index: ComponentIndex,
                contracts: dict[Path, Contract] | None = None) -> KernelPlan:
    """Binds and checks one kernel of a recipe for ``arch``."""
    from .check import check
    contracts = {} if contracts is None else contracts
    objects = {}
    for inst, (spec, path) in resolve_components(recipe, arch, index).items():
        if path not in contracts:
            contracts[path] = load_contract(path)
        objects[inst] = object_plan(path, spec.params, arch, contract=contracts[path],
                                    where=recipe.where(f"instances.{inst}"))
    kernel = check(recipe, arch, {inst: o.bound for inst, o in objects.items()})
    require_headers(recipe, objects)
    return KernelPlan(recipe, arch, objects, kernel.warnings)


def kernels_index(recipe_path: Path | str, arch: str) -> str | None:
    """The text of a multi-kernel recipe's ``kernels.json`` (None for one kernel)."""
    from .link import kernels_index as index_text
    recipe = load_recipe(recipe_path)
    return index_text(recipe, arch) if recipe.multi else None


def require_headers(recipe: Recipe, objects: dict[str, ObjectPlan]) -> None:
    """Third-party headers a recipe's components include must be installed before the
    first compile, not discovered missing after ten."""
    users = [inst for inst, o in objects.items() if o.uses_cutlass]
    if not users:
        return
    try:
        cutlass_include()
    except ToolchainError:
        names = ", ".join(f"{i} ({objects[i].component})" for i in users)
        many = len(users) > 1
        raise ToolchainError(f"CUTLASS headers not found, and instance{'s' if many else ''} "
                             f"{names} include{'' if many else 's'} them",
                             where=recipe.where(f"instances.{users[0]}"),
                             hint="pip install -e '.[cutlass]' (nvidia-cutlass, as "
                                  "pyproject.toml pins it)") from None


def recipe_archs(recipe_path: Path | str) -> tuple[str, ...]:
    return load_recipe(recipe_path).archs


def arch_summary(recipe_path: Path | str) -> str:
    """The archs a recipe targets, and the kernels built for fewer of them:
    'sm_90a, sm_100a (backward: sm_90a)'."""
    recipe = load_recipe(recipe_path)
    narrow = [f"{name}: {', '.join(k.archs)}" for name, k in recipe.kernels().items()
              if k.archs != recipe.archs]
    return ", ".join(recipe.archs) + (f" ({'; '.join(narrow)})" if narrow else "")


# -- what outputs depend on besides their files --------------------------------------

def _imports(path: Path) -> set[str]:
    """Names of the pipelink modules a module imports, anywhere in it (lazy imports
    inside functions included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module:
                found.add(node.module.split(".")[0])
            elif node.level == 1:
                found.update(alias.name for alias in node.names)
            elif node.module and node.module.startswith("pipelink."):
                found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names
                         if a.name.startswith("pipelink."))
    return found


def module_closure(roots: tuple[str, ...]) -> list[Path]:
    """The package's modules ``roots`` import, transitively, as files."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        path = PACKAGE_DIR / f"{name}.py"
        if name in seen or not path.is_file():
            continue
        seen.add(name)
        todo += sorted(_imports(path) - seen)
    return [PACKAGE_DIR / f"{n}.py" for n in sorted(seen)]


def package_files() -> list[Path]:
    """Every file of the package that can change an output: modules and ABI headers."""
    return sorted([*PACKAGE_DIR.glob("*.py"), *INCLUDE_DIR.rglob("*.cuh")])


def _digest_files(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for path in sorted(paths):
        h.update(str(path.relative_to(PACKAGE_DIR)).encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


@functools.cache
def code_digest(step: str) -> str:
    """Hash of the package code a step runs. ``compile``: the modules that compile a
    component (its ABI headers are tracked per object by the include scanner, so a
    header change recompiles its includers only); ``link``: the modules that check,
    place, write glue and link, and every ABI header (the glue includes them)."""
    if step == "compile":
        own = [PACKAGE_DIR / "__init__.py", PACKAGE_DIR / "sconsrun.py",
               PACKAGE_DIR / "buildstep.py"]
        return _digest_files(sorted({*module_closure(("compile",)), *own}))
    if step == "link":
        code = module_closure(("link", "sconsrun", "buildstep")) + [PACKAGE_DIR / "__init__.py"]
        return _digest_files(sorted({*code, *INCLUDE_DIR.rglob("*.cuh")}))
    raise ValueError(f"unknown step {step!r}")


@functools.cache
def _distribution(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(name)
    except PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=1)
def host_compiler() -> str:
    """The host compiler nvcc preprocesses with (it defines macros CUDA headers read)."""
    for cc in ("g++", "c++", "clang++"):
        try:
            out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0 and out.stdout:
            return out.stdout.splitlines()[0].strip()
    return "none"


def compile_versions(tc: Toolchain | None = None, cutlass: bool = False) -> dict[str, str]:
    """Versions a component object depends on (SCons tracks the nvcc driver binary only,
    not cicc, ptxas, the CUDA headers or the host compiler)."""
    tc = tc or discover()
    out = {"nvcc": tc.versions()["nvcc"], "host_cxx": host_compiler()}
    if cutlass:
        out["nvidia-cutlass"] = _distribution("nvidia-cutlass") or "none"
    return out


def link_versions(tc: Toolchain | None = None) -> dict[str, str]:
    """Versions a linked kernel depends on: nvcc (the glue), nvJitLink, the placer."""
    tc = tc or discover()
    out = {**tc.versions(), "host_cxx": host_compiler()}
    out.update({d: _distribution(d) or "none" for d in LINK_DISTRIBUTIONS})
    return out


def stage_root() -> str:
    """The stage root: nvcc hashes paths under it into module ids, so objects (and the
    cache that shares them) depend on it; keep it the same on every machine."""
    from .stage import stage_root as root
    return root()


def compile_flags(arch: str) -> list[str]:
    """The nvcc command line of a component, with machine paths replaced by names."""
    cmd = nvcc_command("nvcc", CompileOptions(arch, stage_root="<stage>"), "component/<source>",
                       "<output>", ["<stage>/include", "<stage>/component"])
    return cmd


def default_cache_dir() -> str:
    """``$PIPELINK_CACHE``, else ``$XDG_CACHE_HOME/pipelink/scons``, else
    ``~/.cache/pipelink/scons``."""
    if os.environ.get("PIPELINK_CACHE"):
        return os.environ["PIPELINK_CACHE"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "pipelink", "scons")


# -- release manifest -----------------------------------------------------------------

def manifest(inputs: dict[str, bytes], outputs: dict[str, bytes],
             meta: dict[str, Any]) -> str:
    """The release manifest: sha256 of every input and output (keyed by path relative
    to the checkout, or ``pipelink/...`` for the package), tool versions and flags."""
    doc = {
        "format": MANIFEST_FORMAT,
        **meta,
        "inputs": {k: sha256_text(v) for k, v in sorted(inputs.items())},
        "outputs": {k: sha256_text(v) for k, v in sorted(outputs.items())},
    }
    return json.dumps(doc, sort_keys=True, indent=1) + "\n"


def manifest_meta(kernels: list[KernelPlan], top: Path | None = None) -> dict[str, Any]:
    """What a release was built with, besides its files; ``top`` is the checkout, whose
    git revision the manifest names when it is one."""
    from .link import LinkOptions, nvjitlink_options
    tc = discover()
    archs = sorted({k.arch for k in kernels})
    tools = {**link_versions(tc), "python": platform.python_version(),
             "pipelink_code": code_digest("link")}
    tools.update({d: _distribution(d) or "none" for d in MANIFEST_DISTRIBUTIONS})
    source = source_revision(top) if top is not None else None
    return {
        **({"source": source} if source else {}),
        "kernels": sorted(f"{k.arch}/{k.folder}" for k in kernels),
        "toolchain": tools,
        "flags": {"stage_root": stage_root(),
                  "compile": {a: compile_flags(a) for a in archs},
                  "nvjitlink": {a: nvjitlink_options(LinkOptions(a)) for a in archs}},
    }


def build_files(top: Path) -> dict[str, Path]:
    """The build's own files, which a release depends on as much as on its sources:
    SConstruct, the SCons tool and pyproject.toml (the pinned tools), by checkout path."""
    paths = [top / "SConstruct", top / "pyproject.toml",
             *sorted((top / "site_scons").rglob("*.py"))]
    return {p.relative_to(top).as_posix(): p for p in paths if p.is_file()}


def _git(top: Path, *args: str) -> str | None:
    try:
        proc = subprocess.run(["git", "-C", str(top), *args], capture_output=True, text=True,
                              timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def source_revision(top: Path) -> dict[str, Any] | None:
    """``{"git": <commit>, "dirty": <tracked files differ from it>}`` when ``top`` is the
    top of a git checkout with a commit; None otherwise (an unpacked tarball, or a
    folder inside someone else's repository)."""
    root = _git(top, "rev-parse", "--show-toplevel")
    if not root or Path(root).resolve() != Path(top).resolve():
        return None
    head = _git(top, "rev-parse", "--verify", "HEAD")
    status = _git(top, "status", "--porcelain", "--untracked-files=no")
    if not head or status is None:
        return None
    return {"git": head, "dirty": bool(status)}


def package_labels() -> dict[str, Path]:
    """The package's files under the names a manifest gives them."""
    return {f"pipelink/{p.relative_to(PACKAGE_DIR)}": p for p in package_files()}


# -- the steps, as a command line -------------------------------------------------------

def _params(pairs: list[str]) -> dict[str, int | str]:
    out: dict[str, int | str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise RecipeError(f"param {pair!r} is not name=value")
        out[key] = int(value) if value.lstrip("-").isdigit() else value
    return out


def cmd_compile(a: argparse.Namespace) -> int:
    from .compile import compile_component
    compile_component(a.contract, _params(a.param), CompileOptions(a.arch), a.output)
    return 0


def cmd_link(a: argparse.Namespace) -> int:
    from .link import LinkOptions, link_kernel
    objects = {}
    for pair in a.object:
        inst, sep, path = pair.partition("=")
        if not sep:
            raise RecipeError(f"--object {pair!r} is not instance=path")
        objects[inst] = Path(path)
    recipe = load_recipe(a.recipe)
    if recipe.multi and not a.kernel:
        raise RecipeError(f"recipe '{recipe.name}' defines several kernels; link one at a time",
                          where=recipe.where("kernels"), hint="pass --kernel NAME")
    if a.kernel:
        recipe = recipe.select([a.kernel], a.arch)[a.kernel]
    index = ComponentIndex(tuple(Path(p) for p in a.components.split(os.pathsep)))
    result = link_kernel(recipe, objects, a.output, LinkOptions(a.arch, mode=a.mode),
                         index=index)
    if a.timings:
        print(json.dumps({k: round(v, 6) for k, v in result.timings.items()}))
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pipelink.buildstep",
                                description="build steps the SCons tool runs")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compile", help="compile one component into a PipeLink object")
    c.add_argument("contract")
    c.add_argument("--arch", required=True)
    c.add_argument("-o", "--output", required=True)
    c.add_argument("-p", "--param", action="append", default=[], help="name=value")
    c.set_defaults(func=cmd_compile)
    k = sub.add_parser("link", help="link a recipe's objects into a kernel")
    k.add_argument("recipe")
    k.add_argument("--arch", required=True)
    k.add_argument("-o", "--output", required=True, help="output folder")
    k.add_argument("--object", action="append", default=[], help="instance=object path")
    k.add_argument("--mode", choices=["linked", "mono"], default="linked")
    k.add_argument("--components", default="components",
                   help="component folders (os.pathsep-separated), for --mode mono")
    k.add_argument("--timings", action="store_true", help="print the step timings as JSON")
    k.add_argument("--kernel", help="the kernel to link, for a multi-kernel recipe")
    k.set_defaults(func=cmd_link)
    return p


def _exit_on_sigterm() -> None:
    """SIGTERM (a CI timeout, a killed scons) unwinds like Ctrl-C: ``finally`` blocks
    remove temporary files and nothing half-written is left."""
    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, stop)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    _exit_on_sigterm()
    try:
        return args.func(args)
    except PipeLinkError as exc:
        print(f"pipelink: {exc.kind}: {exc.render()}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C reaches every step scons runs: one line, no trace
        print("pipelink: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
