"""How SCons runs a build step: ``python -m pipelink.buildstep compile|link ...``.

The steps live in :mod:`pipelink.sconsrun`; this module only imports it inside a
``try``, so that Ctrl-C while Python is still loading the steps' modules (the placer,
the schema, the toolchain) ends the step with one line and status 130, as it does once
the step runs, never with a traceback.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    try:
        from .sconsrun import main as run
    except KeyboardInterrupt:
        print("pipelink: interrupted", file=sys.stderr)
        return 130
    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
