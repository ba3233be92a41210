"""The kernel-level register budget: contracts state needs, the placer spreads the pool."""

from __future__ import annotations

import pytest

from pipelink.place import place, register_pool
from pipelink.problem import Problem, Role


def role(name: str, warps: int, registers: int, warpgroup: bool = False,
         live: tuple[int, int] | None = None) -> Role:
    return Role(name, warps, registers, warpgroup, (name,), f"{name}.yaml", live)


# (roles, placed setmaxnreg values per warpgroup)
CASES = {
    # The GEMM: a 40-register producer beside two math warpgroups that need 168 each get
    # the 128 spare registers of the 3 x 168 pool: CUTLASS's 40/232/232.
    "wgmma": ((role("load", 1, 40), role("mma", 8, 168, True)), (40, 232, 232)),
    "umma": ((role("load", 1, 40), role("mma", 8, 176, True)), (40, 232, 232)),
    # Nothing runs whole warpgroups: every warpgroup keeps its need.
    "no_math": ((role("load", 1, 40), role("reduce", 4, 64)), (64, 64)),
    # The spare stops at setmaxnreg's top, 256; the other warpgroup keeps its need.
    "capped": ((role("a", 4, 24), role("b", 4, 200, True)), (24, 256)),
    # A pool with no spare step left changes nothing.
    "full": ((role("load", 1, 40), role("mma", 8, 232, True)), (40, 232, 232)),
    # A role of another phase on a math warpgroup's warps (an elementwise pass between
    # two GEMMs) leaves it the spare: phases take turns on the warps.
    "phases": ((role("load", 1, 40, live=(0, 1)), role("mma", 8, 168, True, live=(0, 1)),
                role("pass", 12, 64, live=(1, 2))), (64, 216, 216)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_spare_registers_go_to_the_math_warpgroups(name):
    roles, expected = CASES[name]
    placement = place(Problem("sm_90a", roles=roles))
    assert placement.warpgroup_regs == expected
    assert sum(placement.warpgroup_regs) <= register_pool(len(expected))
    for r in roles:
        first = placement.roles[r.name].warp_base // 4
        assert placement.warpgroup_regs[first] >= r.registers
