"""Cache entries checked before use: the recorded hash, and what each file says of
itself (objects, kernel.json, a cubin against its kernel.json)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from pipelink import buildcache

from .test_objfile import packed

CUBIN = b"\x7fELF" + bytes(range(200))
KERNEL_JSON = json.dumps({"cubin_sha256": hashlib.sha256(CUBIN).hexdigest(),
                          "dynamic_smem": 229504}, sort_keys=True).encode()


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1:]


def _dynamic_smem_329504(data: bytes) -> bytes:
    return data.replace(b"229504", b"329504")


def _entry(tmp_path: Path, name: str, data: bytes, recorded: bytes | None = None) -> Path:
    entry = tmp_path / "AB" / "ab0123"
    entry.parent.mkdir(parents=True, exist_ok=True)
    entry.write_bytes(data)
    buildcache.record(entry, hashlib.sha256(data if recorded is None else recorded).hexdigest())
    return entry


# (target name, bytes recorded at push, bytes found in the cache, expected problem or None)
ENTRIES = [
    ("x.sm_90a.o", packed(), packed(), None),
    ("x.sm_90a.o", packed(), _flip(packed(), len(packed()) - 10), "recorded hash"),
    ("x.sm_90a.o", packed(), _flip(packed(), 40), "recorded hash"),
    ("x.sm_90a.o", packed(), packed()[:-1], "recorded hash"),
    # pushed bad (the record agrees with it): the object's own hashes still refuse it
    ("x.sm_90a.o", _flip(packed(), len(packed()) - 10), _flip(packed(), len(packed()) - 10),
     "LTO-IR does not match"),
    ("kernel.json", KERNEL_JSON, KERNEL_JSON, None),
    ("kernel.json", KERNEL_JSON, _dynamic_smem_329504(KERNEL_JSON), "recorded hash"),
    ("kernel.json", b"{", b"{", "not valid JSON"),
    ("kernel.json", b"{}", b"{}", "cubin's hash"),
    ("r.cubin", CUBIN, CUBIN, None),
    ("r.cubin", CUBIN, _flip(CUBIN, 100), "recorded hash"),
    ("glue.cu", b"// glue\n", b"// glve\n", "recorded hash"),
]


@pytest.mark.parametrize("name,pushed,found,problem", ENTRIES)
def test_entry_problem(tmp_path, name, pushed, found, problem):
    entry = _entry(tmp_path, name, found, recorded=pushed)
    got = buildcache.entry_problem(entry, name)
    assert (got is None) if problem is None else (problem in got), got


@pytest.mark.parametrize("record", [None, "", "zz" * 32, "ab" * 31, "AB" * 32 + "x"])
def test_an_entry_without_a_sound_record_is_refused(tmp_path, record):
    entry = tmp_path / "entry"
    entry.write_bytes(CUBIN)
    if record is not None:
        buildcache.record_path(entry).write_text(record)
    assert buildcache.entry_problem(entry, "r.cubin") == "no recorded hash"


@pytest.mark.parametrize("cubin,meta,problem", [
    (CUBIN, KERNEL_JSON, None),
    (_flip(CUBIN, 7), KERNEL_JSON, "does not match its kernel.json"),
    (CUBIN, b"not json", "does not parse"),
    (CUBIN, b"[]", "does not parse"),
])
def test_cubin_against_its_kernel_json(cubin, meta, problem):
    got = buildcache.cubin_problem(cubin, meta)
    assert (got is None) if problem is None else (problem in got)


def test_discard_removes_the_entry_and_its_record(tmp_path):
    entry = _entry(tmp_path, "r.cubin", CUBIN)
    buildcache.discard(entry)
    assert not entry.exists() and not buildcache.record_path(entry).exists()
    buildcache.discard(entry)  # twice: nothing left to remove, no error
