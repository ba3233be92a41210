"""The PipeLink object: one file carrying a component's LTO-IR and its contract.

Layout (little-endian)::

    magic   8 bytes   b"PLOBJ\\0" + format version (u16)
    length  u32       bytes of the header that follows
    header  JSON      canonical (sorted keys): component, arch, params, contract,
                      hashes of source, contract and LTO-IR, toolchain versions, symbols
    ltoir   bytes     nvcc -dlto -ltoir output, handed to nvJitLink as NVJITLINK_INPUT_LTOIR

Why a container and not nvcc's host object: ``nvcc -c -dlto`` host objects embed
temporary file names and differ run to run, while ``-ltoir`` output is byte-stable
at a given path. The header is checked on read (magic, version, LTO-IR hash), so a
truncated, corrupted or foreign file is refused with a message, never linked.
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import interrupts
from .contract import BoundContract, canonical_json, contract_from_data, sha256_text
from .errors import ObjectFormatError

MAGIC = b"PLOBJ\0"
FORMAT_VERSION = 1
_PREFIX = struct.Struct("<6sHI")


@dataclass(frozen=True)
class ComponentObject:
    header: dict[str, Any]
    ltoir: bytes
    path: str = ""

    @property
    def component(self) -> str:
        return self.header["component"]

    @property
    def arch(self) -> str:
        return self.header["arch"]

    def bound(self, where: str | None = None) -> BoundContract:
        """The embedded contract, re-validated, with its params bound; messages name
        ``where`` (the contract.yaml it was built from), else this object."""
        contract = contract_from_data(
            self.header["contract"],
            where or f"{self.path} (embedded contract of '{self.component}')")
        return contract.bind(self.header["params"])


def pack(bound: BoundContract, arch: str, ltoir: bytes, *, source_sha256: str,
         toolchain: dict[str, str]) -> bytes:
    header = {
        "format": FORMAT_VERSION,
        "component": bound.name,
        "arch": arch,
        "params": bound.params,
        "contract": bound.contract.data,
        "contract_sha256": sha256_text(canonical_json(bound.contract.data)),
        "source_sha256": source_sha256,
        "ltoir_sha256": sha256_text(ltoir),
        "ltoir_bytes": len(ltoir),
        "toolchain": toolchain,
        "symbols": {k: bound.symbol(v) for k, v in bound.entries().items()},
    }
    raw = canonical_json(header).encode()
    return _PREFIX.pack(MAGIC, FORMAT_VERSION, len(raw)) + raw + ltoir


def unpack(data: bytes, path: str = "<bytes>") -> ComponentObject:
    if len(data) < _PREFIX.size or data[:len(MAGIC)] != MAGIC:
        raise ObjectFormatError("not a PipeLink object (bad magic)", where=path,
                                hint="build it with 'pipelink compile' or scons; "
                                     "nvcc's own .o files cannot be linked directly")
    _, version, length = _PREFIX.unpack_from(data)
    if version != FORMAT_VERSION:
        raise ObjectFormatError(f"object format {version}, this PipeLink reads "
                                f"{FORMAT_VERSION}", where=path, hint="rebuild the component")
    end = _PREFIX.size + length
    try:
        header = json.loads(data[_PREFIX.size:end])
    except (ValueError, RecursionError):   # RecursionError: a crafted, deeply nested header
        raise ObjectFormatError("corrupted header", where=path,
                                hint="rebuild the component") from None
    ltoir = data[end:]
    if not isinstance(header, dict) or header.get("ltoir_sha256") != sha256_text(ltoir):
        raise ObjectFormatError("corrupted object: LTO-IR does not match its recorded hash",
                                where=path, hint="rebuild the component")
    _check_header(header, path)
    return ComponentObject(header, ltoir, path)


# Every header field and its JSON type: a reader may index any of them.
_HEADER_FIELDS: dict[str, type] = {
    "format": int, "component": str, "arch": str, "params": dict, "contract": dict,
    "contract_sha256": str, "source_sha256": str, "ltoir_sha256": str, "ltoir_bytes": int,
    "toolchain": dict, "symbols": dict,
}


def _check_header(header: dict[str, Any], path: str) -> None:
    """The header is complete and its embedded contract matches its recorded hash, so
    an edited or damaged header is refused here, not half-used later."""
    for key, kind in _HEADER_FIELDS.items():
        if not isinstance(header.get(key), kind):
            raise ObjectFormatError(f"corrupted header: field '{key}' is missing or not a "
                                    f"{kind.__name__}", where=path, hint="rebuild the component")
    if header["contract_sha256"] != sha256_text(canonical_json(header["contract"])):
        raise ObjectFormatError("corrupted header: the embedded contract does not match its "
                                "recorded hash", where=path, hint="rebuild the component")
    params_hash = sha256_text(canonical_json(header["params"]))[:8]
    if not all(isinstance(s, str) and s.endswith(f"_{params_hash}")
               for s in header["symbols"].values()):
        raise ObjectFormatError("corrupted header: its symbols were not built with its params",
                                where=path, hint="rebuild the component")
    if header["component"] != header["contract"].get("component"):
        raise ObjectFormatError(f"corrupted header: component '{header['component']}' but the "
                                "embedded contract is of "
                                f"'{header['contract'].get('component')}'", where=path,
                                hint="rebuild the component")


def read_object(path: Path | str) -> ComponentObject:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ObjectFormatError(f"cannot read: {exc.strerror}", where=str(path)) from None
    return unpack(data, str(path))


def write_atomic(path: Path | str, data: bytes | str) -> None:
    """Writes through a temporary file in the same folder and renames it into place,
    so an interrupted build never leaves a half-written output."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode() if isinstance(data, str) else data
    tmp: str | None = None
    try:
        with interrupts.held():      # no Ctrl-C between making it and knowing its name
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp's 0600 would hide outputs from a team
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
        os.replace(tmp, path)
    except BaseException:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise
