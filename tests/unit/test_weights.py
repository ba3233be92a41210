"""pipelink.interleave_gate_up: the SwiGLU recipes' fused weight, for one linear layer
and for a stack of experts, and its refusals."""

from __future__ import annotations

import pytest
import torch

import pipelink
from pipelink.errors import RuntimeLaunchError


@pytest.mark.parametrize("lead", [(), (3,)])
def test_rows_alternate_in_blocks_of_eight(lead):
    gate = torch.randn(*lead, 24, 5)
    up = torch.randn(*lead, 24, 5)
    w = pipelink.interleave_gate_up(gate, up)
    assert w.shape == (*lead, 48, 5)
    for q in range(3):
        for r in range(8):
            assert torch.equal(w[..., 16 * q + r, :], gate[..., 8 * q + r, :])
            assert torch.equal(w[..., 16 * q + 8 + r, :], up[..., 8 * q + r, :])


@pytest.mark.parametrize("gate,up,words", [
    (torch.randn(12, 4), torch.randn(12, 4), ["12", "multiple of 8", "pad"]),
    (torch.randn(16, 4), torch.randn(8, 4), ["[16, 4]", "[8, 4]"]),
    (torch.randn(16), torch.randn(16), ["[I, K] or [E, I, K]"]),
])
def test_refusals_say_what_to_change(gate, up, words):
    with pytest.raises(RuntimeLaunchError) as err:
        pipelink.interleave_gate_up(gate, up)
    for word in words:
        assert word in str(err.value)
