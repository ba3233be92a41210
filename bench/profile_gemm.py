"""One launch of a built GEMM recipe, or of cuBLAS (recipe ``cublas``: torch.mm), for
Nsight Compute to profile.

    ncu --clock-control none -k regex:pl_gemm -c 1 --section SpeedOfLight \\
        --section WarpStateStats python bench/profile_gemm.py build/gpu/sm_90a gemm 8192 22016 4096
    ncu --clock-control none -k regex:nvjet -c 1 --section SpeedOfLight \\
        python bench/profile_gemm.py - cublas 256 22016 4096
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pipelink  # noqa: E402


def main() -> None:
    folder, recipe, m, n, k = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / math.sqrt(k)
    if recipe == "cublas":
        torch.mm(x, w.t())
    else:
        pipelink.load(Path(folder) / recipe)(x, w)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
