"""Ctrl-C at the worst moments: between making a temporary and entering the block that
removes it (pipelink.interrupts.held), and while a build step's interpreter is still
starting (the SCons tool starts steps with SIGINT blocked; pipelink.buildstep unblocks
it inside its handler, so a held Ctrl-C ends the step with one line and status 130)."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from pipelink import interrupts
from pipelink.objfile import write_atomic
from pipelink.stage import temp_dir

ROOT = Path(__file__).resolve().parents[2]


def test_a_signal_inside_held_is_raised_once_it_ends():
    reached = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts.held():
            os.kill(os.getpid(), signal.SIGINT)
            reached.append("after the signal")
        reached.append("after the block")
    assert reached == ["after the signal"]


@pytest.mark.parametrize("make", ["folder", "file"])
def test_a_ctrl_c_as_the_temporary_is_made_leaves_nothing(tmp_path, monkeypatch, make):
    """The signal lands inside mkdtemp/mkstemp, after the temporary exists: it is raised
    once the cleanup knows the name, and the temporary goes."""
    import tempfile
    real = {"folder": tempfile.mkdtemp, "file": tempfile.mkstemp}[make]

    def interrupted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        made = real(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)
        return made
    monkeypatch.setattr(tempfile, "mkdtemp" if make == "folder" else "mkstemp", interrupted)
    root = tmp_path / "root"
    with pytest.raises(KeyboardInterrupt):
        if make == "folder":
            with temp_dir(root, ".out-"):
                pass
        else:
            root.mkdir()
            write_atomic(root / "out.bin", b"data")
    assert list(root.iterdir()) == []


def test_a_step_started_with_a_held_ctrl_c_ends_with_one_line():
    code = ("import os, signal, sys\n"
            "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})\n"
            "os.kill(os.getpid(), signal.SIGINT)\n"
            "from pipelink import buildstep\n"
            "sys.exit(buildstep.main(['--help']))\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=60)
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr == "pipelink: interrupted\n"
    assert "Traceback" not in proc.stdout + proc.stderr



def test_a_ctrl_c_while_the_step_reads_its_command_line_ends_with_one_line(monkeypatch,
                                                                           capsys):
    """The window between the import and sconsrun.main's own handler: argparse."""
    from pipelink import buildstep, sconsrun

    def interrupted() -> None:
        raise KeyboardInterrupt
    monkeypatch.setattr(sconsrun, "parser", interrupted)
    assert buildstep.main(["compile", "x"]) == 130
    assert capsys.readouterr().err == "pipelink: interrupted\n"



def test_a_ctrl_c_python_cannot_raise_still_ends_the_step_with_one_line(monkeypatch, capsys):
    """A Ctrl-C landing in a callback Python runs for itself (importlib's module-lock
    cleanup) goes to the unraisable hook, not up the stack: the default hook printed
    "Exception ignored in" and a traceback, and the step went on."""
    from pipelink import buildstep, sconsrun

    def run(argv: list[str] | None) -> int:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as exc:
            sys.unraisablehook(SimpleNamespace(exc_type=type(exc), exc_value=exc,
                                               exc_traceback=None, err_msg=None,
                                               object=None))
        return 0
    monkeypatch.setattr(sconsrun, "main", run)
    monkeypatch.setattr(sys, "unraisablehook", sys.__unraisablehook__)
    assert buildstep.main(["compile", "x"]) == 130
    assert capsys.readouterr().err == "pipelink: interrupted\n"

def _scons_tool() -> ModuleType:
    """The SCons tool (site_scons/site_tools/pipelink), under a name of its own: the
    package it sits beside is also called pipelink."""
    path = ROOT / "site_scons" / "site_tools" / "pipelink" / "__init__.py"
    spec = importlib.util.spec_from_file_location("pipelink_scons_tool", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_scons_tool_starts_a_step_with_sigint_blocked(tmp_path):
    """Through the tool's SPAWN, a step's interpreter starts with SIGINT blocked even
    where /bin/sh is dash, which clears the mask it inherits; other commands still run
    under the shell."""
    import SCons.Platform.posix as posix
    spawn = _scons_tool()._spawn_with_sigint_held(posix.subprocess_spawn)
    python = tmp_path / "python"   # stands in for the interpreter: reports its mask
    python.write_text(f"#!{sys.executable}\n"
                      "import signal, sys\n"
                      "blocked = signal.pthread_sigmask(signal.SIG_BLOCK, set())\n"
                      "open(sys.argv[-1], 'w').write(str(signal.SIGINT in blocked))\n")
    python.chmod(0o755)
    report = tmp_path / "a dir" / "mask.txt"   # a blank: SCons quotes the argument
    report.parent.mkdir()
    env = dict(os.environ)
    args = [str(python), "-m", "pipelink.buildstep", posix.escape(str(report))]
    assert spawn("sh", posix.escape, args[0], args, env) == 0
    assert report.read_text() == "True"

    shell = tmp_path / "shell.txt"   # not a step: the shell still reads the line
    assert spawn("sh", posix.escape, "echo", ["echo", "$HOME", ">", str(shell)], env) == 0
    assert shell.read_text().strip() == os.environ["HOME"]


def test_a_step_whose_interpreter_is_missing_fails_in_one_line(tmp_path, capfd):
    import SCons.Platform.posix as posix
    spawn = _scons_tool()._spawn_with_sigint_held(posix.subprocess_spawn)
    missing = str(tmp_path / "no-python")
    args = [missing, "-m", "pipelink.buildstep", "compile"]
    assert spawn("sh", posix.escape, missing, args, dict(os.environ)) == 127
    assert capfd.readouterr().err == f"pipelink: cannot run {missing}: No such file or directory\n"
