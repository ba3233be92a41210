"""Finding nvcc and nvJitLink, reading their versions, and refusing bad pairs.

nvcc is looked up in ``$CUDA_HOME/bin``, then ``PATH``, then the pip
``nvidia-cuda-nvcc`` wheel. nvJitLink is the library cuda-python's
``cuda.bindings.nvjitlink`` loads (the ``nvidia-nvjitlink`` wheel).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .errors import ToolchainError

# The oldest nvcc that knows each arch.
MIN_NVCC_FOR_ARCH: dict[str, tuple[int, int]] = {
    "sm_90a": (12, 0), "sm_100a": (12, 8), "sm_120a": (12, 8),
}


@dataclass(frozen=True)
class Toolchain:
    nvcc: str
    nvcc_version: tuple[int, int, int]
    nvjitlink_version: tuple[int, int]

    def versions(self) -> dict[str, str]:
        """What outputs record: versions only, never absolute paths."""
        return {"nvcc": ".".join(map(str, self.nvcc_version)),
                "nvjitlink": ".".join(map(str, self.nvjitlink_version))}

    def require_arch(self, arch: str) -> None:
        need = MIN_NVCC_FOR_ARCH.get(arch)
        if need is None:
            raise ToolchainError(f"unknown arch '{arch}'",
                                 hint="archs: " + ", ".join(MIN_NVCC_FOR_ARCH))
        if self.nvcc_version[:2] < need:
            raise ToolchainError(
                f"nvcc {self.versions()['nvcc']} cannot build {arch}: it needs "
                f"{need[0]}.{need[1]} or newer", where=self.nvcc,
                hint="install a newer CUDA toolkit or set CUDA_HOME to one")


def _nvcc_candidates() -> list[Path]:
    found = []
    if os.environ.get("CUDA_HOME"):
        found.append(Path(os.environ["CUDA_HOME"]) / "bin" / "nvcc")
    on_path = shutil.which("nvcc")
    if on_path:
        found.append(Path(on_path))
    for site in map(Path, sys.path):
        found += [site / "nvidia" / "cuda_nvcc" / "bin" / "nvcc", site / "nvidia" / "cu13" /
                  "bin" / "nvcc"]
    return found


def parse_nvcc_version(text: str) -> tuple[int, int, int]:
    match = re.search(r"release \d+\.\d+, V(\d+)\.(\d+)\.(\d+)", text)
    if not match:
        raise ToolchainError("cannot read nvcc's version", log=text)
    return tuple(int(g) for g in match.groups())  # type: ignore[return-value]


def find_nvcc() -> tuple[str, tuple[int, int, int]]:
    for candidate in _nvcc_candidates():
        if candidate.is_file() and os.access(candidate, os.X_OK):
            out = subprocess.run([str(candidate), "--version"], capture_output=True, text=True)
            return str(candidate), parse_nvcc_version(out.stdout)
    raise ToolchainError("nvcc not found",
                         hint="install the CUDA toolkit (12.8+ for sm_100a) and put nvcc on "
                              "PATH, set CUDA_HOME, or pip install nvidia-cuda-nvcc")


def nvjitlink_version() -> tuple[int, int]:
    try:
        from cuda.bindings import nvjitlink
        return tuple(nvjitlink.version())  # type: ignore[return-value]
    except Exception as exc:  # a missing wheel or library surfaces here
        raise ToolchainError(f"nvJitLink is not usable: {exc}",
                             hint="pip install 'nvidia-nvjitlink==13.0.*' cuda-bindings") from None


def check_pair(nvcc: tuple[int, int, int], nvjitlink: tuple[int, int]) -> None:
    """LTO-IR must not be newer than the linker that reads it."""
    if nvcc[:2] > nvjitlink:
        raise ToolchainError(
            f"nvcc {nvcc[0]}.{nvcc[1]} writes LTO-IR newer than nvJitLink "
            f"{nvjitlink[0]}.{nvjitlink[1]} can link",
            hint=f"pip install 'nvidia-nvjitlink=={nvcc[0]}.{nvcc[1]}.*' (or newer)")


@functools.lru_cache(maxsize=1)
def discover() -> Toolchain:
    nvcc, version = find_nvcc()
    linker = nvjitlink_version()
    check_pair(version, linker)
    return Toolchain(nvcc, version, linker)
