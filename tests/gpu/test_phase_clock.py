"""Phase clocks: a build linked with --phase-clock computes the same bytes as the plain
build, and op.phase_times() says where a launch's time went, phase by phase, in a way
that agrees with CUDA events around the launch. A plain build refuses the question."""

from __future__ import annotations

import pytest

from pipelink.errors import RuntimeLaunchError

from .gemm_check import interleave
from .test_mlp import _inputs

pytestmark = pytest.mark.gpu

M, K, N, D = 4096, 2048, 5632, 2048          # mlp: X [M, K], W1 [N, K], W2 [D, N / 2]


def _load(build_dir, folder):  # noqa: ANN001, ANN202
    import pipelink
    path = build_dir / folder / "mlp"
    if not path.is_dir():
        pytest.fail(f"{path} not built: run python -m tests.gpu.build mlp")
    return pipelink.load(path)


def test_phase_clock_build_matches_and_times_each_phase(build_dir):
    import torch
    plain, clocked = _load(build_dir, "sm_90a"), _load(build_dir, "phases")
    x, wg, wu, w2 = _inputs(M, K, N, D, seed=7)
    w1 = interleave(wg, wu)
    h, y = plain(x, w1, w2)
    for _ in range(3):                                  # warm, then the timed launch
        hc, yc = clocked(x, w1, w2)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    hc, yc = clocked(x, w1, w2)
    end.record()
    times = clocked.phase_times()
    assert torch.equal(hc, h) and torch.equal(yc, y), "the clocks changed the results"
    assert list(times) == ["up", "down", "total"], times
    assert all(t > 0 for t in times.values()), times
    assert times["up"] + times["down"] == pytest.approx(times["total"])
    event_ms = start.elapsed_time(end)
    # The clocks run inside the launch the events bracket: never longer, and most of it.
    assert 0.5 * event_ms <= times["total"] <= event_ms * 1.02 + 0.01, (times, event_ms)
    # 'up' has twice the FLOPs of 'down' at these shapes (M N K vs M D N / 2).
    assert times["up"] > times["down"], times


def test_plain_build_has_no_phase_clock(build_dir):
    plain = _load(build_dir, "sm_90a")
    with pytest.raises(RuntimeLaunchError, match="linked without phase clocks"):
        plain.phase_times()
