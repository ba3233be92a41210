"""A named barrier's `when`: placed only for the params that need it.

The toy tree of ``tests/conftest.py`` (``loader -> reducer -> store``, rows 128) with the
store's barrier ``done`` given a condition. A false one leaves the barrier out of the
problem, the placement and the report, while the placement struct (which has a field per
declared barrier) gets an id no barrier has, which verification refuses in linked code.
No compiler, no GPU.
"""

from __future__ import annotations

import re

import pytest

from pipelink import glue
from pipelink.place import place
from pipelink.problem import UNPLACED_BARRIER
from pipelink.report import explain
from pipelink.verify import ContractViolation, check_linked_barriers

from ..conftest import epilogue, producer, toy_recipe
from .test_errors import put

DONE = "named_barriers.done"


def checked(tree, store_when: str | None = None, loader=None):  # noqa: ANN001, ANN201
    """The toy kernel, the store's barrier under ``store_when``, placed."""
    tree.toy()
    store = epilogue() if store_when is None else put(f"{DONE}.when", store_when)(epilogue())
    tree.component("store", store)
    if loader is not None:
        tree.component("loader", loader(producer()))
    kernel = tree.check(tree.recipe(toy_recipe()))
    return kernel, place(kernel.problem)


# (when, placed at rows 128)
@pytest.mark.parametrize("when,placed", [(None, True), ("rows == 128", True),
                                         ("rows != 64", True), ("rows == 64", False),
                                         ("rows != 128", False)])
def test_a_barrier_is_placed_where_its_when_holds(tree, when, placed):
    kernel, placement = checked(tree, when)
    assert ("store.done" in {b.name for b in kernel.problem.barriers}) is placed
    assert ("store.done" in placement.barriers) is placed
    assert (list(kernel.bound["store"].named_barriers()) == ["done"]) is placed
    assert kernel.bound["store"].places("done") is placed
    assert ("store.done" in explain(kernel.problem, placement)) is placed


def test_an_unplaced_barrier_keeps_its_field_with_an_id_no_barrier_has(tree):
    kernel, placement = checked(tree, "rows == 64")
    text = glue.generate(kernel, placement)
    line = re.search(r"pl_at_store = \{(.*)\};", text)
    assert line is not None and f"{UNPLACED_BARRIER:#x}" in line.group(1)
    assert not 0 <= UNPLACED_BARRIER < 16


def test_a_placed_barrier_gets_its_placed_id(tree):
    kernel, placement = checked(tree, "rows == 128")
    line = re.search(r"pl_at_store = \{(.*)\};", glue.generate(kernel, placement))
    assert line is not None and f"{UNPLACED_BARRIER:#x}" not in line.group(1)
    assert str(placement.barriers["store.done"]) in re.findall(r"\d+", line.group(1))


def test_an_unplaced_fixed_barrier_claims_no_id(tree):
    """Two components fixing one id collide only where both are placed."""
    loader = put("named_barriers", {"sync": {"threads": 32, "fixed": 13,
                                             "when": "rows == 64"}})
    kernel, placement = checked(tree, None, loader)
    assert "load.sync" not in placement.barriers
    tree.component("store", put(f"{DONE}.fixed", 13)(epilogue()))
    kernel = tree.check(tree.recipe(toy_recipe()))
    assert place(kernel.problem).barriers["store.done"] == 13


@pytest.mark.parametrize("ident", [str(UNPLACED_BARRIER), "-1", f"{UNPLACED_BARRIER:#x}"])
def test_linked_code_syncing_an_unplaced_barrier_is_refused(tree, ident):
    """Code that reads the field of an unplaced barrier must be dead for the params; if
    it survives into the linked kernel, verification names the barrier (ptxas itself
    would quietly keep the id's low four bits)."""
    kernel, placement = checked(tree, "rows == 64")
    ptx = (".version 9.0\n.target sm_90a\n.entry pl_toy()\n{\n"
           f"\tmov.u32 \t%r1, {ident};\n\tbarrier.sync %r1, 128;\n}}\n")
    with pytest.raises(ContractViolation) as err:
        check_linked_barriers(ptx, kernel, placement)
    assert "a barrier that is not placed" in err.value.message
    assert "store.done" in err.value.message
