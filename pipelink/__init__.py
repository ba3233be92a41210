"""PipeLink: a contract-guided linker for GPU kernel components."""

from __future__ import annotations

__version__ = "0.1.0"


def load(path: str):  # noqa: ANN201  (the runtime's op type)
    """Loads a built kernel folder as a callable (see :mod:`pipelink.runtime`)."""
    from .runtime import load as _load
    return _load(path)
