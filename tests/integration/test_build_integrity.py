"""Nothing wrong ships from the build: a poisoned cache entry or a tampered stage is
refused and rebuilt, never used; interrupted builds leave nothing half-done; the dry
run, the plan and the release manifest tell the truth.

End to end on the fixture tree of :mod:`test_scons` (``python -m SCons -Q``, exit codes,
output hashes); nvcc runs through a wrapper that logs every invocation.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipelink import buildcache

from .test_scons import ARCH, RECIPE, ROOT, Tree, hashes

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")

OBJECT = "row_reduce"  # the component whose object the tests poison


def _nvcc_wrapper(folder: Path, log: Path) -> Path:
    bin_dir = folder / "cuda" / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    wrapper = bin_dir / "nvcc"
    wrapper.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> "{log}"\n'
                       f'exec "{shutil.which("nvcc")}" "$@"\n')
    wrapper.chmod(0o755)
    return bin_dir


class Builds:
    """Trees that share one stage root and one nvcc log under ``folder`` (the stage
    root is part of every cache key: trees that share a cache share it)."""

    def __init__(self, folder: Path, stage: Path | None = None):
        self.folder = folder
        self.stage = stage or folder / "stage"
        self.log = folder / "nvcc.log"
        self.bin_dir = _nvcc_wrapper(folder, self.log)

    def tree(self, name: str, cache: str = "cache") -> Tree:
        return Tree(self.folder / name, self.folder / cache, self.stage, self.log,
                    self.bin_dir)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> dict:
    """One clean build whose cache the poisoning tests copy: its outputs' hashes, the
    cache entry of each output, and the object's name."""
    builds = Builds(tmp_path_factory.mktemp("pristine"))
    tree = builds.tree("a")
    tree.build(explain=False)
    objects = tree.root / "build" / "obj" / ARCH
    obj = next(objects.glob(f"{OBJECT}-*.o"))
    entries = {}
    by_content = {p.read_bytes(): p for p in tree.cache.rglob("*")
                  if p.is_file() and len(p.name) > 30 and not p.name.endswith(".sha256")}
    for path in [obj, *tree.out_dir().iterdir()]:
        entries[path.name] = by_content[path.read_bytes()].relative_to(tree.cache)
    return {"cache": tree.cache, "stage": tree.stage, "out": hashes(tree.out_dir()),
            "object": obj.name,
            "object_sha": hashes(objects)[obj.name], "entries": entries}


@pytest.fixture
def builds(tmp_path, pristine) -> Builds:
    """A fresh folder whose cache is a copy of the pristine build's."""
    b = Builds(tmp_path, stage=pristine["stage"])
    shutil.copytree(pristine["cache"], tmp_path / "cache")
    return b


def _flip_byte(data: bytes) -> bytes:
    at = len(data) * 2 // 3
    return data[:at] + bytes([data[at] ^ 0x20]) + data[at + 1:]


def _bump_dynamic_smem(data: bytes) -> bytes:
    """The issue's trial: one digit of dynamic_smem changed (229504 -> 329504)."""
    text = data.decode()
    value = re.search(r'"dynamic_smem": (\d+)', text).group(1)
    return text.replace(f'"dynamic_smem": {value}',
                        f'"dynamic_smem": {int(value[0]) % 9 + 1}{value[1:]}').encode()


def _truncate(data: bytes) -> bytes:
    return data[:len(data) // 2]


# (target whose cache entry is poisoned, how, compiles and links the next build runs)
POISONS = [
    ("object", _flip_byte, 1, 0),
    ("object", _truncate, 1, 0),
    (f"{RECIPE}.cubin", _flip_byte, 0, 1),
    ("kernel.json", _bump_dynamic_smem, 0, 1),
    ("placement.json", _flip_byte, 0, 1),
    ("glue.cu", _flip_byte, 0, 1),
]


def _entry(builds: Builds, pristine: dict, target: str) -> Path:
    name = pristine["object"] if target == "object" else target
    return builds.folder / "cache" / pristine["entries"][name]


@pytest.mark.parametrize("target,poison,compiles,links", POISONS,
                         ids=[f"{t}-{p.__name__.strip('_')}" for t, p, _, _ in POISONS])
def test_a_poisoned_cache_entry_is_discarded_rebuilt_and_never_served(
        builds, pristine, target, poison, compiles, links):
    entry = _entry(builds, pristine, target)
    entry.write_bytes(poison(entry.read_bytes()))

    clone = builds.tree("b")  # a fresh clone: nothing built, everything from the cache
    run = clone.build(explain=False)
    assert len(run.compiled) == compiles and len(run.linked) == links, run.out
    assert "cache entry for" in run.err and "discarded, rebuilding" in run.err, run.err
    assert hashes(clone.out_dir()) == pristine["out"]
    assert hashes(clone.root / "build" / "obj" / ARCH)[pristine["object"]] == \
        pristine["object_sha"]
    # The rebuilt file took the entry's place, with its record.
    name = pristine["object"] if target == "object" else target
    assert buildcache.entry_problem(entry, name) is None
    assert buildcache.file_sha256(entry) == (pristine["object_sha"] if target == "object"
                                             else pristine["out"][target])

    again = builds.tree("c")  # and the next clone gets only sound entries
    run = again.build(explain=False)
    assert run.compiled == [] and run.linked == [] and run.err == "", run.out + run.err
    assert hashes(again.out_dir()) == pristine["out"]


def test_entries_without_a_record_are_rebuilt_once(builds, pristine):
    """A cache an older PipeLink filled (no records): each entry is rebuilt and
    recorded once, then served."""
    for record in (builds.folder / "cache").rglob("*.sha256"):
        record.unlink()
    run = builds.tree("b").build(explain=False)
    assert len(run.compiled) == 5 and len(run.linked) == 1
    assert run.err.count("no recorded hash") == 5 + 1  # the link's first target stops it
    run = builds.tree("c").build(explain=False)
    assert run.compiled == [] and run.linked == [] and "0 compiled, 5 from cache" in run.out


def test_a_corrupted_object_heals_through_clean_and_rebuild(builds, pristine):
    """The link's hint says "rebuild the component": scons -c and scons must then give
    a sound object, not the cache's bad copy again."""
    tree = builds.tree("b")
    tree.build(explain=False)
    local = tree.root / "build" / "obj" / ARCH / pristine["object"]
    entry = _entry(builds, pristine, "object")
    for path in (local, entry):
        path.chmod(0o644)
        path.write_bytes(_flip_byte(path.read_bytes()))
    assert tree.scons("-c").rc == 0 and not local.exists()
    run = tree.build(explain=False)
    assert [c.split()[0] for c in run.compiled] == [OBJECT]
    assert buildcache.file_sha256(local) == pristine["object_sha"]
    assert buildcache.file_sha256(entry) == pristine["object_sha"]


def test_a_read_only_cache_is_checked_too_and_left_as_it_is(builds, pristine):
    entry = _entry(builds, pristine, "kernel.json")
    entry.write_bytes(_bump_dynamic_smem(entry.read_bytes()))
    before = hashes(builds.folder / "cache")
    clone = builds.tree("b")
    run = clone.build("cache=readonly", explain=False)
    assert len(run.linked) == 1 and "not used (the cache is read-only here)" in run.err
    assert hashes(clone.out_dir()) == pristine["out"]
    assert hashes(builds.folder / "cache") == before


# -- the stage ----------------------------------------------------------------------------

def _staged(tree: Tree, name: str) -> list[Path]:
    return sorted(tree.stage.glob(f"*/component/{name}"))


def _edit(path: Path) -> None:
    path.write_text(path.read_text() + "\n#error a tampered stage was compiled\n")


def _delete(path: Path) -> None:
    path.unlink()


def _wipe_folder(path: Path) -> None:  # a /tmp cleaner that takes whole files trees
    for p in path.parent.parent.rglob("*"):
        if p.is_file():
            p.unlink()


@pytest.mark.parametrize("tamper", [_edit, _delete, _wipe_folder],
                         ids=lambda f: f.__name__.strip("_"))
def test_a_tampered_stage_is_restored_and_the_object_is_right(tmp_path, tamper):
    builds = Builds(tmp_path)
    tree = builds.tree("t")
    tree.build("cache=off", explain=False)
    out = hashes(tree.out_dir())
    objects = hashes(tree.root / "build" / "obj" / ARCH)
    staged = _staged(tree, f"{OBJECT}.cu")
    assert len(staged) == 1
    tamper(staged[0])

    assert tree.scons("-c").rc == 0
    run = tree.build("cache=off", explain=False)
    assert len(run.compiled) == 5, run.out
    assert "restored" in run.err, run.err
    assert hashes(tree.out_dir()) == out
    assert hashes(tree.root / "build" / "obj" / ARCH) == objects


# -- interrupted builds --------------------------------------------------------------------

def _start(tree: Tree, *args: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINK_")}
    env.update(PIPELINK_STAGE=str(tree.stage), PIPELINK_CACHE=str(tree.cache),
               CUDA_HOME=str(tree.bin_dir.parent))
    return subprocess.Popen([sys.executable, "-m", "SCons", "-Q", "-C", str(tree.root), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)


def _wait_for_compiles(tree: Tree, n: int, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while tree.nvcc_compiles() < n:
        assert time.monotonic() < end, "no compile started"
        time.sleep(0.05)


def _leftovers(tree: Tree) -> list[str]:
    """Temporary files or folders in the build tree and the stage root."""
    found = [str(p) for p in (tree.root / "build").rglob("*") if p.name.endswith(".tmp")]
    if tree.stage.is_dir():
        found += [p.name for p in tree.stage.iterdir() if p.name.startswith(".")]
    return found


@pytest.mark.parametrize("compiles_started", [1, 3])
def test_ctrl_c_ends_the_build_with_130_and_no_traceback(tmp_path, compiles_started):
    tree = Builds(tmp_path).tree("t")
    proc = _start(tree, "cache=off", "-j2")
    _wait_for_compiles(tree, compiles_started)
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 130, out
    assert "Traceback" not in out, out
    assert "Build interrupted" in out
    assert _leftovers(tree) == []
    run = tree.build("cache=off", explain=False)  # and the next build completes
    assert len(run.linked) == 1


def test_a_killed_build_leaves_nothing_after_the_next(tmp_path):
    tree = Builds(tmp_path).tree("t")
    proc = _start(tree, "cache=off", "-j2")
    _wait_for_compiles(tree, 2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    tree.build("cache=off", explain=False)
    assert _leftovers(tree) == []


# -- what depends on what ------------------------------------------------------------------

def test_an_unused_abi_header_changes_neither_clean_nor_incremental_builds(tmp_path):
    """The stage and the SCons dependencies hold the same headers: an ABI header that
    nothing includes recompiles nothing, and a clean build agrees with an incremental one."""
    builds = Builds(tmp_path)
    tree = builds.tree("inc")
    tree.build("cache=off", explain=False)
    objects = hashes(tree.root / "build" / "obj" / ARCH)
    unused = "pipelink/include/pipelink/unused_by_all.cuh"
    (tree.root / unused).write_text("#pragma once\n// included by nothing\n")
    run = tree.build("cache=off", explain=False)
    assert run.compiled == [], run.out
    assert hashes(tree.root / "build" / "obj" / ARCH) == objects

    clean = builds.tree("clean")
    (clean.root / unused).write_text((tree.root / unused).read_text())
    clean.build("cache=off", explain=False)
    assert hashes(clean.out_dir()) == hashes(tree.out_dir())
    assert hashes(clean.root / "build" / "obj" / ARCH) == objects


def test_dry_run_after_a_source_edit_lists_the_compile_and_the_relink(tmp_path):
    tree = Builds(tmp_path).tree("t")
    tree.build(explain=False)
    assert tree.scons("-n").out.count("compile") == 0
    tree.append(f"components/{OBJECT}/{OBJECT}.cu", "\n// edited\n")
    compiles = tree.nvcc_compiles()
    dry = tree.scons("-n")
    assert dry.rc == 0, dry.err
    assert [c.split()[0] for c in dry.compiled] == [OBJECT]
    assert len(dry.linked) == 1 and "Retrieved" not in dry.out, dry.out
    assert tree.nvcc_compiles() == compiles  # a dry run runs nothing
    run = tree.build(explain=False)  # and the real build does what the dry run said
    assert run.compiled == dry.compiled and run.linked == dry.linked


# -- the plan and the manifest ---------------------------------------------------------------

def test_a_recipe_needing_cutlass_is_refused_before_any_compile(tmp_path, monkeypatch):
    """The README's set-up (``pip install -e .``) has no CUTLASS: mode=release must say
    so before compiling, naming the recipe, the instance and the install command."""
    fake = tmp_path / "no-cutlass" / "cutlass_library"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")  # the package without its headers
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(fake.parent), os.environ.get("PYTHONPATH", "")]))
    tree = Builds(tmp_path).tree("t")
    for folder in (ROOT / "components").iterdir():
        if not (tree.root / "components" / folder.name).exists():
            shutil.copytree(folder, tree.root / "components" / folder.name)
    shutil.copy(ROOT / "recipes" / "gemm_cute.yaml", tree.root / "recipes")
    run = tree.scons("mode=release")
    assert run.rc == 2, run.out + run.err
    assert "recipes/gemm_cute.yaml: instances." in run.err, run.err
    assert "CUTLASS headers not found" in run.err and "cute_mainloop" in run.err
    assert "pip install -e '.[cutlass]'" in run.err
    assert "Traceback" not in run.out + run.err
    assert tree.nvcc_compiles() == 0 and not (tree.root / "build").exists()


def _git(tree: Tree, *args: str) -> str:
    return subprocess.run(["git", "-C", str(tree.root), *args], check=True,
                          capture_output=True, text=True).stdout.strip()


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_release_manifest_names_the_build_files_and_the_revision(tmp_path):
    tree = Builds(tmp_path).tree("t")
    (tree.root / ".gitignore").write_text("build/\ndist/\n.sconsign.dblite\n")
    _git(tree, "init", "-q")
    _git(tree, "add", "-A")
    _git(tree, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "fixture")
    tree.build("mode=release", explain=False)
    manifest = json.loads((tree.root / "dist" / "manifest.json").read_text())
    assert manifest["source"] == {"git": _git(tree, "rev-parse", "HEAD"), "dirty": False}
    for name in ("SConstruct", "pyproject.toml", "site_scons/site_tools/pipelink/__init__.py"):
        assert manifest["inputs"][name] == buildcache.file_sha256(tree.root / name), name

    (tree.root / ".gitignore").write_text("build/\ndist/\n.sconsign.dblite\n# edited\n")
    run = tree.build("mode=release", explain=False)
    assert run.compiled == [] and run.linked == []  # only the manifest changes
    manifest = json.loads((tree.root / "dist" / "manifest.json").read_text())
    assert manifest["source"]["dirty"] is True


# (entry point, signal, exit status): the steps scons runs and the pipelink CLI
STEP_SIGNALS = [
    ("pipelink.buildstep", signal.SIGINT, 130),
    ("pipelink.buildstep", signal.SIGTERM, 128 + signal.SIGTERM),
    ("pipelink.cli", signal.SIGINT, 130),
]


@pytest.mark.parametrize("module,sig,status", STEP_SIGNALS,
                         ids=[f"{m.split('.')[1]}-{s.name}" for m, s, _ in STEP_SIGNALS])
def test_an_interrupted_compile_step_says_one_line_and_leaves_nothing(tmp_path, module, sig,
                                                                      status):
    stage, out = tmp_path / "stage", tmp_path / "obj" / "row_reduce.o"
    env = {**os.environ, "PIPELINK_STAGE": str(stage), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", module, "compile",
         str(ROOT / "components" / OBJECT / "contract.yaml"), "--arch", ARCH, "-o", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    end = time.monotonic() + 120
    while not (stage.is_dir() and any(p.name.startswith(".out-") for p in stage.iterdir())):
        assert proc.poll() is None and time.monotonic() < end, "nvcc never started"
        time.sleep(0.02)
    proc.send_signal(sig)  # nvcc runs: the step's own unwinding ends it
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == status, output
    assert "Traceback" not in output
    assert not out.parent.exists() or list(out.parent.iterdir()) == []
    assert [p.name for p in stage.iterdir() if p.name.startswith(".")] == []


def test_build_objects_outside_scons_uses_the_same_inputs(tmp_path, monkeypatch):
    """The CLI's and the tests' builder (pipelink.build) calls an object fresh by the
    same input set: an unused ABI header recompiles nothing, an included one recompiles
    its includers."""
    from pipelink.build import build_objects, default_index
    from pipelink.compile import INCLUDE_DIR
    from pipelink.recipe import load_recipe

    include = tmp_path / "include"
    shutil.copytree(INCLUDE_DIR, include)
    monkeypatch.setattr("pipelink.compile.INCLUDE_DIR", include)
    monkeypatch.setenv("PIPELINK_STAGE", str(tmp_path / "stage"))
    recipe = load_recipe(ROOT / "recipes" / f"{RECIPE}.yaml")
    index = default_index(ROOT)

    def build() -> dict[str, int]:
        objects = build_objects(recipe, ARCH, index, tmp_path / "obj")
        return {p.name: p.stat().st_mtime_ns for p in set(objects.values())}

    first = build()
    assert len(first) == 5
    (include / "pipelink" / "unused_by_all.cuh").write_text("#pragma once\n")
    assert build() == first
    with open(include / "pipelink" / "smem.cuh", "a") as f:  # pipelink.cuh includes it
        f.write("\n// edited\n")
    second = build()
    assert all(second[name] != first[name] for name in first)
