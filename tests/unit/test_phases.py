"""Phases: the real mlp recipe (gemm_swiglu then gemm, 'down' after 'up') checked,
placed and glued without a compiler. The two phases share warps, shared memory and
named barrier ids; each has its own scheduler and work ring; 'down' waits grid-wide
for 'up' through a workspace counter the runtime zeroes. Phase mistakes are refused
naming the recipe, the phase or connection, and what to change."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipelink.check import Kernel, phase_counter
from pipelink.errors import CheckError
from pipelink.glue import GlueOptions, generate
from pipelink.link import LinkOptions, phase_clock, place_kernel

from ..conftest import check_repo_recipe

ROOT = Path(__file__).resolve().parents[2]


def _check(tmp_path: Path, edit: Any = None, arch: str = "sm_90a",
           recipe: str = "mlp") -> Kernel:
    return check_repo_recipe(tmp_path, recipe, arch, edit)


@pytest.fixture(scope="module")
def mlp(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    kernel = _check(tmp_path_factory.mktemp("mlp"))
    return kernel, place_kernel(kernel, 1)


def test_phases_run_in_order_with_a_ring_each(mlp):
    kernel, _ = mlp
    assert [p.name for p in kernel.phases] == ["up", "down"]
    assert [str(w.producer) for w in kernel.works] == ["up_sched.work", "down_sched.work"]
    assert {lane.name: lane.phase for lane in kernel.lanes}["down_mma.mma+down_store.store"] == 1


def test_phases_share_warps_memory_and_barrier_ids(mlp):
    _, p = mlp
    assert p.roles["up_mma.mma+up_act.store"] == p.roles["down_mma.mma+down_store.store"]
    assert p.roles["up_load.producer"] == p.roles["down_load.producer"]
    # The down phase's stages reuse the up phase's bytes; the barriers stay apart.
    assert p.smem["down_load.a_tiles"][0] < sum(p.smem["up_load.b_tiles"])
    assert p.smem["down_load.mbar.a_full"][0] != p.smem["up_load.mbar.a_full"][0]
    assert p.barriers["up_act.staged"] == p.barriers["down_store.staged"]
    assert p.smem_bytes < 2 * (4 * 48 * 1024)   # two phases' rings would not fit side by side


def test_down_waits_for_up_grid_wide(mlp):
    kernel, p = mlp
    counter = kernel.workspace[phase_counter("up")]
    assert counter.slots == 1 and phase_counter("down") not in kernel.workspace
    glue = generate(kernel, p)
    # Each warpgroup branch ends 'up', counts it, waits for every CTA, then begins 'down'.
    for step in ("pl::phase::end(384);", f"pl::phase::arrive(k, {counter.counter_offset});",
                 f"pl::phase::wait(k, {counter.counter_offset});", "pl::phase::begin(384);"):
        assert glue.count(step) == 2, step
    body = glue.split("// Phase 0: up.")[1]
    assert body.index("pl::phase::end") < body.index("// Phase 1: down.")
    assert body.index("pl_work_up_sched") < body.index("pl::phase::end")


def test_phase_clocks_only_where_asked(mlp):
    """A --phase-clock build records a CTA's start and each phase's end after the kernel's
    own workspace; a plain build has no clock at all."""
    kernel, p = mlp
    assert "pl::phase::clock" not in generate(kernel, p)
    clock = phase_clock(kernel, LinkOptions("sm_90a", phase_clock=True))
    assert clock.offset >= kernel.workspace_bytes and clock.offset % 8 == 0
    assert clock.slots == 3 and phase_clock(kernel, LinkOptions("sm_90a")) is None
    glue = generate(kernel, p, GlueOptions(phase_clock=clock))
    # Once each, from the first thread of a math warpgroup (the producer warpgroup's 40
    # registers have none to spare), every CTA thread having met at the phase's end.
    for slot in range(clock.slots):
        call = f"pl::phase::clock(k, {clock.offset}, {clock.ctas}, {clock.slots}, {slot}, 128);"
        assert glue.count(call) == 1, (slot, glue.count(call))
    body = glue.rsplit("// Phase 0: up.", 1)[1]                # the math warpgroups' branch
    assert body.index("pl::phase::end") < body.index(", 1, 128);  // phase 'up' ends")


def test_phases_share_tensor_memory_on_sm100(tmp_path):
    """Each phase's MMA warp wants all 512 columns (two 256-column accumulators): the
    phases take turns on them, the first phase's MMA role allocates, and the glue fences
    tcgen05 traffic around the CTA barrier between the phases."""
    kernel = _check(tmp_path, arch="sm_100a")
    p = place_kernel(kernel, 1)
    assert p.tmem == {"up_mma.acc": (0, 512), "down_mma.acc": (0, 512)}
    assert kernel.tmem_allocator == ("up_mma", "mma")
    glue = generate(kernel, p)
    boundary = glue.split("// Phase 0: up.")[1].split("// Phase 1: down.")[0]
    order = [boundary.index("tcgen05.fence::before_thread_sync"),
             boundary.index("pl::phase::end"), boundary.index("pl::phase::begin"),
             boundary.index("tcgen05.fence::after_thread_sync")]
    assert order == sorted(order)


def test_five_phases_of_moe_forward_take_turns_on_the_warps(tmp_path):
    """dispatch, permute, up, down, combine: three phases without a scheduler (one pass
    per CTA), two with one; 8-warp data-movement roles reuse the consumer warps, and
    each phase waits for the one before it."""
    kernel = _check(tmp_path, recipe="moe_forward")
    assert [ph.name for ph in kernel.phases] == ["dispatch", "permute", "up", "down",
                                                 "combine"]
    assert [w is not None for w in kernel.works] == [False, False, True, True, False]
    assert [phase_counter(n) in kernel.workspace for n in
            ("dispatch", "permute", "up", "down", "combine")] == [True] * 4 + [False]
    p = place_kernel(kernel, 1)
    assert p.threads == 384          # the GEMM phases' warps; the others fit inside them
    assert p.smem["dispatch.table"][0] < p.smem_bytes


def _phases(**phases: Any):  # noqa: ANN202
    def edit(data: dict[str, Any]) -> None:
        for name, spec in phases.items():
            if spec is None:
                data["phases"].pop(name)
            else:
                data["phases"][name] = spec
    return edit


def _launch(key: str, value: Any):  # noqa: ANN202
    def edit(data: dict[str, Any]) -> None:
        data["launch"][key] = value
    return edit


UP = ["up_sched", "up_load", "up_mma", "up_act"]
DOWN = ["down_sched", "down_load", "down_mma", "down_store"]


@pytest.mark.parametrize("edit,words", [
    (_phases(up={"instances": UP, "after": ["down"]}),
     ["phases.", "cycle", "up -> down -> up"]),
    (_phases(down={"instances": DOWN[:-1], "after": ["up"]}),
     ["instances.down_store", "in no phase", "up, down"]),
    (_phases(down={"instances": DOWN + ["up_act"], "after": ["up"]}),
     ["phases.down.instances", "'up_act' is in phases 'up' and 'down'"]),
    (_phases(down={"instances": DOWN, "after": ["upp"]}),
     ["phases.down.after", "'upp', which is not a phase"]),
    (_phases(up={"instances": UP[:-1]}, down={"instances": DOWN + ["up_act"],
                                              "after": ["up"]}),
     ["connect[5]", "'up_mma.acc' is in phase 'up'", "cannot cross phases", "a tensor"]),
    (_launch("persistent", False), ["launch.persistent", "resident"]),
    (_phases(up={"instances": UP + DOWN}, down=None),
     ["phases.up", "more than one scheduler: up_sched, down_sched"]),
    # Without after: 'down' read H while other CTAs were still writing it.
    (_phases(down={"instances": DOWN}),
     ["phases.down.after", "phases 'up' and 'down' both use 'h'", "neither runs after",
      "list 'up' under phases.down.after"]),
])
def test_phase_mistakes_are_refused(tmp_path, edit, words):
    with pytest.raises(CheckError) as err:
        _check(tmp_path, edit)
    text = str(err.value)
    assert "recipes/mlp.yaml" in text
    for word in words:
        assert word in text, text


@pytest.mark.parametrize("condition,words", [
    ("Q <= 64", ["launch.require[3]", "names size Q", "sizes here"]),
    ("E <", ["launch.require[3]", "cannot read condition", "one comparison"]),
    ("D", ["launch.require[3]", "cannot read condition"]),
])
def test_launch_require_names_known_sizes(tmp_path, condition, words):
    def edit(data: dict[str, Any]) -> None:
        data["launch"]["require"].append(condition)
    with pytest.raises(CheckError) as err:
        _check(tmp_path, edit)
    for word in words:
        assert word in str(err.value), str(err.value)
