"""One grouped_gemm launch with straddling and empty experts and malformed ends, for
compute-sanitizer: ``python -m tests.gpu.grouped_check build/gpu/sm_90a``."""

from __future__ import annotations

import sys


def main(folder: str) -> None:
    import torch

    import pipelink
    from tests.gpu.test_grouped_gemm import ATOL, RTOL, inputs, reference
    op = pipelink.load(f"{folder}/grouped_gemm")
    for sizes, ends in (([70, 0, 300, 1, 129], None), ([200, 0, 0], [150, 90, 9999])):
        a, b, cumulative = inputs(len(sizes), sizes, 1000, 136, seed=len(sizes))
        if ends is not None:
            cumulative = torch.tensor(ends, device="cuda", dtype=torch.int32)
        out = op(a, b, cumulative)
        torch.cuda.synchronize()
        clamped = cumulative.clamp(max=a.shape[0]).cummax(0).values
        written = int(clamped[-1])
        torch.testing.assert_close(out[:written].float(), reference(a, b, clamped)[:written],
                                   atol=ATOL, rtol=RTOL)
    print("grouped_gemm ok")


if __name__ == "__main__":
    main(sys.argv[1])
