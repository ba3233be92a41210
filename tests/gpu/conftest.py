"""GPU tests: run on a machine with an NVIDIA GPU against kernels built beforehand.

Build on any machine (``python -m tests.gpu.build``) and point PIPELINK_GPU_BUILD at the
folder (default ``build/gpu``). Without a GPU or a build these tests skip.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

BUILD = Path(os.environ.get("PIPELINK_GPU_BUILD", "build/gpu"))


def _gpu() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _gpu():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU and PyTorch")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def build_dir() -> Path:
    return BUILD
