"""The SCons plugin end to end, the way SCons tests itself: a fixture tree in a temporary
folder (SConstruct, site_scons, this pipelink, four components, one recipe), ``python -m
SCons -Q -C <tree>``, exit codes, output lines, ``--debug=explain`` and output hashes.

nvcc runs through a wrapper that logs every invocation, so "nothing compiled" is counted,
not assumed. The cache and the compile stage live under the test's temporary folder.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from pipelink.runtime import read_kernel_folder

ROOT = Path(__file__).resolve().parents[2]
COMPONENTS = ("tile_loader", "row_reduce", "row_store", "neighbor_sum")
RECIPE = "pipeline_demo"
ARCH = "sm_90a"
# A header of the fixture's ABI folder that only row_store includes.
EXTRA_HEADER = "pipelink/include/pipelink/fixture_extra.cuh"
LINK_OUTPUTS = (f"{RECIPE}.cubin", "kernel.json", "placement.json", "placement.svg", "glue.cu")

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")


@dataclass
class Run:
    rc: int
    out: str
    err: str

    @property
    def compiled(self) -> list[str]:
        """Objects compiled, as the quiet output names them: 'component [params] arch'."""
        return re.findall(r"^compile  (.+)$", self.out, re.M)

    @property
    def linked(self) -> list[str]:
        return re.findall(r"^link     (.+)$", self.out, re.M)

    @property
    def rebuilt(self) -> set[str]:
        """Targets SCons built, from its own explanation (--debug=explain)."""
        return set(re.findall(r"^scons: (?:re)?building `([^']+)' because", self.out, re.M))


class Tree:
    """A checkout-like folder that builds with its own copy of pipelink."""

    def __init__(self, root: Path, cache: Path, stage: Path, nvcc_log: Path, bin_dir: Path):
        self.root, self.cache, self.stage, self.nvcc_log = root, cache, stage, nvcc_log
        self.bin_dir = bin_dir
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
        root.mkdir(parents=True)
        shutil.copy(ROOT / "SConstruct", root)
        shutil.copy(ROOT / "pyproject.toml", root)
        shutil.copytree(ROOT / "site_scons", root / "site_scons", ignore=ignore)
        shutil.copytree(ROOT / "pipelink", root / "pipelink", ignore=ignore)
        for name in COMPONENTS:
            shutil.copytree(ROOT / "components" / name, root / "components" / name,
                            ignore=ignore)
        (root / "recipes").mkdir()
        shutil.copy(ROOT / "recipes" / f"{RECIPE}.yaml", root / "recipes")
        (root / EXTRA_HEADER).write_text("#pragma once\n// fixture: only row_store reads this\n")
        source = root / "components" / "row_store" / "row_store.cu"
        text = source.read_text()
        first = text.index("#include")
        source.write_text(text[:first] + '#include "pipelink/fixture_extra.cuh"\n' + text[first:])

    def scons(self, *args: str, explain: bool = False) -> Run:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINK_")}
        env.update(PIPELINK_CACHE=str(self.cache), PIPELINK_STAGE=str(self.stage),
                   CUDA_HOME=str(self.bin_dir.parent), XDG_CACHE_HOME=str(self.cache) + "-xdg")
        cmd = [sys.executable, "-m", "SCons", "-Q", "-C", str(self.root), *args]
        if explain:
            cmd.append("--debug=explain")
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        return Run(proc.returncode, proc.stdout, proc.stderr)

    def build(self, *args: str, explain: bool = True) -> Run:
        run = self.scons(*args, explain=explain)
        assert run.rc == 0, run.out + run.err
        return run

    def nvcc_compiles(self) -> int:
        """nvcc invocations that compiled something (not `nvcc --version`)."""
        if not self.nvcc_log.exists():
            return 0
        return sum(1 for line in self.nvcc_log.read_text().splitlines()
                   if "-ltoir" in line or "-cubin" in line)

    def recipe(self) -> Path:
        return self.root / "recipes" / f"{RECIPE}.yaml"

    def edit_recipe(self, change) -> None:
        data = yaml.safe_load(self.recipe().read_text())
        change(data)
        self.recipe().write_text(yaml.safe_dump(data, sort_keys=False))

    def append(self, rel: str, text: str) -> None:
        with open(self.root / rel, "a") as f:
            f.write(text)

    def out_dir(self, mode: str = "dev", arch: str = ARCH) -> Path:
        return self.root / "build" / mode / arch / RECIPE



def hashes(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def make_tree(tmp_path: Path):
    """make_tree(name, cache=..., stage=...) -> Tree; nvcc runs through a logging wrapper."""
    bin_dir = tmp_path / "cuda" / "bin"
    bin_dir.mkdir(parents=True)
    log = tmp_path / "nvcc.log"
    real = shutil.which("nvcc")
    wrapper = bin_dir / "nvcc"
    wrapper.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> "{log}"\nexec "{real}" "$@"\n')
    wrapper.chmod(0o755)

    def make(name: str, cache: str = "cache", stage: str = "stage") -> Tree:
        return Tree(tmp_path / name, tmp_path / cache, tmp_path / stage, log, bin_dir)
    return make


def test_help_lists_recipes_archs_and_options(make_tree):
    tree = make_tree("t")
    long_name = "a_recipe_whose_name_is_longer_than_most"
    shutil.copy(tree.recipe(), tree.root / "recipes" / f"{long_name}.yaml")
    run = tree.scons("-h")
    assert run.rc == 0, run.err
    for word in (RECIPE, "sm_90a", "sm_100a", "recipe:", "arch:", "mode:", "cache:",
                 "VERBOSE:", "dev|mono|release", "PIPELINK_CACHE"):
        assert word in run.out, word
    # One column of archs, whatever the names' lengths.
    rows = [line for line in run.out.splitlines() if line.startswith(f"  {RECIPE} ")
            or line.startswith(f"  {long_name} ")]
    assert len(rows) == 2 and len({row.index("sm_90a") for row in rows}) == 1, rows


def test_dry_run_prints_one_line_per_step_or_full_commands(make_tree):
    tree = make_tree("t")
    quiet = tree.scons("-n")
    assert quiet.rc == 0, quiet.err
    assert "compile  tile_loader [cols=64 dtype=f32 rows=128] sm_90a" in quiet.out
    assert f"link     {RECIPE} sm_90a (linked) -> build/dev/sm_90a/{RECIPE}" in quiet.out
    verbose = tree.scons("-n", "VERBOSE=1")
    assert re.search(r"-m pipelink\.buildstep compile components/tile_loader/contract\.yaml "
                     r"-o build/obj/sm_90a/tile_loader-\w+\.sm_90a\.o --arch sm_90a "
                     r"-p cols=64 -p dtype=f32 -p rows=128", verbose.out), verbose.out
    assert "-m pipelink.buildstep link recipes/pipeline_demo.yaml" in verbose.out
    assert tree.nvcc_compiles() == 0


def _unknown_component(d):
    d["instances"]["load_x"]["component"] = "no_such_component"


def _unknown_arch(d):
    d["arch"] = ["sm_90a", "sm_91a"]


def _bad_param_name(d):
    d["instances"]["load_x"]["params"]["colour"] = 3


def _bad_param_type(d):
    d["instances"]["load_x"]["params"]["rows"] = "many"


def _missing_port(d):
    d["connect"][0] = "load_x.no_such_port -> reduce_x.x"


def _unconnected_input(d):
    d["connect"] = [c for c in d["connect"] if not c.startswith("load_y.")]


def _unknown_instance(d):
    d["connect"].append("ghost.out -> reduce_x.x")


RECIPE_ERRORS = [
    # (edit, command-line args, text the message must contain)
    (_unknown_component, (), ["instances.load_x", "unknown component 'no_such_component'"]),
    (_unknown_arch, (), ["arch", "sm_91a"]),
    (None, ("arch=sm_120a",), [": arch", "does not target sm_120a"]),
    (_bad_param_name, (), ["instances.load_x", "no param 'colour'"]),
    (_bad_param_type, (), ["instances.load_x", "param 'rows'"]),
    (_missing_port, (), ["connect[0]", "no_such_port"]),
    (_unconnected_input, (), ["reduce_y", "x"]),
    (_unknown_instance, (), ["connect[5]", "ghost"]),
]


@pytest.mark.parametrize("edit,args,expected", RECIPE_ERRORS,
                         ids=["unknown-component", "unknown-arch", "arch-not-targeted",
                              "bad-param-name", "bad-param-type", "missing-port",
                              "unconnected-input", "unknown-instance"])
def test_recipe_errors_stop_before_compiling(make_tree, edit, args, expected):
    tree = make_tree("t")
    if edit:
        tree.edit_recipe(edit)
    run = tree.scons(*args)
    assert run.rc == 2, run.out + run.err
    assert f"recipes/{RECIPE}.yaml" in run.err
    for text in expected:
        assert text in run.err, (text, run.err)
    assert "Traceback" not in run.out + run.err
    assert tree.nvcc_compiles() == 0
    assert not (tree.root / "build").exists()


def test_unknown_recipe_and_option_are_refused(make_tree):
    tree = make_tree("t")
    run = tree.scons("recipe=nope")
    assert run.rc == 2 and "no recipe nope" in run.err and RECIPE in run.err
    run = tree.scons("colour=blue")
    assert run.rc == 2 and "unknown option(s) colour" in run.err


def test_incremental_builds_rebuild_exactly_what_changed(make_tree):
    tree = make_tree("t")
    obj = tree.root / "build" / "obj" / ARCH
    cubin = f"build/dev/{ARCH}/{RECIPE}/{RECIPE}.cubin"

    clean = tree.build()
    assert len(clean.compiled) == 5 and len(clean.linked) == 1
    assert all((tree.out_dir() / name).is_file() for name in LINK_OUTPUTS)
    assert "5 compiled, 0 from cache, 0 up to date" in clean.out
    before = {p.name: p.stat().st_mtime_ns for p in obj.glob("*.o")}

    # A no-op rebuild runs no tool and SCons explains no rebuild.
    noop = tree.build()
    assert noop.compiled == [] and noop.linked == [] and noop.rebuilt == set()
    assert "0 compiled, 0 from cache, 5 up to date" in noop.out

    # One component's source: that component's object, then the link; nothing else.
    tree.append("components/row_reduce/row_reduce.cu", "\n// touched\n")
    run = tree.build()
    assert run.compiled == ["row_reduce [cols=64 dtype=bf16 rows=128] sm_90a"]
    assert {t for t in run.rebuilt if t.endswith(".o")} == \
        {f"build/obj/{ARCH}/{n}" for n in before if n.startswith("row_reduce-")}
    assert cubin in run.rebuilt and len(run.linked) == 1
    after = {p.name: p.stat().st_mtime_ns for p in obj.glob("*.o")}
    assert {n for n in before if after[n] != before[n]} == \
        {n for n in before if n.startswith("row_reduce-")}

    # One param of one instance: a new object for that param set only.
    tree.edit_recipe(lambda d: d["instances"].__setitem__(
        "store_x", {"component": "row_store", "params": {"max_tiles": 2048}}))
    run = tree.build()
    assert run.compiled == ["row_store [groups=8 max_tiles=2048 rows=128] sm_90a"]
    assert len(run.linked) == 1

    # A header: exactly the objects whose sources include it (both row_store param sets).
    tree.append(EXTRA_HEADER, "// changed\n")
    run = tree.build()
    assert sorted(run.compiled) == ["row_store [groups=8 max_tiles=1024 rows=128] sm_90a",
                                    "row_store [groups=8 max_tiles=2048 rows=128] sm_90a"]
    assert len(run.linked) == 1

    # The recipe's content is the dependency, not its text: a comment relinks nothing.
    tree.append(f"recipes/{RECIPE}.yaml", "# a comment\n")
    run = tree.build()
    assert run.compiled == [] and run.linked == [] and run.rebuilt == set(), run.out


def test_second_checkout_builds_entirely_from_cache(make_tree):
    first = make_tree("a")
    first.build(explain=False)
    compiles = first.nvcc_compiles()
    assert compiles >= 6  # five components and the glue

    entries = sorted(p for p in first.cache.rglob("*") if p.is_file())
    second = make_tree("b")  # same commit, another folder, no build/ and no .sconsign
    run = second.build("cache=readonly", explain=False)
    assert second.nvcc_compiles() == compiles, "the second checkout ran nvcc"
    assert run.compiled == [] and run.linked == []
    assert "0 compiled, 5 from cache" in run.out
    assert hashes(first.out_dir()) == hashes(second.out_dir())

    # cache=readonly takes from the cache and never adds to it.
    second.append("components/neighbor_sum/neighbor_sum.cu", "\n// only in b\n")
    run = second.build("cache=readonly", explain=False)
    assert len(run.compiled) == 1 and len(run.linked) == 1
    assert sorted(p for p in first.cache.rglob("*") if p.is_file()) == entries


def test_release_builds_in_two_folders_are_byte_identical(make_tree):
    dists = []
    for name in ("one", "two"):
        tree = make_tree(name, cache=f"cache-{name}")
        shutil.rmtree(tree.stage, ignore_errors=True)  # the stage is clean too, same path
        run = tree.build("mode=release", explain=False)
        assert len(run.linked) == 2, run.out  # one recipe, both archs
        dists.append(tree.root / "dist")
    first, second = (hashes(d) for d in dists)
    assert first == second
    assert set(first) == {"manifest.json"} | {f"{a}/{RECIPE}/{n}" for a in ("sm_90a", "sm_100a")
                                              for n in LINK_OUTPUTS}
    manifest = yaml.safe_load((dists[0] / "manifest.json").read_text())
    assert set(manifest["outputs"]) == set(first) - {"manifest.json"}
    assert manifest["outputs"][f"sm_90a/{RECIPE}/{RECIPE}.cubin"] == first[
        f"sm_90a/{RECIPE}/{RECIPE}.cubin"]
    assert f"recipes/{RECIPE}.yaml" in manifest["inputs"]
    assert "components/row_store/row_store.cu" in manifest["inputs"]
    assert "pipelink/compile.py" in manifest["inputs"]
    for build_file in ("SConstruct", "pyproject.toml",
                       "site_scons/site_tools/pipelink/__init__.py"):
        assert build_file in manifest["inputs"], build_file
    assert "source" not in manifest  # not a git checkout: no revision, and no guess
    assert manifest["toolchain"]["nvcc"] and manifest["flags"]["compile"]["sm_100a"]
    for path in dists[0].rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert str(dists[0].parent).encode() not in data, path
    # The runtime loads a release folder as it is: its cubin checks against kernel.json.
    for arch in ("sm_90a", "sm_100a"):
        meta, cubin = read_kernel_folder(dists[0] / arch / RECIPE)
        assert meta["arch"] == arch and cubin.startswith(b"\x7fELF")
