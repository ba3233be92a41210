"""The work ring: a scheduler component's records broadcast to every looping role.

The toy kernel of ``tests/conftest.py`` (loader -> reducer -> store) gets a scheduler:
each role reads the record through a work port, and the loader and reducer take their
trip count from it (per_tile: work). Rows of the table break one thing each; the
checker must refuse it naming the file, both instances and ports, and what to change.
No compiler is needed: the glue text is checked as text.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from pipelink import glue
from pipelink.errors import CheckError, ContractError, PipeLinkError
from pipelink.link import place_kernel

from ..conftest import Tree, consumer, epilogue, producer, toy_recipe

RECIPE = "recipes/r.yaml"

_SCHEDULER: dict[str, Any] = {
    "component": "sched",
    "kind": "scheduler",
    "arch": ["sm_90a", "sm_100a"],
    "tunables": {"work_stages": [2, 4]},
    "roles": {"schedule": {"warps": 1, "registers": 32}},
    "counters": {"next_tile": 1},
    "ports": {"work": {"dir": "out", "kind": "work", "record": "gemm_tile",
                       "stages": "work_stages"}},
    "args": [{"name": "tiles", "type": "u32"}, {"name": "k_tiles", "type": "u32"}],
}


def scheduler() -> dict[str, Any]:
    return copy.deepcopy(_SCHEDULER)


def work_loader() -> dict[str, Any]:
    c = producer()
    c["ports"]["work"] = {"dir": "in", "kind": "work", "record": "gemm_tile"}
    c["ports"]["tiles"]["per_tile"] = "work"
    c["args"] = [a for a in c["args"] if a["name"] != "k_tiles"]
    return c


def work_reducer() -> dict[str, Any]:
    c = consumer()
    c["ports"]["work"] = {"dir": "in", "kind": "work", "fields": ["m_block", "k_begin", "k_end"]}
    c["ports"]["x"]["per_tile"] = "work"
    del c["args"]
    return c


def work_store() -> dict[str, Any]:
    c = epilogue()
    c["ports"]["work"] = {"dir": "in", "kind": "work", "fields": ["m_block"]}
    return c


def work_recipe() -> dict[str, Any]:
    r = toy_recipe()
    r["instances"]["sched"] = "sched"
    r["connect"] = ["sched.work -> load.work", "sched.work -> reduce.work",
                    "sched.work -> store.work"] + r["connect"]
    r["launch"] = launch({"sched.k_tiles": "K // 64", "sched.tiles": "M // 128"})
    return r


def launch(binds: dict[str, str]) -> dict[str, Any]:
    """A launch section binding every argument the toy kernel has, plus ``binds``."""
    return {"persistent": True,
            "inputs": {"x": {"dtype": "bf16", "shape": ["M", "K"]}},
            "outputs": {"out": {"dtype": "f32", "shape": ["M", 8]}},
            "bind": {"load.src": "x", "store.out": "out", **binds}}


def _write(tree: Tree, contracts: dict[str, dict[str, Any]], recipe: dict[str, Any]):
    for name, data in contracts.items():
        tree.component(name, data)
    return tree.check(tree.recipe(recipe))


def _fitting() -> dict[str, dict[str, Any]]:
    return {"sched": scheduler(), "loader": work_loader(), "reducer": work_reducer(),
            "store": work_store()}


# -- a kernel that fits ------------------------------------------------------------------

def test_every_looping_lane_consumes_the_ring(tree):
    kernel = _write(tree, _fitting(), work_recipe())
    work = kernel.work
    assert work is not None and str(work.producer) == "sched.work"
    assert work.lane == "sched.schedule" and work.record == "pl::WorkTile"
    # One arrival per consuming warp: the loader's one, the reducer+store lane's four.
    assert work.consumers == ("load.producer", "reduce.reduce+store.store")
    assert work.arrivals == 1 + 4
    assert sorted(str(t.dst) for t in kernel.transfers if t.kind == "work") == [
        "load.work", "reduce.work", "store.work"]
    # The ring and its barriers are placed like any buffer; stages is a tunable.
    names = {b.name for b in kernel.problem.buffers}
    assert {"sched.work.records", "sched.mbar.work.full", "sched.mbar.work.empty"} <= names
    # The scheduler's counter lives in the workspace the runtime zeroes per launch.
    assert kernel.workspace["sched.counter.next_tile"].slots == 1
    assert kernel.workspace_bytes >= 4


def test_glue_reads_the_ring_before_each_role_entry(tree):
    kernel = _write(tree, _fitting(), work_recipe())
    placement = place_kernel(kernel)
    text = glue.generate(kernel, placement)
    stages = placement.tunables["sched.work_stages"]
    records = placement.smem["sched.work.records"][0]
    full = placement.smem["sched.mbar.work.full"][0]
    empty = placement.smem["sched.mbar.work.empty"][0]
    assert (f"__device__ const pl::WorkRing pl_work_sched = "
            f"{{{records}, {full}, {empty}, {stages}}};") in text
    assert f"pl::mbar::init({full} + i * 8, 1);  // sched.work full" in text
    assert re.search(rf"pl::mbar::init\({empty} \+ i \* 8, 5\);  // sched\.work empty", text)
    # The scheduler: one lane asks for records and commits each, the end marker too.
    h = kernel.bound["sched"].params_hash()
    producer_loop = ["if (pl::lane() == 0) {", "pl::WorkState work{};",
                     f"pl_sched_schedule_{h}(pl_at_sched, args_sched, k, iteration, "
                     "st_sched_schedule);",
                     "pl::work_acquire(pl_work_sched, work);",
                     "pl::work_commit(pl_work_sched, work, tile);",
                     "work.advance(pl_work_sched);", "if (!tile.is_valid()) break;"]
    _in_order(text, producer_loop)
    # Each consumer: wait, the role entries with the record read in place, then release;
    # the end marker is released before the loop ends.
    b = kernel.bound["reduce"]
    consumer_loop = ["const pl::WorkTile& tile = pl::work_wait(pl_work_sched, work);",
                     "if (!tile.is_valid()) {", "pl::work_release(pl_work_sched, work);",
                     "break;",
                     f"pl_reducer_reduce_{b.params_hash()}(pl_at_reduce, args_reduce, k, tile",
                     "pl::work_release(pl_work_sched, work);", "work.advance(pl_work_sched);"]
    _in_order(text, consumer_loop)
    assert text.count("pl::work_wait(pl_work_sched, work)") == 2      # two consuming lanes
    assert "blockIdx.x), int32_t(blockIdx.y)" not in text


def test_a_generated_converter_consumes_the_ring_and_counts_stages_per_record(tree):
    recipe = work_recipe()
    recipe["instances"]["load"] = {"component": "loader", "params": {"dtype": "f32"}}
    recipe["launch"]["inputs"]["x"]["dtype"] = "f32"
    kernel = _write(tree, _fitting(), recipe)
    assert [t.kind for t in kernel.transfers if str(t.dst) == "reduce.x"] == ["conversion"]
    assert kernel.work.consumers[-1] == "cvt_reduce_x"
    assert kernel.work.arrivals == 1 + 4 + 4          # loader, reducer+store, converter warps
    text = glue.generate(kernel, place_kernel(kernel))
    assert text.count("pl::work_wait(pl_work_sched, work)") == 3
    _in_order(text, ["pl::work_wait(pl_work_sched, work);", "if (!tile.is_valid()) {",
                     "const uint32_t stages = tile.k_tiles();",
                     "for (uint32_t i = 0; i < stages; ++i)", "pl_convert_stage<float, "
                     "__nv_bfloat16", "pl::work_release(pl_work_sched, work);"])


def test_without_a_scheduler_each_cta_gets_one_record_from_blockidx(tree):
    tree.toy()
    kernel = tree.check(tree.recipe(toy_recipe()))
    assert kernel.work is None
    text = glue.generate(kernel, place_kernel(kernel))
    assert ("const pl::WorkTile tile{int32_t(blockIdx.x), int32_t(blockIdx.y), "
            "int32_t(blockIdx.z), 0, 0, int32_t(iteration == 0), 0, pl::kRowsUnbounded};"
            ) in text
    assert "pl_work_" not in text and "work_wait" not in text


def _in_order(text: str, parts: list[str]) -> None:
    at = 0
    for part in parts:
        found = text.find(part, at)
        assert found >= 0, f"{part!r} missing after offset {at}"
        at = found + len(part)


def test_grouped_work_reaches_consumers_that_read_its_rows(tree):
    contracts = _fitting()
    _grouped(contracts)
    contracts["store"]["ports"]["work"]["fields"] = ["m_block", "m_offset", "m_end"]
    kernel = _write(tree, contracts, work_recipe())
    assert kernel.work.record == "pl::WorkTile"


# -- what the checker refuses ------------------------------------------------------------

def _set(name: str, path: str, value: Any) -> Callable[[dict], None]:
    def mutate(contracts: dict) -> None:
        parent = contracts[name]
        *keys, last = path.split(".")
        for k in keys:
            parent = parent[k]
        if value is None:
            del parent[last]
        else:
            parent[last] = value
    return mutate


@dataclass(frozen=True)
class Case:
    id: str
    error: type[PipeLinkError]
    must: tuple[str, ...]
    contracts: Callable[[dict], None] | None = None
    recipe: Callable[[dict], None] | None = None


def _drop_work_connections(r: dict) -> None:
    r["connect"] = [c for c in r["connect"] if not c.startswith("sched.work")]


def _drop_store_connection(r: dict) -> None:
    r["connect"].remove("sched.work -> store.work")


def _store_without_work_port(contracts: dict) -> None:
    del contracts["store"]["ports"]["work"]


def _plain_toy(contracts: dict) -> None:
    contracts.update({"loader": producer(), "reducer": consumer(), "store": epilogue()})
    del contracts["sched"]


def _plain_recipe(binds: dict[str, str]) -> Callable[[dict], None]:
    def mutate(r: dict) -> None:
        r.clear()
        r.update(toy_recipe())
        r["launch"] = launch(binds)
    return mutate


def _with_reduce_k_tiles(r: dict) -> None:
    r["launch"]["bind"]["reduce.k_tiles"] = "K // 64"


def _mixed_trip_counts(contracts: dict) -> None:
    contracts["reducer"] = consumer()
    contracts["reducer"]["ports"]["work"] = {"dir": "in", "kind": "work",
                                             "fields": ["m_block"]}


def _work_without_scheduler(contracts: dict) -> None:
    del contracts["sched"]
    contracts["loader"] = work_loader()


def _no_scheduler_recipe(r: dict) -> None:
    r.clear()
    r.update(toy_recipe())


def _grouped(contracts: dict) -> None:
    """The scheduler produces grouped_tile records; the loader and reducer handle them."""
    contracts["sched"]["ports"]["work"]["record"] = "grouped_tile"
    contracts["loader"]["ports"]["work"]["record"] = ["gemm_tile", "grouped_tile"]
    contracts["reducer"]["ports"]["work"]["fields"] += ["m_offset", "m_end"]


def _split(contracts: dict) -> None:
    """The scheduler produces split_tile records of 128 x 256 tiles; the loader and the
    reducer handle them, the store (fields only) does not combine pieces."""
    contracts["sched"]["ports"]["work"].update(record="split_tile", shape=[128, 256])
    contracts["loader"]["ports"]["work"].update(record=["gemm_tile", "split_tile"],
                                                shape=[128, 256])
    contracts["reducer"]["ports"]["work"] = {"dir": "in", "kind": "work",
                                             "record": ["split_tile"], "shape": [128, 256]}


CASES = [
    Case("record_field_the_producer_lacks", CheckError,
         (f"{RECIPE}: connect[1]", "'sched.work' (sched) -> 'reduce.work' (reducer)",
          "field(s) expert", "gemm_tile has: m_block, n_block, group, k_begin, k_end, valid, "
          "m_offset, m_end, k_split, k_splits, partials, flag"),
         contracts=_set("reducer", "ports.work.fields", ["m_block", "expert", "k_begin",
                                                         "k_end"])),
    Case("ring_with_no_consumer", CheckError,
         (f"{RECIPE}: instances.sched", "work ring 'sched.work' of scheduler 'sched' has no "
          "consumer", "connect 'sched.work -> <instance>.work'"),
         recipe=_drop_work_connections),
    Case("role_that_reads_no_record", CheckError,
         (f"{RECIPE}: instances.store", "role 'store.store' (store) runs once per work item "
          "of 'sched.work' but reads no work record", "connect 'sched.work -> store.work'"),
         contracts=_store_without_work_port, recipe=_drop_store_connection),
    Case("work_port_left_unconnected", CheckError,
         (f"{RECIPE}: instances.store", "input port 'store.work' (work, m_block)",
          "add 'producer.port -> store.work'"),
         recipe=_drop_store_connection),
    Case("k_tiles_bound_twice_differently", CheckError,
         (f"{RECIPE}: launch.bind.reduce.k_tiles", "'load.k_tiles' is bound to 'K // 64' and "
          "'reduce.k_tiles' to 'K // 32'", "let the trip count travel with the work"),
         contracts=_plain_toy,
         recipe=_plain_recipe({"load.k_tiles": "K // 64", "reduce.k_tiles": "K // 32"})),
    Case("trip_count_from_two_places", CheckError,
         (f"{RECIPE}: connect[3]", "'load.tiles' hands over per_tile work stages per work "
          "item, 'reduce.x' takes per_tile args.k_tiles", "per_tile: work"),
         contracts=_mixed_trip_counts, recipe=_with_reduce_k_tiles),
    Case("trip_count_from_a_record_nobody_produces", CheckError,
         (f"{RECIPE}: instances.load", "input port 'load.work' (work, gemm_tile) of "
          "component 'loader' is not connected"),
         contracts=_work_without_scheduler, recipe=_no_scheduler_recipe),
    # Contracts.
    Case("work_out_port_outside_a_scheduler", ContractError,
         ("components/store/contract.yaml: ports.ring", "work out port 'ring'",
          "kind: scheduler"),
         contracts=_set("store", "ports.ring", {"dir": "out", "kind": "work",
                                                "record": "gemm_tile", "stages": 2})),
    Case("scheduler_role_of_two_warps", CheckError,
         (f"{RECIPE}: instances.sched", "scheduler role 'sched.schedule' (sched) runs in 2 "
          "warps", "components/sched/contract.yaml: roles.schedule", "warps: 1"),
         contracts=_set("sched", "roles.schedule.warps", "2 * 1")),
    Case("per_tile_work_without_a_record", ContractError,
         ("components/reducer/contract.yaml: ports.x.per_tile", "reads no record with "
          "k_begin and k_end"),
         contracts=_set("reducer", "ports.work.fields", ["m_block"])),
    Case("work_in_port_names_neither", ContractError,
         ("components/store/contract.yaml: ports.work", "needs one of 'record' or 'fields'"),
         contracts=_set("store", "ports.work.fields", None)),
    # Grouped work: rows of a problem end at m_end, and m_block counts from m_offset.
    Case("epilogue_that_cannot_stop_at_a_problems_rows", CheckError,
         (f"{RECIPE}: connect[2]", "'sched.work' (sched) -> 'store.work' (store)",
          "the consumer reads gemm_tile records, the scheduler produces grouped_tile",
          "grouped_store_epilogue"),
         contracts=lambda c: (_grouped(c), _set("store", "ports.work",
                                                {"dir": "in", "kind": "work",
                                                 "record": "gemm_tile"})(c))),
    Case("m_block_of_grouped_work_without_its_rows", CheckError,
         (f"{RECIPE}: connect[2]", "reads fields m_block of grouped_tile records without "
          "m_offset, m_end: it would address rows of another problem",
          "record: [gemm_tile, grouped_tile]"),
         contracts=_grouped),
    # Split-K: the pieces of a tile exchange partials, so every end states the tile.
    Case("epilogue_that_would_store_a_partial_sum", CheckError,
         (f"{RECIPE}: connect[2]", "reads fields m_block of split_tile records without "
          "k_split, k_splits, partials, flag: it would store one piece's partial sum",
          "pipelink/splitk.cuh"),
         contracts=_split),
    Case("split_tile_consumer_without_a_tile_shape", ContractError,
         ("components/loader/contract.yaml: ports.work", "carries split_tile records but "
          "states no tile shape", "shape: [tile_m, tile_n]"),
         contracts=lambda c: (_split(c), _set("loader", "ports.work.shape", None)(c))),
    Case("split_tile_pieces_of_another_shape", CheckError,
         (f"{RECIPE}: connect[0]", "the pieces of a split_tile meet as partial tiles of "
          "shape [128, 256], the consumer's tile is [128, 128]", "tile_m, tile_n"),
         contracts=lambda c: (_split(c), _set("loader", "ports.work.shape", [128, 128])(c))),
    Case("scheduler_that_lists_record_types", ContractError,
         ("components/sched/contract.yaml: ports.work.record", "lists record types",
          "a scheduler produces one record type"),
         contracts=_set("sched", "ports.work.record", ["gemm_tile", "grouped_tile"])),
    Case("unknown_record_type", ContractError,
         ("components/loader/contract.yaml", "ports.work.record", "'expert_tile'"),
         contracts=_set("loader", "ports.work.record", "expert_tile")),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_refused(tree, case):
    contracts, recipe = _fitting(), work_recipe()
    if case.contracts:
        case.contracts(contracts)
    if case.recipe:
        case.recipe(recipe)
    with pytest.raises(case.error) as info:
        _write(tree, contracts, recipe)
    text = str(info.value)
    for part in case.must:
        assert part in text, f"{part!r} not in:\n{text}"


def test_inspect_shows_a_work_port_by_its_record(tmp_path, capsys):
    from pipelink import cli
    from pipelink.contract import contract_from_data
    from pipelink.objfile import pack
    bound = contract_from_data(scheduler(), "components/sched/contract.yaml").bind()
    obj = tmp_path / "sched.o"
    obj.write_bytes(pack(bound, "sm_90a", b"\x00LTO-IR\x00" * 8, source_sha256="0" * 64,
                         toolchain={"nvcc": "13.0.88", "nvjitlink": "13.0"}))
    assert cli.main(["inspect", str(obj)]) == 0
    assert re.search(r"port work +out work gemm_tile role=schedule", capsys.readouterr().out)
