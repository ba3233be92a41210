"""`pipelink dispatch`: which kernel of a dispatching recipe a call of given sizes runs,
with each condition's two sides evaluated, decided as the runtime decides, on the host
sizes given (an H100's unless told)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelink import cli

ROOT = Path(__file__).resolve().parents[2]
AUTO = str(ROOT / "recipes" / "gemm_auto.yaml")
SHAPE = ("M=256", "N=22016", "K=4096")


def test_dispatch_names_the_kernel_and_shows_each_condition(capsys):
    assert cli.main(["dispatch", AUTO, *SHAPE]) == 0
    out = capsys.readouterr().out
    assert "narrow: M <= 512: 256 <= 512, holds" in out
    assert "42 < 48, holds" in out         # 21 * 2 waves of 168 < 24 * 2 waves of 192
    assert "5544 < 6560, holds" in out     # 21 * 132 * 2 < 32 * 172 tiles + 8 * 132
    assert out.splitlines()[-1].startswith("gemm_auto runs narrow for num_sms=132")


def test_dispatch_follows_the_host_sizes_and_arch_given(capsys):
    """On sm_100a `narrow` is not built (no 168-wide tcgen05.mma at M = 128): its entry
    is skipped, and with 148 SMs `even`'s two waves lose to stream-K's `mid`."""
    assert cli.main(["dispatch", AUTO, *SHAPE, "--num-sms", "148", "--arch", "sm_100a"]) == 0
    out = capsys.readouterr().out
    assert "narrow: not built for sm_100a, skipped" in out
    assert "888 < 836, fails" in out       # two waves of 148 CTAs: stream-K's `mid` wins
    assert out.splitlines()[-1].startswith("gemm_auto runs mid for num_sms=148")


@pytest.mark.parametrize("args,needles", [
    ((AUTO, "M=256"), ("of kernel 'narrow' names N", "give N=<int>")),
    ((AUTO, "M=1", "--arch", "sm_120a"), ("does not build for sm_120a", "sm_90a, sm_100a")),
    ((AUTO, "M=x"), ("'M=x': write size=integer",)),
    ((AUTO, "M=-5", "N=1", "K=1"), ("'M=-5': write size=integer, the integer >= 0",)),
    ((AUTO, *SHAPE, "num_sms=0"), ("'num_sms=0': a GPU has num_sms >= 1",)),
    ((str(ROOT / "recipes" / "gemm.yaml"), "M=1"), ("has no dispatch: section",)),
])
def test_dispatch_refuses_bad_input_in_one_message(capsys, args, needles):
    assert cli.main(["dispatch", *args]) == cli.EXIT_USER
    err = capsys.readouterr().err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, err
