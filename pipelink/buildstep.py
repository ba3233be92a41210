"""How SCons runs a build step: ``python -m pipelink.buildstep compile|link ...``.

The steps live in :mod:`pipelink.sconsrun`; this module imports and runs them inside a
``try``, so that Ctrl-C while Python is still loading the steps' modules (the placer,
the schema, the toolchain) or reading the command line ends the step with one line and
status 130, as it does once the step runs, never with a traceback.

Earlier still, while the interpreter itself starts, a Ctrl-C would make CPython die
with "Fatal Python error" and a traceback of its own. The SCons tool starts each step
with SIGINT blocked (the mask survives exec; the step runs without ``sh -c``, as dash
clears it), so such a Ctrl-C waits, pending, until main() unblocks it inside the
``try``.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from typing import Any


def main(argv: list[str] | None = None) -> int:
    missed: list[BaseException] = []
    sys.unraisablehook = _holding_interrupts(missed)
    try:
        if hasattr(signal, "pthread_sigmask"):
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        from .sconsrun import main as run
        status = run(argv)   # inside too: a Ctrl-C may land before run's own handler
    except KeyboardInterrupt:
        status = None
    if status is None or missed:
        print("pipelink: interrupted", file=sys.stderr)
        return 130
    return status


def _holding_interrupts(missed: list[BaseException]) -> Callable[[Any], None]:
    """An unraisable-exception hook that keeps a Ctrl-C for main. One that lands in a
    callback Python runs for itself (importlib's module-lock cleanup, during an import)
    cannot propagate: the default hook prints "Exception ignored in" and a traceback,
    and the step would go on as if never interrupted."""
    def hook(unraisable: Any) -> None:
        if issubclass(unraisable.exc_type, KeyboardInterrupt):
            missed.append(unraisable.exc_value)
        else:
            sys.__unraisablehook__(unraisable)
    return hook


if __name__ == "__main__":
    sys.exit(main())
