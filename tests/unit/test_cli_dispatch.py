"""`pipelink dispatch`: which kernel of a dispatching recipe a call of given sizes runs,
with each condition's two sides evaluated, decided as the runtime decides, on the host
sizes given (an H100's or H200's unless told)."""

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
    assert "even: M <= 512: 256 <= 512, holds" in out
    assert "792 < 820, holds" in out       # 3 * 132 * 2 waves < 4 * 172 tiles + 132
    assert out.splitlines()[-1].startswith("gemm_auto runs even for num_sms=132")


def test_dispatch_follows_the_host_sizes_given(capsys):
    assert cli.main(["dispatch", AUTO, *SHAPE, "--num-sms", "148"]) == 0
    out = capsys.readouterr().out
    assert "888 < 836, fails" in out       # two waves of 148 CTAs: stream-K's `mid` wins
    assert out.splitlines()[-1].startswith("gemm_auto runs mid for num_sms=148")


@pytest.mark.parametrize("args,needles", [
    ((AUTO, "M=256"), ("of kernel 'even' names N", "give N=<int>")),
    ((AUTO, "M=x"), ("'M=x': write size=integer",)),
    ((str(ROOT / "recipes" / "gemm.yaml"), "M=1"), ("has no dispatch: section",)),
])
def test_dispatch_refuses_bad_input_in_one_message(capsys, args, needles):
    assert cli.main(["dispatch", *args]) == cli.EXIT_USER
    err = capsys.readouterr().err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, err
