"""The compile stage: content-addressed folders that nvcc compiles from.

nvcc hashes the real path of a source and of its headers into the LTO-IR's module id,
so PipeLink copies what a compile reads into ``<root>/<digest of the content>`` and
compiles there: two checkouts in two folders then produce the same bytes. The stage is
a cache, and like any cache it is checked before it is trusted:

- a stage folder that exists is compared file by file with the content it stands for;
  an edited, missing or extra file is restored from that content (a /tmp cleaner or a
  stray edit never yields a wrong object, nor a build that fails until someone removes
  the folder);
- new folders are written under a temporary name and renamed into place, so no reader
  sees half a stage; temporary folders carry their host and process id, and those whose
  process is gone are removed by the next compile;
- the default root is per user (``/tmp/pipelink-stage-<uid>``), and must be owned by
  that user: another user's folder is neither trusted nor written to.

What a compile reads is defined once, by :func:`include_closure`: the stage holds it
and the SCons tool depends on exactly it.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from . import interrupts
from .errors import ToolchainError
from .objfile import write_atomic

STAGE_ENV = "PIPELINK_STAGE"
# Temporary folders in a stage root: ours are named <prefix><host>-<pid>-<random>.
TEMP_PREFIXES = (".stage-", ".out-", ".tree-", ".glue-", ".mono-", ".cutlass-")
# A temporary folder whose owner cannot be told (another host, an older name) is
# removed once it is this old: no compile or copy takes that long.
FOREIGN_TEMP_AGE_S = 6 * 3600
_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"]+)[>"]', re.M)


def default_root() -> str:
    """Each user's own root: a shared default would be writable by one user only."""
    return f"/tmp/pipelink-stage-{os.getuid()}"


def stage_root() -> str:
    """``$PIPELINK_STAGE``, else :func:`default_root`."""
    return os.environ.get(STAGE_ENV) or default_root()


def digest(files: dict[str, bytes]) -> str:
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    return h.hexdigest()


def include_closure(files: dict[str, bytes], start: Iterable[str],
                    search: tuple[str, ...]) -> set[str]:
    """The names in ``files`` that ``start`` reaches through ``#include``, resolved as
    nvcc does: a quoted name first beside its includer, then along ``search`` (the
    ``-I`` folders, as prefixes of the names). Names outside ``files`` (CUDA, the C++
    library, CUTLASS) are not followed. Every include line counts, whatever ``#if``
    surrounds it: the closure may hold a header the compile skips, never miss one."""
    seen: set[str] = set()
    todo = [s for s in start if s in files]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        here = os.path.dirname(name)
        for quote, inc in _INCLUDE.findall(files[name]):
            inc = inc.decode(errors="replace")
            dirs = ((here,) if quote == b'"' else ()) + search
            for d in dirs:
                candidate = os.path.normpath(os.path.join(d, inc))
                if candidate in files:
                    todo.append(candidate)
                    break
    return seen


# -- temporary folders ------------------------------------------------------------------

def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _open_mode(path: Path) -> None:
    """mkdtemp's 0700 would hide a shared stage from the rest of a team."""
    os.chmod(path, 0o777 & ~_umask())


@contextmanager
def temp_dir(root: Path, prefix: str) -> Iterator[Path]:
    """A temporary folder under ``root``, removed however the block ends (an exception,
    Ctrl-C or SIGTERM turned into SystemExit); one a SIGKILL leaves is reaped later."""
    prepare_root(root)
    path: Path | None = None
    try:
        with interrupts.held():      # no Ctrl-C between making it and knowing its name
            path = Path(tempfile.mkdtemp(
                dir=root, prefix=f"{prefix}{socket.gethostname()}-{os.getpid()}-"))
        yield path
    finally:
        if path is not None:
            shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def reap(root: Path, now: float | None = None) -> list[str]:
    """Removes temporary folders left by killed compiles; returns their names."""
    now = time.time() if now is None else now
    host = socket.gethostname()
    gone = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return gone
    for entry in entries:
        prefix = next((p for p in TEMP_PREFIXES if entry.name.startswith(p)), None)
        if prefix is None:
            continue
        owner_host, _, rest = entry.name[len(prefix):].rpartition("-")[0].rpartition("-")
        pid = rest if owner_host else ""
        if owner_host == host and pid.isdigit():
            stale = not _alive(int(pid))
        else:
            try:
                stale = now - entry.stat(follow_symlinks=False).st_mtime > FOREIGN_TEMP_AGE_S
            except OSError:
                continue
        if stale:
            shutil.rmtree(entry.path, ignore_errors=True)
            gone.append(entry.name)
    return gone


def prepare_root(root: Path) -> None:
    """Creates ``root``; refuses a default root that another user owns."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        st = root.stat()
    except OSError as exc:
        raise ToolchainError(f"cannot create the compile stage: {exc.strerror}",
                             where=str(root),
                             hint=f"set {STAGE_ENV} to a folder you can write") from None
    if str(root) == default_root() and st.st_uid != os.getuid():
        raise ToolchainError("the compile stage belongs to another user", where=str(root),
                             hint=f"remove it, or set {STAGE_ENV} to a folder of your own")


# -- stages -----------------------------------------------------------------------------

def _files_under(folder: Path) -> dict[str, Path]:
    return {str(p.relative_to(folder)): p for p in folder.rglob("*")
            if p.is_file() or p.is_symlink()}


def repair(folder: Path, files: dict[str, bytes]) -> list[str]:
    """Makes ``folder`` hold exactly ``files``; returns the names it had to fix."""
    fixed = []
    present = _files_under(folder)
    for name, data in sorted(files.items()):
        path = present.get(name)
        try:
            ok = path is not None and not path.is_symlink() and path.read_bytes() == data
        except OSError:
            ok = False
        if not ok:
            if path is not None and path.is_symlink():
                path.unlink()
            write_atomic(folder / name, data)
            fixed.append(name)
    for name in sorted(set(present) - set(files)):
        present[name].unlink(missing_ok=True)
        fixed.append(name)
    return fixed


def _restore(folder: Path, files: dict[str, bytes]) -> None:
    try:
        fixed = repair(folder, files)
    except OSError as exc:
        raise ToolchainError(f"the compile stage differs from its sources and cannot be "
                             f"restored: {exc.strerror}", where=str(folder),
                             hint=f"remove {folder}, or set {STAGE_ENV} to a folder of "
                                  "your own") from None
    if fixed:
        print(f"pipelink: warning: {folder}: restored {len(fixed)} staged file(s) that "
              f"differed from their sources ({', '.join(fixed[:3])}"
              f"{', ...' if len(fixed) > 3 else ''})", file=sys.stderr)


def materialise(root: Path, files: dict[str, bytes]) -> Path:
    """``root/<digest>`` holding exactly ``files``: written once under a temporary name
    and renamed into place, checked (and restored) on every later use."""
    root = Path(root)
    target = root / digest(files)[:24]
    prepare_root(root)
    reap(root)
    if target.is_dir() or not _publish(root, ".stage-", files, target):
        _restore(target, files)
    return target


def _publish(root: Path, prefix: str, files: dict[str, bytes], target: Path) -> bool:
    """Writes ``files`` under a temporary name and renames the folder to ``target``;
    False when another process published the same content first."""
    with temp_dir(root, prefix) as tmp:
        _open_mode(tmp)
        for name, data in files.items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / name).write_bytes(data)
        try:
            tmp.rename(target)
            return True
        except OSError:
            return False


def tree_files(src: Path) -> dict[str, bytes]:
    return {str(p.relative_to(src)): p.read_bytes() for p in sorted(src.rglob("*"))
            if p.is_file()}


def stage_tree(src: Path, root: Path, name: str) -> Path:
    """A third-party include tree at ``root/<name>/include`` (a fixed path per version,
    so module ids match on every checkout), checked against ``src`` on each use."""
    files = {f"include/{k}": v for k, v in tree_files(src).items()}
    target = Path(root) / name
    prepare_root(Path(root))
    if target.is_dir() or not _publish(Path(root), ".tree-", files, target):
        _restore(target, files)
    return target / "include"
