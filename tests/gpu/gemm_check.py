"""GEMM, GEMM + SwiGLU and GEMM + bias + GELU against PyTorch in fp32 on fresh random
bf16 inputs. Recipes that swap a component but compute the same thing (the CuTe
components' gemm_cute, gemm_swiglu_cute; the dynamic scheduler's gemm_dynamic; the CTA
pairs of gemm_multicast) share their twin's reference.

Runnable alone (for compute-sanitizer) as
``python -m tests.gpu.gemm_check build/gpu/sm_90a gemm_swiglu 300 1000 200``.
"""

from __future__ import annotations

import math
import sys

INTERLEAVE = 8  # gate/up rows alternate in blocks of 8 (components/swiglu_epilogue)
# Per element: |y - ref| <= ATOL + RTOL |ref| (bf16 output of fp32 accumulation rounds
# at ~4e-3 relative; inputs are N(0, 1) and weights N(0, 1/K), so |ref| is about 1).
ATOL, RTOL = 2e-2, 2e-2

# recipe -> what it computes
REFERENCE = {"gemm": "gemm", "gemm_dynamic": "gemm", "gemm_cute": "gemm",
             "gemm_auto": "gemm", "gemm_multicast": "gemm", "gemm_pingpong": "gemm",
             "gemm_streamk": "gemm",
             "gemm_swiglu": "swiglu", "gemm_swiglu_pingpong": "swiglu",
             "gemm_swiglu_streamk": "swiglu", "gemm_swiglu_auto": "swiglu",
             "gemm_swiglu_cute": "swiglu", "gemm_bias_gelu": "bias_gelu"}


def interleave(w_gate, w_up):  # noqa: ANN001, ANN201  (torch tensors)
    """W[16q + r] = W_gate[8q + r], W[16q + 8 + r] = W_up[8q + r] (pipelink's helper)."""
    from pipelink import interleave_gate_up
    return interleave_gate_up(w_gate, w_up)


def excess(y, ref) -> float:  # noqa: ANN001  (torch tensors)
    """The worst element's error in units of its bound ATOL + RTOL |ref|: above 1, some
    element (one 8 x 8 block is enough) is wrong. NaN (unwritten poison) is infinite."""
    import torch
    ratio = (y.float() - ref).abs() / (ATOL + RTOL * ref.abs())
    return float(torch.nan_to_num(ratio, nan=float("inf")).max())


def run(folder: str, recipe: str, m: int, n: int, k: int, seed: int = 0) -> float:
    """The worst element's error of one launch in units of its bound (see excess),
    outputs poisoned with NaN first."""
    import torch

    import pipelink
    op = pipelink.load(f"{folder}/{recipe}")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
    computes = REFERENCE[recipe]
    if computes == "gemm":
        w = (torch.randn(n, k, device="cuda", generator=gen) / math.sqrt(k)).to(torch.bfloat16)
        ref = x.float() @ w.float().t()
        y = op(x, w, out={"c": torch.full((m, n), float("nan"), device="cuda",
                                          dtype=torch.bfloat16)})
    elif computes == "bias_gelu":
        w = (torch.randn(n, k, device="cuda", generator=gen) / math.sqrt(k)).to(torch.bfloat16)
        bias = torch.randn(n, device="cuda", generator=gen).to(torch.bfloat16)
        ref = torch.nn.functional.gelu(x.float() @ w.float().t() + bias.float(),
                                       approximate="tanh")
        y = op(x, w, bias, out={"c": torch.full((m, n), float("nan"), device="cuda",
                                                dtype=torch.bfloat16)})
    else:
        gate = (torch.randn(n // 2, k, device="cuda", generator=gen) / math.sqrt(k))
        up = (torch.randn(n // 2, k, device="cuda", generator=gen) / math.sqrt(k))
        gate, up = gate.to(torch.bfloat16), up.to(torch.bfloat16)
        ref = torch.nn.functional.silu(x.float() @ gate.float().t()) * (x.float() @ up.float().t())
        y = op(x, interleave(gate, up), out={"y": torch.full((m, n // 2), float("nan"),
                                                            device="cuda", dtype=torch.bfloat16)})
    torch.cuda.synchronize()
    assert not torch.isnan(y).any(), "unwritten (NaN poison) elements remain"
    return excess(y, ref)


if __name__ == "__main__":
    folder, recipe, *dims = sys.argv[1:]
    error = run(folder, recipe, *map(int, dims))
    print(f"{recipe} {dims}: worst element at {error:.2f} of its bound")
    sys.exit(0 if error <= 1 else 1)
