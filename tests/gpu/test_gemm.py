"""GEMM (+ SwiGLU, + bias and GELU; hand-written and CuTe mainloops) on the H200 against
PyTorch in fp32, linked and monolithic."""

from __future__ import annotations

import pytest

from .gemm_check import REFERENCE, run

pytestmark = pytest.mark.gpu

# bf16 output of fp32 accumulation: rounding alone is ~2e-3 relative.
TOLERANCE = 1e-2
SHAPES = [(128, 512, 64), (512, 2048, 4096), (1000, 1000, 1000), (300, 1008, 200),
          (2048, 4096, 4096), (77, 4112, 328)]


@pytest.mark.parametrize("recipe", ["gemm", "gemm_dynamic", "gemm_swiglu", "gemm_cute",
                                    "gemm_swiglu_cute", "gemm_bias_gelu"])
@pytest.mark.parametrize("mode", ["sm_90a", "mono"])
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_matches_pytorch(build_dir, recipe, mode, m, n, k):
    folder = build_dir / mode
    if not (folder / recipe).is_dir():
        pytest.skip(f"{folder / recipe} not built")
    if REFERENCE[recipe] == "swiglu" and n % 16:
        pytest.skip("SwiGLU interleaves gate/up in blocks of 8 rows: N is a multiple of 16")
    error = run(str(folder), recipe, m, n, k, seed=m + n + k)
    assert error < TOLERANCE, error
