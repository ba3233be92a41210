"""Fuzzing the files a user writes: whatever bytes a recipe or contract file holds,
reading it (and, for a recipe, checking it against three components that fit) either
works or raises a PipeLinkError with a short message, never anything else.

Four sources of input: raw bytes; YAML-like text from YAML's own punctuation (anchors,
aliases, tags, tabs, flow brackets, documents); character edits of the repository's own
recipes and contracts; and recipe data with keys from the schema, dumped as YAML.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelink.contract import load_contract
from pipelink.errors import PipeLinkError
from pipelink.recipe import load_recipe
from pipelink.schema import RECIPE_SCHEMA

from ..conftest import Tree, toy_recipe

ROOT = Path(__file__).resolve().parents[2]
FUZZ = settings(max_examples=int(os.environ.get("PIPELINK_FUZZ_EXAMPLES", "300")),
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
MAX_MESSAGE = 1500

SEEDS = sorted([*ROOT.glob("recipes/*.yaml"), *ROOT.glob("components/*/contract.yaml")])
SEED_TEXTS = [p.read_text() for p in SEEDS]

YAML_TOKENS = ["\n", "  ", "\t", "- ", ": ", "? ", "[", "]", "{", "}", ", ", "&a ", "*a",
               "&b ", "*b", "!!int ", "!!str ", "!!binary ", "!!python/name:os.system ",
               "!!timestamp ", "<<: ", "---\n", "...\n", "#", "'", '"', "|\n", ">\n", "%YAML 1.1\n",
               "recipe", "component", "arch", "sm_90a", "instances", "connect", "load",
               "loader", "reduce.x -> ", "load.tiles", "=>", "params", "rows", "128", "-1",
               "0x", "1e999", "2024-13-01", "~", "null", "yes", "\x00", "\x07", "\ufeff",
               "\u2028", "é"]
yaml_text = st.lists(st.sampled_from(YAML_TOKENS), max_size=40).map("".join)


@st.composite
def edited_seeds(draw: st.DrawFn) -> str:
    """A repository recipe or contract with a few characters inserted, deleted or replaced."""
    text = draw(st.sampled_from(SEED_TEXTS))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(text)))
        action = draw(st.sampled_from(["insert", "delete", "replace"]))
        piece = draw(st.sampled_from(YAML_TOKENS) | st.text(max_size=3))
        if action == "insert":
            text = text[:at] + piece + text[at:]
        elif action == "delete":
            text = text[:at] + text[at + draw(st.integers(1, 20)):]
        else:
            text = text[:at] + piece + text[at + len(piece):]
    return text


RECIPE_KEYS = sorted(RECIPE_SCHEMA["properties"])
recipe_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 300) | st.text(max_size=10)
    | st.sampled_from(["loader", "reducer", "store", "load", "reduce", "store", "sm_90a",
                       "load.tiles -> reduce.x", "reduce.acc -> store.acc", "stages",
                       "load.stages", "max_tunables_then_min_smem"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["component", "params", "tunables", "per_arch", "maximize", "rows",
                         "cols", "stages", "sm_90a", "load", "reduce", "store"]) | st.text(
            max_size=6), inner, max_size=4), max_leaves=20)


@st.composite
def edited_recipes(draw: st.DrawFn) -> dict[str, Any]:
    """The toy recipe with one to three top-level keys replaced, dropped or added."""
    recipe = toy_recipe()
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(RECIPE_KEYS))
        if draw(st.booleans()) and key in recipe:
            del recipe[key]
        else:
            recipe[key] = draw(recipe_values)
    return recipe


@pytest.fixture(scope="module")
def toy_tree(tmp_path_factory: pytest.TempPathFactory) -> Tree:
    tree = Tree(tmp_path_factory.mktemp("fuzz"))
    tree.toy()
    return tree


def _read(path: Path, what: str, tree: Tree | None = None) -> None:
    """Reads (and for a recipe with ``tree``, checks) ``path``; only PipeLinkError escapes."""
    try:
        if what == "contract":
            load_contract(path)
        else:
            recipe = load_recipe(path)
            if tree is not None:
                for arch in recipe.archs:
                    tree.check(path, arch)
    except PipeLinkError as exc:
        assert len(str(exc)) < MAX_MESSAGE, str(exc)[:MAX_MESSAGE]


def _write(tree: Tree, what: str, data: bytes) -> Path:
    path = (tree.root / "fuzz" / "contract.yaml" if what == "contract"
            else tree.root / "recipes" / "fuzz.yaml")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


@FUZZ
@given(st.sampled_from(["contract", "recipe"]), st.binary(max_size=200))
def test_raw_bytes_are_refused_or_read_cleanly(toy_tree, what, raw):
    _read(_write(toy_tree, what, raw), what)


@FUZZ
@given(st.sampled_from(["contract", "recipe"]), yaml_text)
def test_yaml_punctuation_is_refused_or_read_cleanly(toy_tree, what, text):
    _read(_write(toy_tree, what, text.encode("utf-8", "surrogatepass")), what, toy_tree)


@FUZZ
@given(st.sampled_from(["contract", "recipe"]), edited_seeds())
def test_edited_repository_files_are_refused_or_read_cleanly(toy_tree, what, text):
    _read(_write(toy_tree, what, text.encode("utf-8", "surrogatepass")), what, toy_tree)


@FUZZ
@given(edited_recipes())
def test_edited_recipes_are_refused_or_checked_cleanly(toy_tree, recipe):
    text = yaml.safe_dump(recipe, sort_keys=False)
    _read(_write(toy_tree, "recipe", text.encode()), "recipe", toy_tree)
