"""Weight layouts the kernels take, built from the tensors a PyTorch model holds."""

from __future__ import annotations

from typing import Any

from ..errors import RuntimeLaunchError

SWIGLU_BLOCK = 8   # gate and up rows alternate in blocks of 8 (components/swiglu_epilogue)


def interleave_gate_up(w_gate: Any, w_up: Any) -> Any:
    """The fused gate/up weight of the SwiGLU epilogues: W[..., 16q + r, :] =
    W_gate[..., 8q + r, :] and W[..., 16q + 8 + r, :] = W_up[..., 8q + r, :], so a thread
    holds both halves of every output it writes. Takes [I, K] (a linear layer) or
    [E, I, K] (one per expert); I must be a multiple of 8 (pad both with zero rows)."""
    if w_gate.shape != w_up.shape or w_gate.dim() not in (2, 3):
        raise RuntimeLaunchError(f"gate {list(w_gate.shape)} and up {list(w_up.shape)} must "
                                 "be one [I, K] or [E, I, K] shape")
    *lead, i, k = w_gate.shape
    if i % SWIGLU_BLOCK:
        raise RuntimeLaunchError(f"the intermediate size {i} is not a multiple of "
                                 f"{SWIGLU_BLOCK}", hint="pad W_gate and W_up with zero rows "
                                 "and slice the output")
    blocks = (*lead, i // SWIGLU_BLOCK, 1, SWIGLU_BLOCK, k)
    import torch
    return torch.cat([w_gate.reshape(blocks), w_up.reshape(blocks)], dim=-3) \
        .reshape(*lead, 2 * i, k)
