"""The compile stage, without a compiler: which files an object's compile reads, and a
stage that is checked, restored and cleaned up rather than trusted."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipelink import stage
from pipelink.compile import INCLUDE_DIR, abi_headers, object_inputs
from pipelink.contract import load_contract
from pipelink.errors import ContractError, ToolchainError

ROOT = Path(__file__).resolve().parents[2]
SEARCH = ("include", "component")

# (files: name -> text, start, expected closure)
CLOSURES = [
    ({"component/a.cu": '#include "b.h"\n', "component/b.h": ""},
     ["component/a.cu"], {"component/a.cu", "component/b.h"}),
    # A quoted name is looked up beside its includer before the -I folders.
    ({"component/a.cu": '#include "pipelink/x.cuh"\n', "include/pipelink/x.cuh":
      '#include "y.cuh"\n', "include/pipelink/y.cuh": "", "include/pipelink/unused.cuh": ""},
     ["component/a.cu"], {"component/a.cu", "include/pipelink/x.cuh", "include/pipelink/y.cuh"}),
    # An angle-bracket name skips the includer's folder.
    ({"component/a.cu": "#include <b.h>\n", "component/b.h": "", "include/b.h": ""},
     ["component/a.cu"], {"component/a.cu", "include/b.h"}),
    # CUDA, the C++ library and unknown names are not followed; cycles end.
    ({"component/a.cu": "#include <cstdint>\n#include <cuda_bf16.h>\n#include \"b.h\"\n",
      "component/b.h": '  #  include "a.cu"\n'},
     ["component/a.cu"], {"component/a.cu", "component/b.h"}),
    # Every include line counts, whatever #if surrounds it; comments after it too.
    ({"component/a.cu": "#if 0\n#include \"b.h\" // old\n#endif\n", "component/b.h": ""},
     ["component/a.cu"], {"component/a.cu", "component/b.h"}),
    ({"component/sub/a.cu": '#include "../b.h"\n', "component/b.h": ""},
     ["component/sub/a.cu"], {"component/sub/a.cu", "component/b.h"}),
    ({"component/a.cu": "// no includes\n"}, ["component/a.cu", "component/missing.cu"],
     {"component/a.cu"}),
]


@pytest.mark.parametrize("files,start,expected", CLOSURES)
def test_include_closure(files, start, expected):
    data = {k: v.encode() for k, v in files.items()}
    assert stage.include_closure(data, start, SEARCH) == expected


def test_object_inputs_hold_only_the_abi_headers_the_component_includes(tmp_path):
    folder = tmp_path / "row_store"
    shutil.copytree(ROOT / "components" / "row_store", folder)
    bound = load_contract(folder / "contract.yaml").bind(None)
    before = object_inputs(bound, folder, "sm_90a")
    assert {f"include/{p.relative_to(INCLUDE_DIR)}" for p in INCLUDE_DIR.rglob("*.cuh")} <= \
        set(before)  # the generated header includes pipelink.cuh, which includes them all
    assert abi_headers(bound, folder, "sm_90a") == sorted(INCLUDE_DIR.rglob("*.cuh"))
    assert f"component/pl_{bound.name}.h" in before and "component/row_store.cu" in before


@pytest.mark.parametrize("source,needle", [
    ("missing.cu", "not found in"),
    ("../tile_loader/tile_loader.cu", "lies outside"),
    ("/etc/hostname", "lies outside"),
])
def test_a_source_the_folder_does_not_hold_is_refused(tmp_path, source, needle):
    folder = tmp_path / "row_store"
    shutil.copytree(ROOT / "components" / "row_store", folder)
    contract = folder / "contract.yaml"
    contract.write_text(contract.read_text() + f"source: {source}\n")
    bound = load_contract(contract).bind(None)
    with pytest.raises(ContractError) as refused:
        object_inputs(bound, folder, "sm_90a")
    assert f"source '{source}' for sm_90a {needle}" in str(refused.value)
    assert str(contract) in refused.value.where


def test_staged_file_set_is_the_dependency_set(tmp_path, monkeypatch):
    """A header nothing includes is in neither; one the source includes is in both."""
    include = tmp_path / "include"
    shutil.copytree(INCLUDE_DIR, include)
    (include / "pipelink" / "unused.cuh").write_text("#pragma once\n")
    (include / "pipelink" / "extra.cuh").write_text("#pragma once\n")
    folder = tmp_path / "row_store"
    shutil.copytree(ROOT / "components" / "row_store", folder)
    source = folder / "row_store.cu"
    source.write_text('#include "pipelink/extra.cuh"\n' + source.read_text())
    monkeypatch.setattr("pipelink.compile.INCLUDE_DIR", include)
    bound = load_contract(folder / "contract.yaml").bind(None)
    staged = object_inputs(bound, folder, "sm_90a")
    depends = abi_headers(bound, folder, "sm_90a")
    assert "include/pipelink/extra.cuh" in staged and include / "pipelink/extra.cuh" in depends
    assert "include/pipelink/unused.cuh" not in staged
    assert include / "pipelink/unused.cuh" not in depends
    assert {f"include/{p.relative_to(include)}" for p in depends} == \
        {k for k in staged if k.startswith("include/")}


# -- stages -----------------------------------------------------------------------------

FILES = {"component/a.cu": b'#include "b.h"\n', "component/b.h": b"// b\n",
         "include/pipelink/x.cuh": b"// x\n"}


def _tamper_edit(folder: Path) -> None:
    (folder / "component/b.h").write_bytes(b"#error tampered\n")


def _tamper_delete(folder: Path) -> None:
    (folder / "component/b.h").unlink()


def _tamper_delete_all(folder: Path) -> None:  # a /tmp cleaner that removes files only
    for p in folder.rglob("*"):
        if p.is_file():
            p.unlink()


def _tamper_extra(folder: Path) -> None:  # a stray header that would shadow an include
    (folder / "component/pipelink").mkdir()
    (folder / "component/pipelink/x.cuh").write_bytes(b"#error shadow\n")


def _tamper_symlink(folder: Path) -> None:
    (folder / "component/b.h").unlink()
    (folder / "component/b.h").symlink_to(folder / "include/pipelink/x.cuh")


def _tamper_truncate(folder: Path) -> None:
    (folder / "component/a.cu").write_bytes(b"")


TAMPERS = [_tamper_edit, _tamper_delete, _tamper_delete_all, _tamper_extra,
           _tamper_symlink, _tamper_truncate]


def _content(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*")
            if p.is_file() and not p.is_symlink()}


def test_materialise_writes_exactly_the_files_and_leaves_no_temporaries(tmp_path):
    root = tmp_path / "stage"
    folder = stage.materialise(root, FILES)
    assert folder.parent == root and folder.name == stage.digest(FILES)[:24]
    assert _content(folder) == FILES
    assert stage.materialise(root, FILES) == folder
    assert [p.name for p in root.iterdir()] == [folder.name]
    assert stat_mode(folder) == 0o777 & ~_umask()  # readable by a team sharing the root


@pytest.mark.parametrize("tamper", TAMPERS, ids=lambda f: f.__name__.removeprefix("_tamper_"))
def test_a_tampered_stage_is_restored_from_content(tmp_path, capsys, tamper):
    root = tmp_path / "stage"
    folder = stage.materialise(root, FILES)
    tamper(folder)
    assert stage.materialise(root, FILES) == folder
    assert _content(folder) == FILES
    assert not any(p.is_symlink() for p in folder.rglob("*"))
    assert "restored" in capsys.readouterr().err
    stage.materialise(root, FILES)
    assert capsys.readouterr().err == ""  # a sound stage is used silently


def test_a_third_party_tree_is_checked_against_its_source(tmp_path, capsys):
    src = tmp_path / "src"
    (src / "cute").mkdir(parents=True)
    (src / "cute" / "tensor.hpp").write_text("// cute\n")
    include = stage.stage_tree(src, tmp_path / "stage", "lib-1.0")
    assert (include / "cute" / "tensor.hpp").read_text() == "// cute\n"
    (include / "cute" / "tensor.hpp").write_text("// edited\n")
    (include / "cute" / "stray.hpp").write_text("// stray\n")
    assert stage.stage_tree(src, tmp_path / "stage", "lib-1.0") == include
    assert sorted(p.name for p in include.rglob("*") if p.is_file()) == ["tensor.hpp"]
    assert (include / "cute" / "tensor.hpp").read_text() == "// cute\n"
    assert "restored 2" in capsys.readouterr().err


def test_a_stage_that_cannot_be_restored_is_an_error(tmp_path):
    if os.getuid() == 0:
        pytest.skip("root writes through read-only folders")
    root = tmp_path / "stage"
    folder = stage.materialise(root, FILES)
    _tamper_edit(folder)
    os.chmod(folder / "component", 0o555)
    try:
        with pytest.raises(ToolchainError, match="cannot be restored") as err:
            stage.materialise(root, FILES)
        assert str(folder) in err.value.render() and stage.STAGE_ENV in err.value.render()
    finally:
        os.chmod(folder / "component", 0o755)


def stat_mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# -- roots and temporary folders ----------------------------------------------------------

def test_the_default_root_is_per_user(monkeypatch):
    monkeypatch.delenv(stage.STAGE_ENV, raising=False)
    assert stage.stage_root() == f"/tmp/pipelink-stage-{os.getuid()}"
    monkeypatch.setenv(stage.STAGE_ENV, "/shared/stage")
    assert stage.stage_root() == "/shared/stage"


def test_a_default_root_owned_by_another_user_is_refused(tmp_path, monkeypatch):
    if os.getuid() != 0:
        pytest.skip("making a folder another user's needs root")
    root = tmp_path / "stage-of-someone-else"
    root.mkdir()
    os.chown(root, 54321, 54321)
    monkeypatch.setattr(stage, "default_root", lambda: str(root))
    with pytest.raises(ToolchainError, match="another user") as err:
        stage.materialise(root, FILES)
    assert stage.STAGE_ENV in err.value.render()
    assert list(root.iterdir()) == []


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_reap_removes_what_dead_processes_left(tmp_path):
    host = socket.gethostname()
    root = tmp_path / "stage"
    root.mkdir()
    dead, live = _dead_pid(), os.getpid()
    names = {
        f".out-{host}-{dead}-abc123": True,          # our host, process gone
        f".stage-{host}-{dead}-x_y": True,
        f".out-{host}-{live}-abc123": False,         # our host, still running
        ".out-otherhost-1-abc123": False,            # another host, young
        ".glue-abc123": False,                       # an older name, young
        ".stage-oldname": True,                      # an older name, old (below)
        "0123456789abcdef01234567": False,           # a stage, never reaped
    }
    for name in names:
        (root / name).mkdir()
        (root / name / "f").write_text("x")
    old = time.time() - stage.FOREIGN_TEMP_AGE_S - 60
    os.utime(root / ".stage-oldname", (old, old))
    gone = stage.reap(root)
    assert sorted(gone) == sorted(n for n, reaped in names.items() if reaped)
    assert sorted(p.name for p in root.iterdir()) == \
        sorted(n for n, reaped in names.items() if not reaped)


_INTERRUPTED_COMPILE = """
import os, signal, sys
from pathlib import Path
from pipelink import stage
with stage.temp_dir(Path(sys.argv[1]), ".out-") as d:
    (d / "component.ltoir").write_bytes(b"half")
    os.kill(os.getpid(), getattr(signal, sys.argv[2]))
"""


@pytest.mark.parametrize("sig", ["SIGINT", "SIGKILL"])
def test_an_interrupted_or_killed_compile_leaves_nothing_behind(tmp_path, sig):
    root = tmp_path / "stage"
    proc = subprocess.run([sys.executable, "-c", _INTERRUPTED_COMPILE, str(root), sig],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH":
                                                               str(ROOT)})
    assert proc.returncode != 0
    left = list(root.iterdir())
    if sig == "SIGINT":  # unwound: removed at once
        assert left == []
    else:  # killed: removed by the next compile on this host
        assert len(left) == 1
        stage.materialise(root, FILES)
        assert [p.name for p in root.iterdir()] == [stage.digest(FILES)[:24]]
