"""grouped_gemm (grouped_scheduler + grouped_store_epilogue) against PyTorch in fp32,
expert by expert, on fresh random inputs with uneven and empty experts. Outputs are
poisoned with NaN first and compared element by element, so one wrong 8 x 8 block, a
row written for the wrong expert, or a row left unwritten fails."""

from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.gpu

ATOL, RTOL = 2e-2, 1.6e-2   # bf16 output rounding (2^-7) on O(1) values; fp32 accumulation


def expert_rows(sizes: list[int]):  # noqa: ANN201
    import torch
    return torch.tensor(sizes, device="cuda", dtype=torch.int32).cumsum(0).to(torch.int32)


def uneven_sizes(groups: int, tokens: int, empty: int, seed: int) -> list[int]:
    """Router-like expert sizes: skewed, `empty` experts with no tokens, summing to tokens."""
    import torch
    gen = torch.Generator().manual_seed(seed)
    weights = torch.rand(groups, generator=gen) ** 3
    weights[torch.randperm(groups, generator=gen)[:empty]] = 0
    sizes = (weights / weights.sum() * tokens).floor().long()
    sizes[int(weights.argmax())] += tokens - int(sizes.sum())
    return sizes.tolist()


def reference(a, b, ends):  # noqa: ANN001, ANN201
    import torch
    out = torch.full((a.shape[0], b.shape[1]), float("nan"), device="cuda")
    begin = 0
    for g, end in enumerate(ends.tolist()):
        out[begin:end] = a[begin:end].float() @ b[g].float().t()
        begin = end
    return out


def inputs(groups: int, sizes: list[int], n: int, k: int, seed: int):  # noqa: ANN201
    import torch
    gen = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(sum(sizes), k, device="cuda", generator=gen).to(torch.bfloat16)
    b = (torch.randn(groups, n, k, device="cuda", generator=gen) / math.sqrt(k)).to(torch.bfloat16)
    return a, b, expert_rows(sizes)


CASES = [  # groups, tokens, empty experts, N, K
    (8, 2000, 1, 512, 256),
    (8, 777, 2, 384, 200),      # ragged K and an N tile half outside every expert's B
    (64, 5000, 9, 256, 128),
    (64, 300, 40, 1000, 64),    # most experts empty, most tiles straddle two experts
    (3, 129, 0, 996, 72),       # N % 8 != 0: the epilogue's element-wise last piece
]


@pytest.mark.parametrize("mode", ["sm_90a", "mono"])
@pytest.mark.parametrize("groups,tokens,empty,n,k", CASES)
def test_matches_pytorch_expert_by_expert(build_dir, mode, groups, tokens, empty, n, k):
    import torch

    import pipelink
    op = pipelink.load(build_dir / mode / "grouped_gemm")
    sizes = uneven_sizes(groups, tokens, empty, seed=groups * 7 + n)
    a, b, ends = inputs(groups, sizes, n, k, seed=tokens)
    out = torch.full((tokens, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    op(a, b, ends, out=out)
    torch.testing.assert_close(out.float(), reference(a, b, ends), atol=ATOL, rtol=RTOL)


def test_rows_outside_every_expert_stay_untouched(build_dir):
    """ends[-1] < M: the rows past the last expert belong to nobody and keep their bytes."""
    import torch

    import pipelink
    op = pipelink.load(build_dir / "sm_90a" / "grouped_gemm")
    sizes = [100, 0, 250, 37]
    a, b, ends = inputs(4, sizes, 512, 128, seed=3)
    a = torch.cat([a, torch.randn(90, 128, device="cuda").to(torch.bfloat16)])
    out = torch.full((a.shape[0], 512), float("nan"), device="cuda", dtype=torch.bfloat16)
    op(a, b, ends, out=out)
    ref = reference(a, b, ends)
    torch.testing.assert_close(out[:sum(sizes)].float(), ref[:sum(sizes)], atol=ATOL, rtol=RTOL)
    assert torch.isnan(out[sum(sizes):]).all(), "rows past the last expert were written"


def test_malformed_ends_never_address_outside_a_or_c(build_dir):
    """Ends that run backwards or past M are clamped: what is written is the product of
    the clamped experts, and a guard band around C stays poisoned."""
    import torch

    import pipelink
    op = pipelink.load(build_dir / "sm_90a" / "grouped_gemm")
    m, n, k, groups = 300, 256, 64, 4
    a, b, _ = inputs(groups, [m, 0, 0, 0], n, k, seed=5)
    ends = torch.tensor([120, 60, 5000, 7], device="cuda", dtype=torch.int32)
    clamped = torch.tensor([120, 120, 300, 300], device="cuda", dtype=torch.int32)
    guard = torch.full((m + 2 * 128, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    out = guard[128:128 + m]
    op(a, b, ends, out=out)
    torch.testing.assert_close(out.float(), reference(a, b, clamped), atol=ATOL, rtol=RTOL)
    assert torch.isnan(guard[:128]).all() and torch.isnan(guard[128 + m:]).all()


def test_checks_the_expert_count_and_dtype_before_launch(build_dir):
    import torch

    import pipelink
    from pipelink.errors import RuntimeLaunchError
    op = pipelink.load(build_dir / "sm_90a" / "grouped_gemm")
    a, b, ends = inputs(4, [10, 20, 30, 40], 256, 64, seed=1)
    with pytest.raises(RuntimeLaunchError, match="ends"):
        op(a, b, ends[:3])
    with pytest.raises(RuntimeLaunchError, match="ends"):
        op(a, b, ends.to(torch.int64))
