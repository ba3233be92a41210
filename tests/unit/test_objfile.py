"""The object container and the ABI header: what a compiled component carries, byte for
byte, and the C++ a component compiles against."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from pipelink import header
from pipelink.contract import BoundContract, canonical_json, contract_from_data, sha256_text
from pipelink.objfile import FORMAT_VERSION, MAGIC, pack, read_object, unpack, write_atomic

from ..conftest import consumer, epilogue, producer

LTOIR = bytes(range(256)) * 4
TOOLCHAIN = {"nvcc": "13.0.88", "nvjitlink": "13.0"}


def bound_of(data: dict, params: dict | None = None) -> BoundContract:
    return contract_from_data(data, "components/x/contract.yaml").bind(params)


def packed(data: dict | None = None, params: dict | None = None, ltoir: bytes = LTOIR) -> bytes:
    return pack(bound_of(data or producer(), params), "sm_90a", ltoir,
                source_sha256="ab" * 32, toolchain=TOOLCHAIN)


def reordered(data: dict) -> dict:
    """The same contract with every mapping's keys in reverse order (YAML key order)."""
    if isinstance(data, dict):
        return {k: reordered(data[k]) for k in reversed(list(data))}
    if isinstance(data, list):
        return [reordered(v) for v in data]
    return data


# -- the container ----------------------------------------------------------------------

def test_round_trip_keeps_everything():
    obj = unpack(packed(params={"dtype": "f32"}), "x.o")
    assert obj.ltoir == LTOIR
    assert (obj.component, obj.arch, obj.path) == ("loader", "sm_90a", "x.o")
    h = obj.header
    assert h["format"] == FORMAT_VERSION
    assert h["params"] == {"rows": 128, "cols": 64, "dtype": "f32"}
    assert h["contract"] == producer()
    assert h["ltoir_sha256"] == sha256_text(LTOIR) and h["ltoir_bytes"] == len(LTOIR)
    assert h["source_sha256"] == "ab" * 32 and h["toolchain"] == TOOLCHAIN
    bound = obj.bound()
    assert bound.params == h["params"]
    assert h["symbols"] == {"producer": bound.symbol("pl_loader_producer")}


def test_embedded_contract_rebinds_to_the_same_header():
    obj = unpack(packed(consumer(), {"dtype": "f32"}))
    assert header.generate(obj.bound()) == header.generate(bound_of(consumer(),
                                                                    {"dtype": "f32"}))


def test_layout_is_magic_version_length_header_ltoir():
    data = packed()
    assert data[:6] == MAGIC
    assert int.from_bytes(data[6:8], "little") == FORMAT_VERSION
    length = int.from_bytes(data[8:12], "little")
    assert json.loads(data[12:12 + length])["component"] == "loader"
    assert data[12 + length:] == LTOIR


def test_same_input_same_bytes():
    assert packed() == packed()
    assert packed(consumer(), {"dtype": "f32"}) == packed(consumer(), {"dtype": "f32"})


def test_yaml_key_order_does_not_change_the_bytes():
    assert packed(reordered(producer())) == packed(producer())


@pytest.mark.parametrize(("change", "args"), [
    ("params", {"params": {"rows": 64}}),
    ("ltoir", {"ltoir": LTOIR + b"\0"}),
    ("contract", {"data": {**producer(), "description": "another"}}),
])
def test_any_input_change_changes_the_bytes(change, args):
    assert packed(**args) != packed(), change


def test_header_is_canonical_json_without_paths_or_times():
    data = packed()
    length = int.from_bytes(data[8:12], "little")
    raw = data[12:12 + length].decode()
    assert raw == canonical_json(json.loads(raw))
    assert "components/x" not in raw and "/tmp" not in raw


def test_read_object_and_write_atomic(tmp_path: Path):
    path = tmp_path / "deep" / "loader.sm_90a.o"
    write_atomic(path, packed())
    assert [p.name for p in path.parent.iterdir()] == ["loader.sm_90a.o"]
    obj = read_object(path)
    assert obj.path == str(path) and obj.ltoir == LTOIR


def test_empty_ltoir_round_trips():
    assert unpack(packed(ltoir=b"")).ltoir == b""


# -- the header generator ---------------------------------------------------------------

def test_place_fields_are_sorted_sections_in_fixed_order():
    data = producer()
    data["named_barriers"] = {"zeta": {"threads": 32}, "alpha": {"threads": 64}}
    fields = header.place_fields(bound_of(data))
    assert [m for m, _ in fields] == ["role", "smem", "mbar", "bar", "tune", "port"]
    assert dict(fields)["mbar"] == [("uint32_t", "empty", "mbarriers.empty"),
                                    ("uint32_t", "full", "mbarriers.full")]
    assert dict(fields)["bar"] == [("uint32_t", "alpha", "named_barriers.alpha"),
                                   ("uint32_t", "zeta", "named_barriers.zeta")]
    assert dict(fields)["port"] == [("pl::PipePort", "tiles", "ports.tiles")]


def test_register_ports_are_not_placed_but_passed():
    b = bound_of(consumer())
    assert [f for _, f, _ in dict(header.place_fields(b))["port"]] == ["x"]
    assert header.register_ports(b, "reduce") == [("float", "acc", 8)]
    assert header.pipeline_ports(b, "reduce") == ["x"]
    assert header.entry_signature(b, "reduce").endswith(
        f"pl_state_reducer_reduce_{b.params_hash()}& st, float (&acc)[8]")


def test_arg_fields_follow_contract_order_and_dtype_params():
    assert header.arg_fields(bound_of(producer())) == [("const pl::TensorMap*", "src"),
                                                       ("uint32_t", "k_tiles")]
    data = epilogue()
    data["params"]["out_t"] = "bf16"
    data["args"] = [{"name": "n", "type": "i32"}, {"name": "out", "type": "ptr",
                                                   "dtype": "out_t"}]
    assert header.arg_fields(bound_of(data)) == [("int32_t", "n"), ("__nv_bfloat16*", "out")]


def test_hook_signature_and_hooks_declared():
    data = consumer()
    data["roles"]["reduce"].update(init=True, tail=True)
    b = bound_of(data)
    h = b.params_hash()
    text = header.generate(b)
    assert header.hook_signature(b, "reduce") == (
        f"const pl_place_reducer_{h}& at, const pl_args_reducer_{h}& args, "
        f"const pl::KernelInfo& k, pl_state_reducer_reduce_{h}& st")
    for hook in ("init", "tail"):
        assert f'extern "C" __device__ void pl_reducer_reduce_{hook}_{h}(' in text
        assert f"#define pl_reducer_reduce_{hook} pl_reducer_reduce_{hook}_{h}" in text


def test_generate_writes_params_place_args_state_and_entry():
    b = bound_of(consumer(), {"dtype": "f32"})
    h = b.params_hash()
    text = header.generate(b)
    for line in (f"#ifndef PL_HEADER_REDUCER_{h.upper()}",
                 f"struct pl_params_reducer_{h} {{",
                 "  static constexpr int rows = 128;",
                 "  using dtype = float;  // f32",
                 "    uint32_t stages;  // tunables.stages",
                 "    pl::PipePort x;  // ports.x",
                 "  uint32_t k_tiles;",
                 "  pl::PipeState x;",
                 "#ifndef PL_GLUE",
                 f"using pl_place_reducer = pl_place_reducer_{h};",
                 f"#define pl_reducer_reduce pl_reducer_reduce_{h}"):
        assert line in text.splitlines(), line
    assert (f'extern "C" __device__ void pl_reducer_reduce_{h}('
            f'{header.entry_signature(b, "reduce")});') in text


def test_generate_is_deterministic_and_independent_of_key_order():
    assert header.generate(bound_of(reordered(consumer()))) == header.generate(
        bound_of(consumer()))


def test_two_param_sets_get_distinct_type_names():
    a, b = bound_of(consumer()), bound_of(consumer(), {"dtype": "f32"})
    assert a.params_hash() != b.params_hash()
    assert set(header.type_names(a).values()).isdisjoint(header.type_names(b).values())


def test_scheduler_role_returns_a_record_and_leaves_the_ring_to_the_glue():
    data = {"component": "sched", "kind": "scheduler", "arch": ["sm_90a"],
            "tunables": {"work_stages": [2, 4]},
            "roles": {"schedule": {"warps": 1}},
            "ports": {"work": {"dir": "out", "kind": "work", "record": "gemm_tile",
                               "stages": "work_stages"}},
            "counters": {"next": 1},
            "args": [{"name": "tiles", "type": "u32"}]}
    b = bound_of(copy.deepcopy(data))
    text = header.generate(b)
    h = b.params_hash()
    assert (f'extern "C" __device__ pl::WorkTile pl_sched_schedule_{h}('
            f"{header.entry_signature(b, 'schedule')});") in text
    assert "uint32_t iteration" in header.entry_signature(b, "schedule")
    assert "uint32_t next;  // counters.next" in text
    assert "pl::PipePort work" not in text and "work;" not in text
