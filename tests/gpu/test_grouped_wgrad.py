"""grouped_wgrad on the H200 against PyTorch in fp32, element by element: dW[g] =
dY_g^T X_g over problems packed along K (an MoE layer's expert weight gradients), with
skewed sizes (one problem holds 60% of the rows), an empty problem (its gradient must
be zeros, not left unwritten), sizes that are not multiples of the tile, and rows past
the last problem that no problem may read. Outputs are poisoned with NaN first."""

from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.gpu

ALIGN = 64            # each problem's rows start on a k-tile (the recipe's contract)
RTOL = 2e-2


def _ends(counts: list[int]) -> list[int]:
    """Cumulative ends of segments padded to ALIGN rows."""
    ends, at = [], 0
    for c in counts:
        at += -(-c // ALIGN) * ALIGN
        ends.append(at)
    return ends


def _inputs(counts: list[int], m: int, n: int, seed: int, tail: int = 0):  # noqa: ANN202
    """dy [R, M], x [R, N] with each segment's padding rows zero (what a padded dispatch
    writes), and `tail` rows of large values past the last segment."""
    import torch
    gen = torch.Generator(device="cuda").manual_seed(seed)
    ends = _ends(counts)
    rows = ends[-1] + tail
    dy = torch.randn(rows, m, device="cuda", generator=gen) / 8
    x = torch.randn(rows, n, device="cuda", generator=gen)
    begin = 0
    for c, end in zip(counts, ends, strict=True):
        dy[begin + c:end] = 0
        x[begin + c:end] = 0
        begin = end
    dy[ends[-1]:] = 1e4        # a read past the last problem would show
    x[ends[-1]:] = 1e4
    return (dy.to(torch.bfloat16), x.to(torch.bfloat16),
            torch.tensor(ends, dtype=torch.int32, device="cuda"))


CASES = [
    # (rows per problem, M, N)
    ([300, 0, 700, 64], 256, 512),
    ([3000, 500, 0, 500, 1000, 0], 200, 136),          # skewed: 60% in problem 0
    ([1, 2, 3, 129], 128, 256),
    ([5000], 1024, 768),
]


@pytest.mark.parametrize("mode", ["sm_90a", "mono"])
@pytest.mark.parametrize(("counts", "m", "n"), CASES)
def test_grouped_wgrad_matches_pytorch(build_dir, mode, counts, m, n):
    import torch

    import pipelink
    folder = build_dir / mode / "grouped_wgrad"
    if not (folder / "kernel.json").is_file():
        pytest.skip(f"{folder} not built")
    op = pipelink.load(folder)
    dy, x, ends = _inputs(counts, m, n, seed=len(counts) + m + n, tail=70)
    poison = torch.full((len(counts), m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    dw = op(dy, x, ends, out={"dw": poison})
    torch.cuda.synchronize()
    assert not torch.isnan(dw).any(), "unwritten (NaN poison) elements remain"
    begin = 0
    for g, end in enumerate(ends.tolist()):
        ref = dy[begin:end].float().t() @ x[begin:end].float()
        scale = math.sqrt(max(end - begin, 1)) / 8      # the sums' typical size
        torch.testing.assert_close(dw[g].float(), ref, rtol=RTOL, atol=RTOL * scale,
                                   msg=lambda s, g=g: f"problem {g}: {s}")
        begin = end


def test_grouped_wgrad_is_deterministic(build_dir):
    import torch

    import pipelink
    folder = build_dir / "sm_90a" / "grouped_wgrad"
    if not (folder / "kernel.json").is_file():
        pytest.skip(f"{folder} not built")
    op = pipelink.load(folder)
    dy, x, ends = _inputs([900, 40, 2000], 256, 512, seed=5)
    first = op(dy, x, ends)
    assert all(torch.equal(first, op(dy, x, ends)) for _ in range(3))
