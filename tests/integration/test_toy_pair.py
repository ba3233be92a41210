"""A producer and a consumer compiled alone with the real nvcc, read back, checked
from their embedded contracts, and accepted by nvJitLink (no GPU needed).

tile_loader streams bf16 tiles into a ring; row_reduce waits on it and sums each row
into a register fragment. Four objects: both components for sm_90a and sm_100a.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipelink import cli
from pipelink.check import check
from pipelink.compile import CompileOptions, compile_component
from pipelink.objfile import ComponentObject, read_object
from pipelink.recipe import load_recipe

from ..conftest import ROOT, requires_nvcc

pytestmark = requires_nvcc

ARCHS = ("sm_90a", "sm_100a")
PAIR = {"load": ("tile_loader", {"dtype": "bf16"}), "reduce": ("row_reduce", {})}
RECIPE = {
    "recipe": "toy_pair", "arch": list(ARCHS),
    "instances": {"load": {"component": "tile_loader", "params": {"dtype": "bf16"}},
                  "reduce": "row_reduce"},
    "connect": ["load.tiles -> reduce.x"],
}


@pytest.fixture(scope="module")
def objects(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    """(instance, arch) -> a PipeLink object compiled by nvcc."""
    out = tmp_path_factory.mktemp("objects")
    built = {}
    for arch in ARCHS:
        for inst, (component, params) in PAIR.items():
            path = out / f"{component}.{arch}.o"
            compile_component(ROOT / "components" / component / "contract.yaml", params,
                              CompileOptions(arch), path)
            built[(inst, arch)] = path
    return built


def loaded(objects: dict[tuple[str, str], Path], arch: str) -> dict[str, ComponentObject]:
    return {inst: read_object(objects[(inst, arch)]) for inst in PAIR}


@pytest.mark.parametrize("arch", ARCHS)
def test_objects_carry_their_contracts(objects, arch):
    objs = loaded(objects, arch)
    load, reduce = objs["load"], objs["reduce"]
    assert (load.component, load.arch) == ("tile_loader", arch)
    assert (reduce.component, reduce.arch) == ("row_reduce", arch)
    assert reduce.header["params"] == {"rows": 128, "cols": 64, "dtype": "bf16"}
    assert load.header["symbols"] == {"producer": load.bound().symbol("pl_tile_loader_producer")}
    assert reduce.header["symbols"] == {"reduce": reduce.bound().symbol("pl_row_reduce_reduce")}
    for obj in objs.values():
        assert len(obj.ltoir) > 1000 and obj.header["ltoir_bytes"] == len(obj.ltoir)
    ports = reduce.bound().contract.ports
    assert (ports["x"].dir, ports["x"].kind) == ("in", "smem_pipeline")
    assert (ports["acc"].kind, ports["acc"].spec["count"]) == ("registers", 8)


@pytest.mark.parametrize("arch", ARCHS)
def test_inspect_reads_them_back(objects, arch, capsys):
    assert cli.main(["inspect", str(objects[("reduce", arch)])]) == 0
    text = capsys.readouterr().out
    for part in ("PipeLink object", "component  row_reduce (stage)", f"arch       {arch}",
                 '"dtype": "bf16"', "port x          in smem_pipeline",
                 "port acc        out registers f32 role=reduce",
                 '"layout": "row_per_thread_8"', '"per_tile": "args.k_tiles"'):
        assert part in text, part
    assert cli.main(["inspect", "--json", str(objects[("load", arch)])]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["component"] == "tile_loader"


@pytest.mark.parametrize("arch", ARCHS)
def test_checker_wires_them_from_the_objects_alone(objects, arch, tmp_path):
    path = tmp_path / "toy_pair.yaml"
    path.write_text(yaml.safe_dump(RECIPE))
    kernel = check(load_recipe(path), arch,
                   {inst: obj.bound() for inst, obj in loaded(objects, arch).items()})
    assert [(str(t.src), str(t.dst), t.kind) for t in kernel.transfers] == [
        ("load.tiles", "reduce.x", "zero_copy")]
    stages = {t.name: t.values for t in kernel.problem.tunables}
    assert stages["load.stages"] == stages["reduce.stages"] == tuple(range(2, 9))
    assert [(lane.name, lane.warps) for lane in kernel.lanes] == [
        ("load.producer", 1), ("reduce.reduce", 4)]
    assert any("'reduce.acc' is not connected" in w for w in kernel.warnings)


@pytest.mark.parametrize("arch", ARCHS)
def test_nvjitlink_accepts_the_ltoir(objects, arch):
    from cuda.bindings import nvjitlink
    handle = nvjitlink.create(2, [f"-arch={arch}", "-lto"])
    try:
        for inst, obj in loaded(objects, arch).items():
            nvjitlink.add_data(handle, nvjitlink.InputType.LTOIR, obj.ltoir, len(obj.ltoir),
                               f"{inst}.ltoir")
        nvjitlink.complete(handle)
        # No kernel entry yet: the cubin may be empty, but the link must succeed.
        assert nvjitlink.get_linked_cubin_size(handle) >= 0
    except nvjitlink.nvJitLinkError as exc:
        size = nvjitlink.get_error_log_size(handle)
        log = bytearray(size)
        if size:
            nvjitlink.get_error_log(handle, log)
        pytest.fail(f"nvJitLink refused the objects: {exc}\n{log.decode(errors='replace')}")
    finally:
        nvjitlink.destroy(handle)
