"""docs/pytorch.md runs as written: every python block, in order, in one namespace,
against the kernels built for the GPU tests."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

DOC = Path(__file__).resolve().parents[2] / "docs" / "pytorch.md"


def test_every_block_runs(build_dir):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) >= 6
    scope: dict = {}
    for i, block in enumerate(blocks):
        code = block.replace("build/dev/", f"{build_dir}/")
        exec(compile(code, f"{DOC.name}[block {i}]", "exec"), scope)  # noqa: S102
