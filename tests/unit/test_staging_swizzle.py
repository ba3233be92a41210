"""A tensormap's swizzle may follow a param (store_epilogue's `swizzle`: 128 for 64-column
staging chunks, 0 for narrower ones such as 168 = 3 x 56): the bound contract evaluates
it into kernel.json, and a value TMA has no mode for is refused at bind time, naming
the argument and the params."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelink.contract import load_contract
from pipelink.errors import ContractError

ROOT = Path(__file__).resolve().parents[2]
STORE = ROOT / "components" / "store_epilogue" / "contract.yaml"


def _swizzle(bound) -> int:  # noqa: ANN001
    arg = next(a for a in bound.contract.data["args"] if a["name"] == "tma_c")
    return bound.eval(arg["swizzle"], "args.tma_c.swizzle")


@pytest.mark.parametrize("params,swizzle", [
    ({}, 128),
    ({"tile_n": 168, "store_n": 56, "swizzle": 0, "buffers": 3}, 0),
])
def test_the_store_map_swizzles_as_its_staging(params, swizzle):
    assert _swizzle(load_contract(STORE).bind(params)) == swizzle


def test_a_swizzle_tma_lacks_is_refused_at_bind():
    with pytest.raises(ContractError) as err:
        load_contract(STORE).bind({"swizzle": 48})
    text = str(err.value)
    assert "48 is not 0, 32, 64 or 128" in text and "swizzle=48" in text
    assert "args[0].swizzle" in text and "TMA swizzles 0 (none), 32, 64 or 128 bytes" in text
