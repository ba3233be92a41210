"""moe_ffn: an MoE layer's expert FFN (grouped SwiGLU up-projection, then the grouped
down-projection, two phases of one launch) against PyTorch in fp32, expert by expert,
on fresh random inputs. Outputs are poisoned with NaN first and compared element by
element: a row written for the wrong expert, a tile that crossed into the next
expert's rows, or a 'down' tile that read H before 'up' finished it fails."""

from __future__ import annotations

import math

import pytest

from pipelink import interleave_gate_up

from .test_grouped_gemm import expert_rows, uneven_sizes

pytestmark = pytest.mark.gpu

ATOL, RTOL = 2e-2, 2e-2   # bf16 outputs of fp32 sums, values O(1)
CASES = [  # (expert sizes, D, F): skewed, empty experts, ragged rows, one expert
    ([70, 0, 300, 1, 129], 256, 136),
    (uneven_sizes(8, 3000, empty=2, seed=3), 1024, 704),
    ([1800, 100, 0, 300, 800, 0, 0, 0], 512, 512),   # one expert gets 60% of the rows
    ([5], 128, 64),
    (uneven_sizes(64, 6000, empty=5, seed=11), 512, 176),
]


def _inputs(sizes: list[int], d: int, f: int, seed: int):  # noqa: ANN202
    import torch
    gen = torch.Generator(device="cuda").manual_seed(seed)
    e = len(sizes)
    x = torch.randn(sum(sizes), d, device="cuda", generator=gen).to(torch.bfloat16)
    wg, wu = (torch.randn(2, e, f, d, device="cuda", generator=gen) / math.sqrt(d)) \
        .to(torch.bfloat16)
    w2 = (torch.randn(e, d, f, device="cuda", generator=gen) / math.sqrt(f)).to(torch.bfloat16)
    w1 = interleave_gate_up(wg, wu)
    return x, wg, wu, w1, w2, expert_rows(sizes)


@pytest.mark.parametrize("mode", ["sm_90a", "mono"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_expert_ffn_matches_pytorch(build_dir, mode, case):
    import torch

    import pipelink
    sizes, d, f = CASES[case]
    op = pipelink.load(build_dir / mode / "moe_ffn")
    x, wg, wu, w1, w2, ends = _inputs(sizes, d, f, seed=case)
    h = torch.full((x.shape[0], f), float("nan"), device="cuda", dtype=torch.bfloat16)
    y = torch.full((x.shape[0], d), float("nan"), device="cuda", dtype=torch.bfloat16)
    op(x, w1, w2, ends, out={"h": h, "y": y})
    torch.cuda.synchronize()
    silu = torch.nn.functional.silu
    begin = 0
    for e, end in enumerate(ends.tolist()):
        rows = slice(begin, end)
        xe = x[rows].float()
        h_ref = silu(xe @ wg[e].float().t()) * (xe @ wu[e].float().t())
        torch.testing.assert_close(h[rows].float(), h_ref, atol=ATOL, rtol=RTOL,
                                   msg=lambda m, e=e: f"expert {e} H: {m}")
        # 'down' against the H it read: H's rounding is phase 'up''s.
        torch.testing.assert_close(y[rows].float(), h[rows].float() @ w2[e].float().t(),
                                   atol=ATOL, rtol=RTOL, msg=lambda m, e=e: f"expert {e} Y: {m}")
        begin = end
