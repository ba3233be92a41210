"""Checking the shared build cache's entries before anyone uses them.

SCons names a cache entry by the build signature of the target (its inputs), never by
its content, so a flipped byte in an entry, a truncated copy or an entry written by a
broken build is handed out as if it were good, to every checkout that shares the
cache. PipeLink's cache (``site_scons/site_tools/pipelink``) therefore records the
sha256 of each entry beside it, in ``<entry>.sha256``, when it pushes the entry, and
on every retrieval checks:

1. the entry's bytes against its recorded hash (every output: objects, cubins,
   kernel.json, placement, glue);
2. what the file says of itself: an object's LTO-IR and header hashes
   (:func:`pipelink.objfile.unpack`), kernel.json parses and names its cubin's hash,
   and a cubin matches the ``cubin_sha256`` of the kernel.json built with it.

An entry that fails is deleted (with its record) and its target rebuilt; the rebuilt
file is pushed in its place. An entry without a record (an older cache, or a push cut
short) counts as failed. Nothing here imports SCons.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from .errors import ObjectFormatError
from .objfile import unpack, write_atomic

RECORD_SUFFIX = ".sha256"


def record_path(entry: Path | str) -> Path:
    return Path(f"{entry}{RECORD_SUFFIX}")


def file_sha256(path: Path | str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def record(entry: Path | str, sha256: str) -> None:
    """Writes the hash an entry must have (before the entry itself: a reader that sees
    the entry sees its record)."""
    write_atomic(record_path(entry), sha256 + "\n")


def recorded(entry: Path | str) -> str | None:
    try:
        text = record_path(entry).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text if len(text) == 64 and all(c in "0123456789abcdef" for c in text) else None


def content_problem(name: str, data: bytes) -> str | None:
    """What is wrong with an output's bytes by its own account, or None. ``name`` is the
    target's file name (it says the kind)."""
    if name.endswith(".o"):
        try:
            unpack(data, name)
        except ObjectFormatError as exc:
            return exc.message
    elif name == "kernel.json":
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            return "kernel.json is not valid JSON"
        if not isinstance(doc, dict) or not isinstance(doc.get("cubin_sha256"), str):
            return "kernel.json does not name its cubin's hash"
    return None


def cubin_problem(cubin: bytes, kernel_json: bytes) -> str | None:
    """A cubin against the kernel.json linked with it."""
    try:
        expected = json.loads(kernel_json).get("cubin_sha256")
    except (ValueError, UnicodeDecodeError, AttributeError):
        return "its kernel.json does not parse"
    if hashlib.sha256(cubin).hexdigest() != expected:
        return "the cubin does not match its kernel.json's cubin_sha256"
    return None


def entry_problem(entry: Path | str, name: str) -> str | None:
    """What is wrong with a cache entry for a target named ``name``, or None."""
    want = recorded(entry)
    if want is None:
        return "no recorded hash"
    try:
        data = Path(entry).read_bytes()
    except OSError as exc:
        return f"unreadable ({exc.strerror})"
    if hashlib.sha256(data).hexdigest() != want:
        return "content does not match its recorded hash"
    return content_problem(name, data)


def discard(entry: Path | str) -> None:
    """Deletes an entry and its record; a cache this user cannot write keeps them (they
    are checked, and refused, again on every use)."""
    for path in (Path(entry), record_path(entry)):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError:
            return
