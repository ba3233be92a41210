"""pipeline_demo against a PyTorch reference: importable by the gpu test, and runnable
alone so compute-sanitizer can wrap exactly one checked launch::

    compute-sanitizer --tool racecheck python -m tests.gpu.demo_check build/gpu/sm_90a/pipeline_demo
"""

from __future__ import annotations

import sys

ROWS, COLS, GROUPS = 128, 64, 8


def reference(x, y):  # noqa: ANN001, ANN201  (torch tensors)
    """xsums/ysums[m, j]: sum over k with (k % COLS) // (COLS // GROUPS) == j of the bf16
    value (x converted to bf16 first); neighbors[t]: row totals of tile (t + 1) mod T."""
    import torch
    m, k = x.shape
    def group_sums(t):  # noqa: ANN001, ANN202
        t = t.to(torch.bfloat16).double().reshape(m, k // COLS, GROUPS, COLS // GROUPS)
        return t.sum(dim=(1, 3))
    xs, ys = group_sums(x), group_sums(y)
    tiles = m // ROWS
    totals = xs.sum(dim=1).reshape(tiles, ROWS).sum(dim=1)
    return xs, ys, torch.roll(totals, -1)


def run(folder: str, m: int = 64 * ROWS, k: int = 16 * COLS, seed: int = 0) -> dict[str, float]:
    """One launch on fresh random inputs with poisoned outputs; relative errors."""
    import torch

    import pipelink
    op = pipelink.load(folder)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, device="cuda", generator=gen)
    y = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
    poison = {name: torch.full(shape, float("nan"), device="cuda") for name, shape in
              (("xsums", (m, GROUPS)), ("ysums", (m, GROUPS)), ("neighbors", (m // ROWS,)))}
    xs, ys, nb = op(x, y, out=poison)
    torch.cuda.synchronize()
    ref = reference(x, y)
    errors = {}
    for name, got, want in zip(("xsums", "ysums", "neighbors"), (xs, ys, nb), ref, strict=True):
        assert not torch.isnan(got).any(), f"{name}: unwritten (NaN poison) elements remain"
        errors[name] = float((got.double() - want).norm() / want.norm())
    return errors


if __name__ == "__main__":
    result = run(sys.argv[1])
    print(result)
    sys.exit(0 if all(v < 1e-5 for v in result.values()) else 1)
