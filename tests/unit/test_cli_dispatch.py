"""`pipelink dispatch`: which kernel of a dispatching recipe a call of given sizes runs,
with each condition's two sides evaluated, decided as the runtime decides, on the host
sizes given (an H100's or H200's unless told)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipelink import cli

ROOT = Path(__file__).resolve().parents[2]
AUTO = str(ROOT / "recipes" / "gemm_auto.yaml")
SHAPE = ("M=256", "N=22016", "K=4096")


def test_dispatch_names_the_kernel_and_shows_each_condition(capsys):
    assert cli.main(["dispatch", AUTO, *SHAPE]) == 0
    out = capsys.readouterr().out
    assert "short: M <= 128: 256 <= 128, fails" in out
    assert "mid: M <= 512: 256 <= 512, holds" in out
    assert out.splitlines()[-1] == ("gemm_auto runs mid for num_sms=132, l2_bytes=52428800, "
                                    "M=256, N=22016, K=4096")


@pytest.mark.parametrize("flags,kernel", [
    ((), "mid"),                                        # 140 tiles: more than 132 SMs
    (("--num-sms", "148"), "short"),
    (("--num-sms", "148", "--l2-bytes", str(16 * 2**20)), "mid"),   # B is 36.7 MB
])
def test_dispatch_follows_the_host_sizes_given(tmp_path, capsys, flags, kernel):
    # gemm_auto with `short` kept to one whole wave of tiles whose B fits in L2
    data = yaml.safe_load(Path(AUTO).read_text())
    data["dispatch"][0]["when"] = ["ceil_div(M, 128) * ceil_div(N, 128) <= num_sms",
                                   "N * K * 2 <= l2_bytes"]
    recipe = tmp_path / "gemm_auto.yaml"
    recipe.write_text(yaml.safe_dump(data, sort_keys=False))
    assert cli.main(["dispatch", str(recipe), "M=128", "N=17920", "K=1024", *flags]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith(f"gemm_auto runs {kernel} ")


@pytest.mark.parametrize("args,needles", [
    ((AUTO,), ("of kernel 'short' names M", "give M=<int>")),
    ((AUTO, "M=x"), ("'M=x': write size=integer",)),
    ((str(ROOT / "recipes" / "gemm.yaml"), "M=1"), ("has no dispatch: section",)),
])
def test_dispatch_refuses_bad_input_in_one_message(capsys, args, needles):
    assert cli.main(["dispatch", *args]) == cli.EXIT_USER
    err = capsys.readouterr().err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, err
