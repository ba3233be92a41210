"""Building a recipe's component objects outside SCons (the CLI, tests, benchmarks).

SCons does this with content signatures and a shared cache; this module is the small
equivalent for one-off commands: one object per (component, params, arch), rebuilt
only when what its compile reads (:func:`pipelink.compile.object_inputs`) or its
contract changed.
"""

from __future__ import annotations

import os
from pathlib import Path

from .compile import CompileOptions, compile_component, inputs_hash
from .contract import BoundContract, canonical_json, load_contract, sha256_text
from .errors import ObjectFormatError
from .objfile import read_object
from .recipe import ComponentIndex, Recipe, resolve_components


def default_index(root: Path | str | None = None) -> ComponentIndex:
    """``$PIPELINK_COMPONENTS`` (os.pathsep-separated) or ``<root>/components``."""
    env = os.environ.get("PIPELINK_COMPONENTS")
    if env:
        return ComponentIndex(tuple(Path(p) for p in env.split(os.pathsep)))
    return ComponentIndex((Path(root or ".") / "components",))


def object_name(component: str, params_hash: str, arch: str) -> str:
    return f"{component}-{params_hash}.{arch}.o"


def bind_components(recipe: Recipe, arch: str, index: ComponentIndex
                    ) -> dict[str, tuple[BoundContract, Path]]:
    """instance -> (its component's contract bound to the recipe's params, the contract's
    path), from the YAML alone: nothing compiles."""
    return {inst: (load_contract(path).bind(spec.params,
                                            where=recipe.where(f"instances.{inst}")), path)
            for inst, (spec, path) in resolve_components(recipe, arch, index).items()}


def build_objects(recipe: Recipe, arch: str, index: ComponentIndex,
                  build_dir: Path | str) -> dict[str, Path]:
    """instance -> object path, compiling what is missing or stale."""
    build_dir = Path(build_dir)
    out = {}
    for inst, (bound, contract_path) in bind_components(recipe, arch, index).items():
        path = build_dir / object_name(bound.name, bound.params_hash(), arch)
        if not _fresh(path, contract_path, bound, arch):
            compile_component(contract_path, bound.params, CompileOptions(arch), path)
        out[inst] = path
    return out


def _fresh(path: Path, contract_path: Path, bound: BoundContract, arch: str) -> bool:
    """The object was compiled from today's inputs: the component's files, its generated
    header and the ABI headers they include (the set SCons tracks too), and contract."""
    if not path.is_file():
        return False
    try:
        header = read_object(path).header
    except ObjectFormatError:
        return False
    return (header["source_sha256"] == inputs_hash(bound, contract_path.parent, arch)
            and header["contract_sha256"] == sha256_text(canonical_json(bound.contract.data)))
