"""Disassembly helpers for tests (cuobjdump from the nvidia-cuda-cuobjdump wheel)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path


def cuobjdump() -> str | None:
    for site in map(Path, sys.path):
        for sub in ("nvidia/cuda_cuobjdump/bin/cuobjdump", "nvidia/cu13/bin/cuobjdump"):
            if (site / sub).is_file():
                return str(site / sub)
    return shutil.which("cuobjdump")


def sass(cubin: Path) -> str:
    tool = cuobjdump()
    if tool is None:
        import pytest
        pytest.skip("cuobjdump not installed (pip install nvidia-cuda-cuobjdump)")
    # cuobjdump runs nvdisasm, which the nvidia-cuda-nvdisasm wheel puts beside it.
    env = {**os.environ, "PATH": f"{Path(tool).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run([tool, "--dump-sass", str(cubin)], capture_output=True, text=True,
                          check=True, env=env).stdout


def sass_instructions(cubin: Path) -> list[str]:
    """Opcodes of every SASS instruction, NOPs excluded."""
    ops = []
    for line in sass(cubin).splitlines():
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Za-z0-9_.]*)", line)
        if m and m.group(2) != "NOP":
            ops.append(m.group(2))
    return ops
