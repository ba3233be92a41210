"""The attention forward's 192-row query tiles on sm_90a, with real nvcc and nvJitLink
(no GPU): attn_fwd_core refuses a query tile its warpgroups cannot split or whose
registers do not fit, naming what to change; attn_causal_d64's forward links three
consumer warpgroups of 160 registers beside a 32-register producer without a spill,
and the setmaxnreg values in its SASS are those."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from pipelink.compile import CompileOptions, compile_component
from pipelink.errors import ContractError

from .sass import sass

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "components" / "attn_fwd_core" / "contract.yaml"
PRODUCER_REGISTERS = 32
CONSUMER_REGISTERS = 160
CONSUMER_WARPGROUPS = 3
WARPGROUP_THREADS = 128
pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")


@pytest.mark.parametrize("params,needle", [
    ({"tile_m": 192, "head_dim": 128}, "tile_m 192 needs head_dim 64"),
    ({"tile_m": 256, "head_dim": 64}, "requires tile_m in (64, 128, 192)"),
    ({"tile_m": 96, "head_dim": 64}, "requires tile_m in (64, 128, 192)"),
])
def test_a_query_tile_the_core_cannot_take_is_refused_before_nvcc(tmp_path, params, needle):
    """The contract's rules refuse it as the params bind; nothing is compiled or written."""
    with pytest.raises(ContractError) as e:
        compile_component(CORE, params, CompileOptions("sm_90a"), tmp_path / "core.o")
    assert "attn_fwd_core" in str(e.value)
    assert needle in str(e.value)
    assert not any(tmp_path.iterdir())


def test_the_d64_forward_links_three_consumer_warpgroups_without_spills(link_repo_kernel):
    """The link's own check refuses a spill; the SASS shows no local memory either, and
    the producer warpgroup gives back to 32 what the consumers take up to 160."""
    result = link_repo_kernel("attn_causal_d64", "sm_90a", kernel="forward")
    placement = result.placement
    assert placement.threads == (CONSUMER_WARPGROUPS + 1) * WARPGROUP_THREADS
    assert placement.warpgroup_regs == (PRODUCER_REGISTERS,) + \
        (CONSUMER_REGISTERS,) * CONSUMER_WARPGROUPS
    text = sass(result.cubin)
    assert not re.search(r"\b(LDL|STL)\b", text)
    assert re.search(rf"USETMAXREG\.DEALLOC\.CTAPOOL {PRODUCER_REGISTERS:#x}\b", text)
    assert re.search(rf"USETMAXREG\.TRY_ALLOC\.CTAPOOL UP\d, {CONSUMER_REGISTERS:#x}\b", text)
