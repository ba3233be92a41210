"""One error hierarchy for everything PipeLink reports to a user.

Every error names what it is about (file, component, port, field) so the CLI and
the SCons tool can print it as one message, never as a traceback.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class PipeLinkError(Exception):
    """Root of every error PipeLink raises on purpose.

    ``where`` is the file (and key) the error is about; ``hint`` says what to change;
    ``log`` carries a tool's full output for toolchain failures.
    """

    kind = "error"

    def __init__(self, message: str, *, where: str | None = None, hint: str | None = None,
                 log: str | None = None) -> None:
        self.message = message
        self.where = where
        self.hint = hint
        self.log = log
        super().__init__(self.render())

    def render(self) -> str:
        head = f"{self.where}: {self.message}" if self.where else self.message
        if self.hint:
            head += f"\n  hint: {self.hint}"
        if self.log:
            head += "\n" + "\n".join("  | " + line for line in self.log.rstrip().splitlines())
        return head


class ContractError(PipeLinkError):
    """A component contract is malformed or inconsistent."""


class RecipeError(PipeLinkError):
    """A recipe is malformed or names something that does not exist."""


class ObjectFormatError(PipeLinkError):
    """A file is not a PipeLink object, or is corrupted."""


class CheckError(PipeLinkError):
    """Components do not fit together (ports, arrivals, barriers, archs)."""

    def __init__(self, problems: list[str] | str, **kw) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems), **kw)


class PlacementError(PipeLinkError):
    """The demands of a kernel do not fit on one SM."""


class GlueError(PipeLinkError):
    """The glue generator met a wiring it cannot express."""


class LinkError(PipeLinkError):
    """nvJitLink failed, or the linked code broke a linker guarantee."""


class ToolchainError(PipeLinkError):
    """nvcc or nvJitLink is missing, too old, or failed."""


class RuntimeLaunchError(PipeLinkError):
    """Loading or launching a linked kernel failed, or its arguments are wrong."""


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """``"did you mean 'x'? "`` for the known name closest to a misspelt one, else ``""``:
    the start of a hint that then lists them all."""
    close = difflib.get_close_matches(name, list(known), n=1)
    return f"did you mean '{close[0]}'? " if close else ""
