"""Shared fixtures: small component trees and recipes in a temporary folder.

:class:`Tree` writes contracts to ``<tmp>/components/<name>/contract.yaml`` and recipes to
``<tmp>/recipes/<name>.yaml``, finds components with :class:`ComponentIndex` and runs the
checker the way the linker does (bind each instance's params, then ``check``), with no
compiler involved. :func:`producer`, :func:`consumer` and :func:`epilogue` return fresh
copies of three contracts that fit together, for tests to break one field at a time.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipelink.build import bind_components
from pipelink.check import Kernel, check
from pipelink.contract import BoundContract, load_contract
from pipelink.recipe import ComponentIndex, Recipe, load_recipe

ROOT = Path(__file__).resolve().parents[1]

# CI machines that should have the toolchain export PIPELINK_REQUIRE_TOOLCHAIN=1 (.ci/run
# does; CI=true implies it unless set to 0): there a test skipped for a missing tool fails,
# so a runner without nvcc cannot pass green by skipping every integration test.
REQUIRE_TOOLCHAIN = os.environ.get(
    "PIPELINK_REQUIRE_TOOLCHAIN", "1" if os.environ.get("CI") else "0") == "1"
TOOL_SKIP = re.compile(r"nvcc|nvjitlink|cuobjdump|nvdisasm|cutlass", re.I)

requires_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None,
                                   reason="needs CUDA's nvcc on PATH")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    """With the toolchain required, a skip that names a tool becomes a failure."""
    outcome = yield
    report = outcome.get_result()
    if REQUIRE_TOOLCHAIN and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(
            report.longrepr)
        if TOOL_SKIP.search(reason):
            report.outcome = "failed"
            report.longrepr = (f"PIPELINK_REQUIRE_TOOLCHAIN=1, but {item.nodeid} was skipped: "
                               f"{reason}")

# A TMA producer warp: (rows, cols) tiles into a ring of `stages` stages.
_PRODUCER: dict[str, Any] = {
    "component": "loader",
    "arch": ["sm_90a", "sm_100a"],
    "params": {"rows": 128, "cols": 64, "dtype": "bf16"},
    "tunables": {"stages": [2, 8]},
    "roles": {"producer": {"warps": 1, "registers": 40, "uses": ["tma"]}},
    "smem": {"tiles": {"bytes": "stages*rows*cols*sizeof(dtype)", "align": 1024}},
    "mbarriers": {"full": "stages", "empty": "stages"},
    "ports": {"tiles": {"dir": "out", "kind": "smem_pipeline", "dtype": "dtype",
                        "shape": ["rows", "cols"], "layout": "row_major", "stages": "stages",
                        "buffer": "tiles", "full": "full", "empty": "empty", "arrivals": 1,
                        "tx_bytes": "rows*cols*sizeof(dtype)", "per_tile": "args.k_tiles"}},
    "args": [{"name": "src", "type": "tensormap", "dtype": "dtype", "box": ["cols", "rows"]},
             {"name": "k_tiles", "type": "u32"}],
}

# A consumer warpgroup: every thread releases each stage (arrivals: rows).
_CONSUMER: dict[str, Any] = {
    "component": "reducer",
    "arch": ["sm_90a", "sm_100a"],
    "params": {"rows": 128, "cols": 64, "dtype": "bf16"},
    "tunables": {"stages": [2, 8]},
    "roles": {"reduce": {"warps": "rows // 32", "registers": 64}},
    "ports": {"x": {"dir": "in", "kind": "smem_pipeline", "dtype": "dtype",
                    "shape": ["rows", "cols"], "layout": "row_major", "stages": "stages",
                    "arrivals": "rows", "per_tile": "args.k_tiles"},
              "acc": {"dir": "out", "kind": "registers", "dtype": "f32", "count": 8,
                      "layout": "row_per_thread_8"}},
    "args": [{"name": "k_tiles", "type": "u32"}],
}

# An epilogue in the consumer's warps, fed by a register hand-off.
_EPILOGUE: dict[str, Any] = {
    "component": "store",
    "arch": ["sm_90a", "sm_100a"],
    "params": {"rows": 128},
    "roles": {"store": {"warps": "rows // 32", "registers": 64}},
    "named_barriers": {"done": {"threads": "rows"}},
    "ports": {"acc": {"dir": "in", "kind": "registers", "dtype": "f32", "count": 8,
                      "layout": "row_per_thread_8"}},
    "args": [{"name": "out", "type": "ptr", "dtype": "f32"}],
}

_RECIPE: dict[str, Any] = {
    "recipe": "toy",
    "arch": ["sm_90a"],
    "instances": {"load": "loader", "reduce": "reducer", "store": "store"},
    "connect": ["load.tiles -> reduce.x", "reduce.acc -> store.acc"],
}


def producer() -> dict[str, Any]:
    return copy.deepcopy(_PRODUCER)


def consumer() -> dict[str, Any]:
    return copy.deepcopy(_CONSUMER)


def epilogue() -> dict[str, Any]:
    return copy.deepcopy(_EPILOGUE)


def toy_recipe() -> dict[str, Any]:
    return copy.deepcopy(_RECIPE)


def _text(data: dict[str, Any] | list[Any] | str) -> str:
    return data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False)


@dataclass(frozen=True)
class Tree:
    """A components/ and recipes/ folder under a temporary root."""

    root: Path

    @property
    def index(self) -> ComponentIndex:
        return ComponentIndex((self.root / "components",))

    def component(self, name: str, contract: dict[str, Any] | str) -> Path:
        """Writes a contract (a dict, or YAML text as is) as components/<name>/contract.yaml."""
        path = self.root / "components" / name / "contract.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_text(contract))
        return path

    def recipe(self, data: dict[str, Any] | str, name: str = "r") -> Path:
        path = self.root / "recipes" / f"{name}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_text(data))
        return path

    def toy(self) -> None:
        """The three fitting components under their own names."""
        self.component("loader", producer())
        self.component("reducer", consumer())
        self.component("store", epilogue())

    def bind(self, recipe: Recipe, arch: str) -> dict[str, BoundContract]:
        """Each instance's contract with the recipe's params, as objects would carry it."""
        return {name: bound for name, (bound, _) in
                bind_components(recipe, arch, self.index).items()}

    def check(self, recipe_path: Path, arch: str = "sm_90a") -> Kernel:
        recipe = load_recipe(recipe_path)
        return check(recipe, arch, self.bind(recipe, arch))


@pytest.fixture
def tree(tmp_path: Path) -> Tree:
    return Tree(tmp_path)


@pytest.fixture(scope="session")
def object_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder of component objects for the whole session. Objects are named by
    component, params hash and arch, and rebuilt only when stale, so the test modules
    that link the same components compile each once."""
    return tmp_path_factory.mktemp("objects")


@pytest.fixture(scope="session")
def link_repo_kernel(tmp_path_factory: pytest.TempPathFactory, object_dir: Path):  # noqa: ANN201
    """link(name, arch, mode="linked", kernel="main") -> LinkResult of a recipe in
    recipes/, linked once per session (linked with PTX, or monolithic: "mono" by nvcc's
    whole-program cubin, "mono_lto" through LTO-IR and nvJitLink) and shared by every
    test module that reads it: the same inputs give the same bytes, so relinking in each
    module only costs CI time."""
    from pipelink.build import build_objects, default_index
    from pipelink.link import LinkOptions, link_kernel

    root = Path(__file__).resolve().parents[1]
    out = tmp_path_factory.mktemp("linked")
    index = default_index(root)
    cache: dict[tuple[str, str, str, str], Any] = {}

    def link(name: str, arch: str, mode: str = "linked", kernel: str = "main") -> Any:
        key = (name, arch, mode, kernel)
        if key not in cache:
            recipe = load_recipe(root / "recipes" / f"{name}.yaml").select([kernel])[kernel]
            objects = build_objects(recipe, arch, index, object_dir)
            opts = LinkOptions(arch, mode="mono" if mode == "mono_lto" else mode,
                               emit_ptx=mode == "linked", mono_via_lto=mode == "mono_lto")
            cache[key] = link_kernel(recipe, objects, out / mode / arch / recipe.name, opts,
                                     index=index)
        return cache[key]
    return link


def check_repo_recipe(tmp_path: Path, recipe: str, arch: str = "sm_90a",
                      edit: Any = None) -> Kernel:
    """A recipe from recipes/ (edited by `edit(data)` if given, written under tmp_path so
    errors name a file) checked against the repo's component contracts, no compiler."""
    root = Path(__file__).resolve().parents[1]
    data = yaml.safe_load((root / "recipes" / f"{recipe}.yaml").read_text())
    if edit:
        edit(data)
    path = tmp_path / "recipes" / f"{recipe}.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    r = load_recipe(path)
    bound = {inst: load_contract(root / "components" / i.component / "contract.yaml")
             .bind(i.params) for inst, i in r.instances(arch).items()}
    return check(r, arch, bound)
