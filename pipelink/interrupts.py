"""Ctrl-C (SIGINT) and SIGTERM between making a temporary file and entering the block
that removes it would leave the temporary behind. :func:`held` defers both signals for
that step: one that lands meanwhile is recorded, and raised again as the block ends,
once the cleanup is in place::

    path = None
    try:
        with held():
            path = make_temporary()
        ...                      # a Ctrl-C held above is raised here, path known
    finally:
        if path is not None:
            remove(path)

Python runs signal handlers in the main thread only, so that is the thread it defers
them in (whatever thread the kernel delivered them to); in other threads no signal
handler runs, and nothing needs holding. A signal whose handler was not set from
Python (signal.getsignal says None) is left alone: it could not be put back.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

HELD = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def held() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    landed: list[int] = []

    def defer(signum: int, frame: Any) -> None:
        landed.append(signum)

    previous = {s: signal.signal(s, defer) for s in HELD if signal.getsignal(s) is not None}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for s in dict.fromkeys(landed):     # each once, in the order they came
            signal.raise_signal(s)          # to its own handler now
