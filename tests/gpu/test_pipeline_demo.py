"""Every transfer kind on the GPU: zero-copy, conversion, register and global hand-offs."""

from __future__ import annotations

import pytest

from .demo_check import ROWS, run

pytestmark = pytest.mark.gpu

# fp32 sums of bf16 values in a different order than the float64 reference.
TOLERANCE = 1e-5


@pytest.mark.parametrize("mode", ["linked", "mono"])
@pytest.mark.parametrize("m,k,seed", [(64 * ROWS, 16 * 64, 0), (17 * ROWS, 3 * 64, 1),
                                      (128 * ROWS, 64, 2)])
def test_matches_pytorch(build_dir, mode, m, k, seed):
    folder = build_dir / ("sm_90a" if mode == "linked" else "mono") / "pipeline_demo"
    if not folder.is_dir():
        pytest.skip(f"{folder} not built")
    errors = run(str(folder), m, k, seed)
    assert all(e < TOLERANCE for e in errors.values()), errors
