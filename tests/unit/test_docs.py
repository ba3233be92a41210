"""The committed references are exactly what the schema generates, so they cannot drift."""

from __future__ import annotations

import pytest

from pipelink import docs

from ..conftest import ROOT


@pytest.mark.parametrize("rel", sorted(docs.REFERENCES))
def test_committed_reference_is_generated(rel):
    committed = (ROOT / rel).read_text()
    assert committed == docs.REFERENCES[rel](), f"{rel} is stale: run python -m pipelink.docs"


def test_check_mode_reports_a_stale_copy(tmp_path, capsys):
    assert docs.main([str(tmp_path)]) == 0
    assert docs.main(["--check", str(tmp_path)]) == 0
    (tmp_path / "docs" / "recipe-reference.md").write_text("edited by hand\n")
    assert docs.main(["--check", str(tmp_path)]) == 1
    assert "docs/recipe-reference.md" in capsys.readouterr().err


def test_every_schema_key_has_a_row():
    text = docs.contract_reference()
    for key in ("`component`", "`ports.<name>.stages`", "`args[].box`", "`tunables`"):
        assert f"| {key} |" in text
    assert "| `objective.maximize` |" in docs.recipe_reference()
