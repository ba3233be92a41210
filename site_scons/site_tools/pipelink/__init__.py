"""SCons tool for PipeLink: component objects and linked kernels from YAML recipes.

Entry point, as the project's SConstruct uses it::

    env = Environment(tools=["install", "pipelink"])
    env.PipeLinkCache("on")                          # "off", or "readonly" for CI
    cubin = env.PipeLinkKernel("recipes/gemm.yaml", "sm_90a", mode="linked", variant="dev")
    kernels = env.PipeLinkKernels("recipes/linear.yaml", "sm_90a")  # one list per kernel
    env.PipeLinkRelease(kernels, "dist")             # install + manifest.json
    env.PipeLinkSummary(kernels)                     # one summary line per kernel at exit

Builders, each with an emitter and a ``*COMSTR``:

- ``PipeLinkObject(obj, contract.yaml, PL_ARCH=..., PL_PARAMS={...})``: one component
  for one arch and param set. The emitter adds the arch's source, every file the
  compile stages (the component's folder and the ABI headers its files include, as
  :func:`pipelink.compile.object_inputs` defines them), the generated placement
  header, the embedded contract and params (a Value), and the tool versions and
  package code the compile depends on (Values: SCons sees neither cicc nor a change
  inside an imported module). A command action runs ``python -m
  pipelink.buildstep compile``: compiles run in parallel under ``-j``, and VERBOSE=1 shows
  a command one can rerun by hand.
- ``PipeLinkHeader``: the generated header, for editors (the compile stages its own
  copy, made by the same function).
- ``PipeLinkLink(<dir>/<recipe>.cubin, recipe.yaml, PL_ARCH=..., PL_MODE=...)``: check ->
  place -> glue -> compile glue -> nvJitLink in one subprocess. The emitter plans the
  recipe (every recipe error surfaces here, before anything compiles), declares its
  objects, replaces the recipe file by its content (a Value) and adds kernel.json,
  placement.json, placement.svg and the glue source as targets.
- ``PipeLinkIndex``: ``kernels.json`` of a multi-kernel recipe (its kernels' folders and
  autograd section), written from a Value.
- ``PipeLinkManifest``: the release manifest (sha256 of inputs and outputs, versions,
  flags).

Variables (read with ``env.get`` defaults; set them in ``Environment(...)``):
PIPELINK_PYTHON, PIPELINK_BUILD, PIPELINK_OBJDIR, PIPELINK_INCDIR, PIPELINK_COMPONENTS,
PIPELINK_OBJCOMSTR, PIPELINK_HEADERCOMSTR, PIPELINK_LINKCOMSTR, PIPELINK_INDEXCOMSTR,
PIPELINK_MANIFESTCOMSTR.
All logic lives in :mod:`pipelink.sconsrun`; this module only wires nodes.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import SCons.Action
import SCons.Builder
import SCons.CacheDir
import SCons.Errors
import SCons.exitfuncs
import SCons.Node
import SCons.Platform.posix
import SCons.Script
from SCons.Environment import Base as Env
from SCons.Node import Node

# Environment variables the build steps see: the toolchain lookup (PATH, CUDA_HOME), the
# host compiler nvcc calls and where temporary files go; nothing else leaks in.
PASS_ENV = ("PATH", "HOME", "TMPDIR", "CUDA_HOME", "LD_LIBRARY_PATH")
_registered: set[Callable[[], None]] = set()  # exit handlers, once per process


def _library() -> ModuleType:
    """Imports :mod:`pipelink.sconsrun`. SCons registers this tool as ``pipelink``, the
    library's own name, with the tool folder first on sys.path: hand the name back
    before importing (this module object keeps working under no name)."""
    here = os.path.dirname(os.path.abspath(__file__))
    if getattr(sys.modules.get("pipelink"), "__file__", None) == __file__:
        del sys.modules["pipelink"]
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path
                   if os.path.abspath(p or os.curdir) != os.path.dirname(here)]
    try:
        return importlib.import_module("pipelink.sconsrun")
    finally:
        sys.path[:] = saved


lib = _library()
buildcache = lib.buildcache
from pipelink.contract import canonical_json  # noqa: E402
from pipelink.objfile import write_atomic  # noqa: E402
from pipelink.recipe import ComponentIndex  # noqa: E402


def _node_plan(target: list[Node]) -> Any:
    return target[0].attributes.pipelink


# -- emitters ----------------------------------------------------------------------------

def _value(env: Env, data: Any) -> Node:
    return env.Value(data if isinstance(data, str) else canonical_json(data))


def _declare_once(node: Node, declare: Callable[[], Any]) -> Node:
    """Two recipes (or two archs) may ask for one object or header: declare it once."""
    if not node.has_builder():
        declare()
    return node


def _object_emitter(target: list[Node], source: list[Node], env: Env) -> tuple[list, list]:
    contract = source[0]
    plan = env.get("PL_OBJECT_PLAN") or lib.object_plan(
        contract.srcnode().abspath, env.get("PL_PARAMS", {}), env.subst("$PL_ARCH"))
    header = env.File(f"$PIPELINK_INCDIR/{plan.header_dir}/{plan.header_name}")
    _declare_once(header, lambda: env.NoCache(  # cheaper to write than to fetch
        env.PipeLinkHeader(header, _value(env, plan.header_text()))))
    folder = contract.dir
    obj = target[0]
    obj.attributes.pipelink = plan
    versions = lib.compile_versions(cutlass=plan.uses_cutlass)
    sources = [contract, folder.File(str(plan.source.relative_to(plan.folder))), header,
               _value(env, plan.embedded()), _value(env, {"versions": versions}),
               _value(env, {"code": lib.code_digest("compile")}),
               _value(env, {"stage_root": lib.stage_root(),
                            "flags": lib.compile_flags(plan.arch)})]
    # What the compile stages, as the library defines it (compile.object_inputs): the
    # whole folder (the object records its hash) and the ABI headers it includes.
    env.Depends(obj, [folder.File(f) for f in plan.files] +
                [env.File(str(h)) for h in plan.headers])
    return target, sources


def _link_outputs(plan: Any, mode: str) -> list[str]:
    glue = "mono.cu" if mode == "mono" else "glue.cu"
    return [plan.cubin, "kernel.json", "placement.json", "placement.svg", glue]


def _link_emitter(target: list[Node], source: list[Node], env: Env) -> tuple[list, list]:
    mode = env.subst("$PL_MODE") or "linked"
    plan = env.get("PL_KERNEL") or lib.plan(source[0].srcnode().abspath,
                                            env.subst("$PL_ARCH"), _index(env))
    out = target[0].dir
    targets = [out.File(name) for name in _link_outputs(plan, mode)]
    objects = {}
    for inst, o in plan.objects.items():
        node = env.File(f"$PIPELINK_OBJDIR/{o.arch}/{o.object_name}")
        objects[inst] = _declare_once(node, lambda n=node, o=o: env.PipeLinkObject(
            n, o.contract_path.as_posix(), PL_OBJECT_PLAN=o))
    targets[0].attributes.pipelink = plan
    targets[0].attributes.pipelink_objects = objects
    targets[0].attributes.pipelink_recipe = source[0]
    sources = list(dict.fromkeys(objects.values()))
    sources += [_value(env, plan.recipe_content()),
                _value(env, {"versions": lib.link_versions()}),
                _value(env, {"code": lib.code_digest("link")}),
                _value(env, {"stage_root": lib.stage_root(), "mode": mode})]
    if mode == "mono":  # one translation unit: it reads every component's files
        for o in plan.objects.values():
            env.Depends(targets, [env.File(str(o.folder / f)) for f in o.files])
    return targets, sources


# -- command-line pieces (callables: SCons calls them with target, source, env) ------------

def _object_args(target: list[Node], source: list[Node], env: Env, for_signature: bool
                 ) -> list[str]:
    plan = _node_plan(target)
    return ["--arch", plan.arch, *plan.param_args()]


def _object_label(target: list[Node], source: list[Node], env: Env, for_signature: bool
                  ) -> str:
    plan = _node_plan(target)
    params = " ".join(f"{k}={v}" for k, v in sorted(plan.bound.params.items()))
    return f"{plan.component} [{params}] {plan.arch}" if params else \
        f"{plan.component} {plan.arch}"


def _link_args(target: list[Node], source: list[Node], env: Env, for_signature: bool
               ) -> list[str]:
    t = target[0]
    args = [str(t.attributes.pipelink_recipe), "--arch", t.attributes.pipelink.arch,
            "-o", str(t.dir), "--mode", env.subst("$PL_MODE") or "linked",
            "--components", os.pathsep.join(_relative(env, r) for r in _index(env).roots)]
    if t.attributes.pipelink.recipe.folder:  # a kernel of a multi-kernel recipe
        args += ["--kernel", t.attributes.pipelink.recipe.kernel]
    for inst, node in t.attributes.pipelink_objects.items():
        args += ["--object", f"{inst}={node}"]
    return args


def _link_label(target: list[Node], source: list[Node], env: Env, for_signature: bool
                ) -> str:
    plan = _node_plan(target)
    return f"{plan.name} {plan.arch} ({env.subst('$PL_MODE') or 'linked'}) -> {target[0].dir}"


def _relative(env: Env, path: Any) -> str:
    """A path as the command line shows it: relative to the top folder when inside it,
    so command lines (and the cache keys made from them) do not name a checkout."""
    top = env.Dir("#").abspath
    path = os.path.abspath(str(path))
    return os.path.relpath(path, top) if path.startswith(top + os.sep) else path


def _index(env: Env) -> ComponentIndex:
    roots = env.get("PIPELINK_COMPONENTS") or [env.Dir("#components").abspath]
    return ComponentIndex(tuple(Path(env.Dir(r).abspath) for r in roots))


# -- function actions (small, in-process; their code is a dependency via code_digest) ------

def _write_header(target: list[Node], source: list[Node], env: Env) -> int:
    write_atomic(target[0].abspath, source[0].read())
    return 0


def _write_manifest(target: list[Node], source: list[Node], env: Env) -> int:
    labels = json.loads(source[0].read())
    files = source[1:]
    n_in = len(labels["inputs"])
    inputs = {label: node.get_contents() for label, node in zip(labels["inputs"], files[:n_in],
                                                                  strict=True)}
    outputs = {label: node.get_contents() for label, node in zip(labels["outputs"],
                                                                   files[n_in:], strict=True)}
    write_atomic(target[0].abspath, lib.manifest(inputs, outputs, labels["meta"]))
    return 0


# -- methods ------------------------------------------------------------------------------

def PipeLinkKernel(env: Env, recipe: Any, arch: str, mode: str = "linked",  # noqa: N802
                   variant: str = "dev") -> list[Node]:
    """Declares one recipe for one arch: its objects and the link into
    ``$PIPELINK_BUILD/<variant>/<arch>/<recipe>/``. Returns the link's targets (the cubin
    first). Raises :class:`pipelink.errors.PipeLinkError` on any recipe mistake, before
    anything is built."""
    recipe = env.File(recipe)
    plan = lib.plan(recipe.srcnode().abspath, arch, _index(env))
    return _declare_link(env, recipe, plan, mode, variant)


def _declare_link(env: Env, recipe: Node, plan: Any, mode: str, variant: str) -> list[Node]:
    out = env.Dir(f"$PIPELINK_BUILD/{variant}/{plan.arch}/{plan.folder}")
    return env.PipeLinkLink(out.File(plan.cubin), recipe, PL_KERNEL=plan,
                            PL_ARCH=plan.arch, PL_MODE=mode)


def PipeLinkKernels(env: Env, recipe: Any, arch: str, mode: str = "linked",  # noqa: N802
                    variant: str = "dev") -> list[list[Node]]:
    """Declares every kernel of a recipe for one arch, one :meth:`PipeLinkKernel`-like
    target list each (a single-kernel recipe gives one). A multi-kernel recipe's
    kernels go to ``<recipe>/<kernel>/`` and its ``kernels.json`` to ``<recipe>/``; the
    index node rides at the end of the first kernel's list (the release installs it
    beside the kernel folders)."""
    recipe = env.File(recipe)
    path = recipe.srcnode().abspath
    kernels = [_declare_link(env, recipe, p, mode, variant)
               for p in lib.plans(path, arch, _index(env))]
    text = lib.kernels_index(path, arch)
    if text is not None:
        name = kernels[0][0].attributes.pipelink.recipe.recipe_name
        node = env.File(f"$PIPELINK_BUILD/{variant}/{arch}/{name}/kernels.json")
        env.PipeLinkIndex(node, _value(env, text))
        for k in kernels:
            k[0].attributes.pipelink_index = node
        kernels[0] = [*kernels[0], node]
    return kernels


def PipeLinkRelease(env: Env, kernels: list[list[Node]], dist: Any) -> list[Node]:  # noqa: N802
    """Installs each kernel's outputs into ``<dist>/<arch>/<recipe>/`` and writes
    ``<dist>/manifest.json``. Returns the manifest node."""
    dist = env.Dir(dist)
    outputs, inputs = {}, {}
    plans = []
    for k in kernels:
        plan = k[0].attributes.pipelink
        plans.append(plan)
        where = dist.Dir(f"{plan.arch}/{plan.folder}")
        index = getattr(k[0].attributes, "pipelink_index", None)
        for node in env.Install(where, [n for n in k if n is not index]):
            outputs[node.get_path(dist)] = node
        if index is not None and index in k:  # once, beside the kernel folders
            for node in env.Install(where.up(), index):
                outputs[node.get_path(dist)] = node
        inputs[_relative(env, k[0].attributes.pipelink_recipe.abspath)] = \
            k[0].attributes.pipelink_recipe
        for o in plan.objects.values():
            for f in ["contract.yaml", *o.files]:
                path = o.folder / f
                inputs[_relative(env, path)] = env.File(str(path))
    top = Path(env.Dir("#").abspath)
    for label, path in {**lib.package_labels(), **lib.build_files(top)}.items():
        inputs[label] = env.File(str(path))
    labels = {"inputs": sorted(inputs), "outputs": sorted(outputs),
              "meta": lib.manifest_meta(plans, top=top)}
    sources = [_value(env, labels)] + [inputs[k] for k in labels["inputs"]] + \
              [outputs[k] for k in labels["outputs"]]
    manifest = env.PipeLinkManifest(dist.File("manifest.json"), sources)
    env.Depends(manifest, _value(env, {"code": lib.code_digest("link")}))
    return manifest


class PipeLinkCacheDir(SCons.CacheDir.CacheDir):
    """SCons's cache, checked (:mod:`pipelink.buildcache`): each entry against the hash
    recorded when it was pushed and against what the file says of itself. A bad entry
    is discarded and its target rebuilt, then pushed in its place. Remembers which
    nodes it handed out (for the summary)."""

    def retrieve(self, node: Node) -> bool:
        if not self.is_enabled() or _inputs_pending(node):
            return False
        _, entry = self.cachepath(node)
        if entry and os.path.exists(entry):
            problem = buildcache.entry_problem(entry, node.name) or \
                self._sibling_problem(node, entry)
            if problem:
                self._refuse(node, entry, problem)
                return False
        if not super().retrieve(node):
            return False
        if SCons.Action.execute_actions and not os.path.islink(entry):
            # The copy, too: what this build uses is what was checked.
            if buildcache.file_sha256(node.get_abspath()) != buildcache.recorded(entry):
                os.unlink(node.get_abspath())
                self._refuse(node, entry, "the copy differs from its recorded hash")
                return False
        node.attributes.pipelink_from_cache = True
        return True

    def push(self, node: Node) -> Any:
        if self.is_readonly() or not self.is_enabled():
            return None
        _, entry = self.cachepath(node)
        if os.path.exists(entry):
            if buildcache.entry_problem(entry, node.name) is None:
                return None
            buildcache.discard(entry)  # SCons never replaces an entry that exists
        path = node.get_abspath()
        problem = buildcache.content_problem(node.name, Path(path).read_bytes())
        if problem:
            print(f"pipelink: warning: {node}: not cached ({problem})", file=sys.stderr)
            return None
        buildcache.record(entry, buildcache.file_sha256(path))
        return super().push(node)

    def _sibling_problem(self, node: Node, entry: str) -> str | None:
        """A cubin against the kernel.json cached with it (when that one is sound)."""
        if not node.name.endswith(".cubin") or node.get_executor() is None:
            return None
        for t in node.get_executor().get_all_targets():
            if t.name == "kernel.json":
                _, meta = self.cachepath(t)
                if meta and os.path.exists(meta) and \
                        buildcache.entry_problem(meta, t.name) is None:
                    return buildcache.cubin_problem(Path(entry).read_bytes(),
                                                    Path(meta).read_bytes())
        return None

    def _refuse(self, node: Node, entry: str, problem: str) -> None:
        if self.is_readonly():
            action = "not used (the cache is read-only here)"
        else:
            buildcache.discard(entry)
            action = "discarded"
        print(f"pipelink: warning: cache entry for {node}: {problem}; {action}, rebuilding",
              file=sys.stderr)


class ReadOnlyCacheDir(PipeLinkCacheDir):
    """A cache this build takes from and never adds to (``cache=readonly``)."""

    def is_readonly(self) -> bool:
        return True


def PipeLinkCache(env: Env, setting: str = "on",  # noqa: N802
                  path: str | None = None) -> str | None:
    """``on``: share objects and kernels through ``path`` (default: $PIPELINK_CACHE, else
    the user's cache folder); ``readonly``: take from it, never write; ``off``. A cache
    that cannot be created is reported and the build goes on without it."""
    if setting == "off":
        return None
    path = path or lib.default_cache_dir()
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        env.CacheDir(path, custom_class=ReadOnlyCacheDir if setting == "readonly"
                     else PipeLinkCacheDir)
    except (OSError, SCons.Errors.SConsEnvironmentError) as exc:
        print(f"pipelink: warning: no build cache ({exc}); set PIPELINK_CACHE or cache=off",
              file=sys.stderr)
        env.CacheDir(None)
        return None
    return path


def _state(node: Node) -> str:
    if getattr(node.attributes, "pipelink_from_cache", False):
        return "cached"
    state = node.get_state()
    if state == SCons.Node.executed:
        return "built"
    if state == SCons.Node.up_to_date:
        return "current"
    return "skipped"


def summary_lines(kernels: list[list[Node]]) -> list[str]:
    """What the last build did, for the user: compiled, taken from cache or already
    current, per kernel, and where its outputs are."""
    objects, lines = {}, []
    for k in kernels:
        cubin = k[0]
        for node in cubin.attributes.pipelink_objects.values():
            objects[node] = _state(node)
        plan, state = cubin.attributes.pipelink, _state(cubin)
        verb = {"built": "linked", "cached": "from cache", "current": "up to date"}.get(
            state, "not built")
        lines.append(f"  {plan.folder:<20} {plan.arch:<8} {verb:<11} {cubin.dir}/")
    counts = {s: sum(1 for v in objects.values() if v == s)
              for s in ("built", "cached", "current")}
    head = (f"pipelink: {len(objects)} objects ({counts['built']} compiled, "
            f"{counts['cached']} from cache, {counts['current']} up to date), "
            f"{len(kernels)} kernel{'s' if len(kernels) != 1 else ''}:")
    return [head, *lines]


def PipeLinkSummary(env: Env, kernels: list[list[Node]],  # noqa: N802
                    extra: tuple[str, ...] | list[str] = ()) -> None:
    """Prints :func:`summary_lines` when a successful build exits."""
    def report() -> None:
        if SCons.Script.GetBuildFailures() or SCons.Script.GetOption("clean") \
                or SCons.Script.GetOption("no_exec"):
            return
        print("\n".join([*summary_lines(kernels), *extra]))
    atexit.register(report)


def _inputs_pending(node: Node) -> bool:
    """Under ``scons -n``, a target whose inputs would be rebuilt first: its cache entry
    is keyed by their old content, so "retrieved" would be a guess."""
    return not SCons.Action.execute_actions and any(
        c.is_derived() and c.get_state() == SCons.Node.executed for c in node.children())


def _dry_run_decider(dependency: Node, target: Node, prev_ni: Any,
                     repo_node: Node | None = None) -> bool:
    """``scons -n`` builds nothing, so an object it would recompile keeps its old content
    and SCons would call the link up to date; a dependency it would rebuild counts as
    changed instead, and the dry run lists the relinks a real build runs."""
    if dependency.is_derived() and dependency.get_state() == SCons.Node.executed:
        return True
    return dependency.changed_content(target, prev_ni, repo_node)


def _exit_130_if_interrupted() -> None:
    """Ctrl-C ends the build with 130, as an interrupted command does in a shell (SCons
    itself says 2, the status of a failed build). Runs at exit, after SCons has written
    its .sconsign and printed "Build interrupted."; runs SCons's own exit functions
    (temporary files of long command lines) before leaving, since os._exit skips them."""
    if any(f.errstr == "Build interrupted." for f in SCons.Script.GetBuildFailures()):
        sys.stdout.flush()
        sys.stderr.flush()
        SCons.exitfuncs._run_exitfuncs()
        os._exit(130)


STEP_MODULE = "pipelink.buildstep"


def _unescaped(arg: str) -> str:
    """An argument as it was before SCons's POSIX ``escape``, which quotes an argument
    holding a blank and backslash-escapes its ``\\``, ``"`` and ``$``."""
    if len(arg) >= 2 and arg[0] == arg[-1] == '"':
        return re.sub(r"\\(.)", r"\1", arg[1:-1], flags=re.DOTALL)
    return arg


def _spawn_with_sigint_held(spawn: Callable[..., int]) -> Callable[..., int]:
    """SCons's spawn, with each pipelink step started with SIGINT blocked (a child
    inherits its thread's signal mask across fork and exec): a Ctrl-C that lands while
    the step's interpreter starts stays pending until pipelink.buildstep unblocks it and
    ends the step with one line, instead of CPython dying mid-start with "Fatal Python
    error" and a traceback.

    A step runs without SCons's ``sh -c``: dash, Debian's /bin/sh, clears the signal
    mask as it starts. Any other command goes through ``spawn`` as before. The mask is
    this thread's only, for the step's run: SCons's own SIGINT handler runs in the main
    thread, which a -j job thread leaves unblocked, and under -j1 it runs as soon as
    the (interrupted) step returns."""
    def held(sh: str, escape: Callable[[str], str], cmd: str, args: list[str],
             env: dict[str, str]) -> int:
        argv = [_unescaped(a) for a in args]
        step = argv[1:3] == ["-m", STEP_MODULE] and escape is SCons.Platform.posix.escape
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            if not step:
                return spawn(sh, escape, cmd, args, env)
            try:
                status = subprocess.Popen(argv, env=env, close_fds=True).wait()
            except OSError as exc:   # as sh would say it: one line, status 127
                print(f"pipelink: cannot run {argv[0]}: {exc.strerror}", file=sys.stderr)
                return 127
            return 128 - status if status < 0 else status   # as sh reports a signal
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
    held.pipelink_held = True   # once per environment, however often the tool loads
    return held


# -- the tool -------------------------------------------------------------------------------

def generate(env: Env) -> None:
    env.SetDefault(
        PIPELINK_PYTHON=sys.executable,
        PIPELINK_BUILD="#build",
        PIPELINK_OBJDIR="$PIPELINK_BUILD/obj",
        PIPELINK_INCDIR="$PIPELINK_BUILD/include",
        PIPELINK_OBJCOM="$( $PIPELINK_PYTHON $) -m pipelink.buildstep compile $SOURCE "
                        "-o $TARGET $_PIPELINK_OBJECT_ARGS",
        PIPELINK_LINKCOM="$( $PIPELINK_PYTHON $) -m pipelink.buildstep link "
                         "$_PIPELINK_LINK_ARGS",
        _PIPELINK_OBJECT_ARGS=_object_args,
        _PIPELINK_LINK_ARGS=_link_args,
        _PIPELINK_OBJECT_LABEL=_object_label,
        _PIPELINK_LINK_LABEL=_link_label,
        # In-process writers have no command line to show: one line, always.
        PIPELINK_HEADERCOMSTR="header   $TARGET",
        PIPELINK_INDEXCOMSTR="index    $TARGET",
        PIPELINK_MANIFESTCOMSTR="manifest $TARGET",
    )
    if not env.get("VERBOSE"):
        env.SetDefault(
            PIPELINK_OBJCOMSTR="compile  $_PIPELINK_OBJECT_LABEL",
            PIPELINK_LINKCOMSTR="link     $_PIPELINK_LINK_LABEL",
            INSTALLSTR="install  $TARGET",
        )
    # The steps import the same pipelink this process did, and see the stage root and
    # toolchain it saw.
    root = str(lib.PACKAGE_DIR.parent)
    for name in PASS_ENV:
        if name in os.environ:
            env["ENV"][name] = os.environ[name]
    env["ENV"]["PYTHONPATH"] = os.pathsep.join(
        [root, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])
    env["ENV"]["PIPELINK_STAGE"] = lib.stage_root()
    spawn = env.get("SPAWN")
    if callable(spawn) and hasattr(signal, "pthread_sigmask") \
            and not getattr(spawn, "pipelink_held", False):
        env["SPAWN"] = _spawn_with_sigint_held(spawn)
    env["BUILDERS"]["PipeLinkHeader"] = SCons.Builder.Builder(
        action=SCons.Action.Action(_write_header, "$PIPELINK_HEADERCOMSTR"))
    env["BUILDERS"]["PipeLinkObject"] = SCons.Builder.Builder(
        action=SCons.Action.Action("$PIPELINK_OBJCOM", "$PIPELINK_OBJCOMSTR"),
        emitter=_object_emitter)
    env["BUILDERS"]["PipeLinkLink"] = SCons.Builder.Builder(
        action=SCons.Action.Action("$PIPELINK_LINKCOM", "$PIPELINK_LINKCOMSTR"),
        emitter=_link_emitter)
    env["BUILDERS"]["PipeLinkIndex"] = SCons.Builder.Builder(
        action=SCons.Action.Action(_write_header, "$PIPELINK_INDEXCOMSTR"))
    env["BUILDERS"]["PipeLinkManifest"] = SCons.Builder.Builder(
        action=SCons.Action.Action(_write_manifest, "$PIPELINK_MANIFESTCOMSTR"))
    if SCons.Script.GetOption("no_exec"):
        env.Decider(_dry_run_decider)
    if _exit_130_if_interrupted not in _registered:
        _registered.add(_exit_130_if_interrupted)
        atexit.register(_exit_130_if_interrupted)
    env.AddMethod(PipeLinkKernel)
    env.AddMethod(PipeLinkKernels)
    env.AddMethod(PipeLinkRelease)
    env.AddMethod(PipeLinkCache)
    env.AddMethod(PipeLinkSummary)


def exists(env: Env) -> bool:
    return lib is not None
