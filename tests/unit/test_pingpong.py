"""Pingpong lanes: two teams of a lane's warps take alternate work records. The real
gemm_pingpong recipe's contracts are checked and placed without a compiler; each team
gets its own copy of the lane's shared memory and named barriers, both count on the
work ring, and the glue steps each team's ring state over the other's k-tiles. Lanes
that cannot run pingpong are refused, naming the instance and what to change."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from pipelink.check import Kernel
from pipelink.errors import CheckError
from pipelink.glue import generate
from pipelink.link import place_kernel

from ..conftest import check_repo_recipe

ROOT = Path(__file__).resolve().parents[2]


def _check(tmp_path: Path, recipe: str = "gemm_pingpong", arch: str = "sm_90a",
           edit: Any = None) -> Kernel:
    return check_repo_recipe(tmp_path, recipe, arch, edit)


def test_each_team_has_its_own_staging_and_barrier(tmp_path):
    kernel = _check(tmp_path)
    lane = next(lane for lane in kernel.lanes if ("mma", "mma") in lane.members)
    assert (lane.teams, lane.warps, lane.total_warps) == (2, 4, 8)
    # The producer warp and both teams' four warps release every record.
    assert kernel.work.arrivals == 1 + 8
    p = place_kernel(kernel, 1)
    assert p.roles[lane.name].warps == 8 and p.roles[lane.name].warp_base % 4 == 0
    staging, staging1 = p.smem["store.staging"], p.smem["store.staging@1"]
    assert staging[1] == staging1[1] == 2 * 64 * 64 * 2
    assert abs(staging[0] - staging1[0]) >= staging[1]          # disjoint
    assert p.barriers["store.staged"] != p.barriers["store.staged@1"]


def test_glue_runs_two_teams_on_alternate_records(tmp_path):
    kernel = _check(tmp_path)
    p = place_kernel(kernel, 1)
    glue = generate(kernel, p)
    slot_name = next(lane.name for lane in kernel.lanes if lane.teams == 2)
    slot = p.roles[slot_name]
    base = slot.warp_base
    assert f"if (warp >= {base} && warp < {base + 4})" in glue
    assert f"if (warp >= {base + 4} && warp < {base + 8})" in glue
    for team in (0, 1):
        assert f"if (record++ % 2 != {team})" in glue
    # Team 1 sees itself as a role of four warps at its own base, with its own copies.
    at = re.search(r"pl_at_store_t1 = \{\{\{(\d+), (\d+)\}\}, \{(\d+)\}, \{(\d+)\}\}", glue)
    assert at and [int(v) for v in at.groups()] == [
        base + 4, 4, p.smem["store.staging@1"][0], p.barriers["store.staged@1"]]
    # The other team's k-tiles are stepped over on both rings.
    assert glue.count("st_mma_mma.a.skip(pl_at_mma_t1.port.a, tile.k_tiles());") == 1
    assert glue.count("st_mma_mma.b.skip(pl_at_mma.port.b, tile.k_tiles());") == 1
    # Turns: a team waits for its own turn before the mainloop and hands the next
    # team its turn right after, before the epilogue; team 1 gives team 0 the first.
    turn = [p.barriers[f"{slot_name}.turn"], p.barriers[f"{slot_name}.turn@1"]]
    assert len({*turn, p.barriers["store.staged"], p.barriers["store.staged@1"]}) == 4
    for team in (0, 1):
        mine, theirs = turn[team], turn[1 - team]
        body = glue.split(f"// Pingpong team {team} of 2")[1].split("// Pingpong team")[0]
        order = [body.index(f"pl::named_sync({mine}, 256);  // this team's turn"),
                 body.index("pl_wgmma_mainloop_mma"),
                 body.index(f"pl::named_arrive({theirs}, 256);  // the next team's turn"),
                 body.index("pl_store_epilogue_store_")]
        assert order == sorted(order)
        assert f"if (record % 2 == {team}) pl::named_sync({mine}, 256);" in body
    assert glue.count(f"pl::named_arrive({turn[0]}, 256);") == 2    # first turn + hand-over


def test_cooperative_recipes_keep_one_team(tmp_path):
    kernel = _check(tmp_path, recipe="gemm_swiglu")
    assert all(lane.teams == 1 for lane in kernel.lanes)
    assert "record++" not in generate(kernel, place_kernel(kernel, 1))


def _loop(instance: str, loop: str):  # noqa: ANN202
    def edit(data: dict[str, Any]) -> None:
        data["instances"][instance]["loop"] = loop
    return edit


@pytest.mark.parametrize("recipe,arch,edit,words", [
    # The sm_100a mainloop fills Tensor Memory: a ring two teams cannot share.
    ("gemm", "sm_100a", _loop("mma", "pingpong"), ["instances.mma.loop", "'mma.acc'",
                                                    "produces a ring", "cooperative"]),
    ("gemm_pingpong", "sm_90a", _loop("store", "cooperative"),
     ["instances.mma.loop", "different loops", "mma: pingpong", "store: cooperative"]),
    ("gemm_pingpong", "sm_90a", _loop("load", "pingpong"),
     ["instances.load.loop", "'load.a'", "produces a ring"]),
    ("gemm_pingpong", "sm_90a", _loop("sched", "pingpong"),
     ["instances.sched.loop", "scheduler's own role"]),
])
def test_lanes_that_cannot_pingpong_are_refused(tmp_path, recipe, arch, edit, words):
    with pytest.raises(CheckError) as err:
        _check(tmp_path, recipe=recipe, arch=arch, edit=edit)
    text = str(err.value)
    assert f"recipes/{recipe}.yaml" in text
    for word in words:
        assert word in text, text
