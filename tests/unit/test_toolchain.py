"""Toolchain discovery refuses what cannot work, with a message that says what to do."""

from __future__ import annotations

import pytest

from pipelink import toolchain
from pipelink.errors import ToolchainError
from pipelink.toolchain import Toolchain, check_pair, parse_nvcc_version

NVCC_13 = "Cuda compilation tools, release 13.0, V13.0.88\nBuild cuda_13.0.r13.0/compiler"


def test_reads_nvcc_version():
    assert parse_nvcc_version(NVCC_13) == (13, 0, 88)


def test_unreadable_version_is_refused_with_the_log():
    with pytest.raises(ToolchainError, match="cannot read nvcc's version") as err:
        parse_nvcc_version("nvcc: something else")
    assert "something else" in str(err.value)


@pytest.mark.parametrize("nvcc,linker,ok", [((13, 0, 88), (13, 0), True),
                                            ((12, 8, 93), (13, 0), True),
                                            ((13, 1, 0), (13, 0), False)])
def test_ltoir_must_not_be_newer_than_the_linker(nvcc, linker, ok):
    if ok:
        check_pair(nvcc, linker)
        return
    with pytest.raises(ToolchainError) as err:
        check_pair(nvcc, linker)
    assert "newer than nvJitLink 13.0" in str(err.value)
    assert "nvidia-nvjitlink==13.1.*" in str(err.value)


@pytest.mark.parametrize("version,arch,needle", [
    ((12, 4, 131), "sm_100a", "cannot build sm_100a: it needs 12.8"),
    ((13, 0, 88), "sm_89", "unknown arch 'sm_89'"),
])
def test_arch_needs_a_new_enough_nvcc(version, arch, needle):
    tc = Toolchain("/opt/cuda/bin/nvcc", version, (13, 0))
    with pytest.raises(ToolchainError, match=needle):
        tc.require_arch(arch)


def test_sm_90a_and_sm_100a_with_cuda_13():
    tc = Toolchain("nvcc", (13, 0, 88), (13, 0))
    tc.require_arch("sm_90a")
    tc.require_arch("sm_100a")
    assert tc.versions() == {"nvcc": "13.0.88", "nvjitlink": "13.0"}


def test_missing_nvcc_says_how_to_get_one(monkeypatch):
    monkeypatch.setattr(toolchain, "_nvcc_candidates", lambda: [])
    with pytest.raises(ToolchainError) as err:
        toolchain.find_nvcc()
    assert "nvcc not found" in str(err.value)
    assert "CUDA_HOME" in str(err.value) and "nvidia-cuda-nvcc" in str(err.value)
