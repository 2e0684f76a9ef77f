"""``gym-artifacts instrument -- COMMAND``: run a program you do not edit with NeMo Gym's exporter
module replaced by gym-artifacts' drop-in (``gym_artifacts.nemo_gym``), in that program and every
Python process it starts.

The ecosystem's convention for instrumenting a program without editing it
(``opentelemetry-instrument``, ``ddtrace-run``): the command replaces this process (``exec``), so
its exit code, its signals and its process id are the command's own, with one change to its
environment: the start-up hook folder ``startup/`` beside this module (one ``sitecustomize``) goes
first on ``PYTHONPATH``. Children inherit the environment, so NeMo Gym's servers and Ray's workers
get the hook too; nothing is installed, and nothing remains once the command ends.

NeMo Gym binds its exporter functions by name when its modules are imported
(``from nemo_gym.exporters import setup_exporters`` in ``global_config.py``,
``rollout_collection.py``, ``rollout_reverification.py``): only a module that *is* the drop-in
before those imports reaches them, which is what the hook arranges.

What it cannot reach: a Python started with ``-E``/``-I`` (they ignore ``PYTHONPATH``) or with a
cleared environment, and a Python where gym-artifacts is not installed (the hook then says so on
stderr and NeMo Gym's own module loads there). The command's own interpreter is checked before it
starts: a Python script (``gym`` is one) whose interpreter cannot import gym-artifacts is refused
with the ``pip install`` to run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

SITE_DIR = Path(__file__).resolve().parent / "startup"
EXIT_NOT_FOUND, EXIT_NOT_EXECUTABLE = 127, 126  # the shell's codes for a command it cannot run
EXIT_USAGE = 2


class InstrumentError(Exception):
    """The command cannot be run instrumented; ``code`` is the exit code to end with."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def instrumented_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` with the hook folder first on ``PYTHONPATH`` (once: instrumenting an
    instrumented command changes nothing)."""
    env = dict(environ)
    entries = [e for e in env.get("PYTHONPATH", "").split(os.pathsep) if e]
    site = str(SITE_DIR)
    entries = [site, *(e for e in entries if _resolved(e) != _resolved(site))]
    env["PYTHONPATH"] = os.pathsep.join(entries)
    return env


def _resolved(entry: str) -> str:
    return os.path.realpath(entry)


def resolve_command(command: Sequence[str], environ: Mapping[str, str]) -> str:
    """The executable ``command[0]`` names, found as the shell finds it (``PATH``)."""
    if not command:
        raise InstrumentError(
            "instrument: no command given (gym-artifacts instrument -- COMMAND ...)", EXIT_USAGE
        )
    found = shutil.which(command[0], path=environ.get("PATH", os.defpath))
    if found is None:
        if os.path.exists(command[0]) and ("/" in command[0]):
            raise InstrumentError(f"instrument: {command[0]}: not executable", EXIT_NOT_EXECUTABLE)
        raise InstrumentError(f"instrument: {command[0]}: command not found", EXIT_NOT_FOUND)
    return found


def python_of(executable: str) -> str | None:
    """The Python interpreter that runs ``executable``: itself when it is a Python, the
    interpreter its ``#!`` line names when it is a Python script; else None (not Python)."""
    if _is_python_name(Path(executable).name):
        return executable
    try:
        with open(executable, "rb") as fh:
            first = fh.readline(512)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode(errors="replace").split()
    if not words:
        return None
    if Path(words[0]).name == "env":  # "#!/usr/bin/env python3"
        words = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
        if not words:
            return None
        found = shutil.which(words[0])
        return found if found and _is_python_name(Path(words[0]).name) else None
    return words[0] if _is_python_name(Path(words[0]).name) else None


def _is_python_name(name: str) -> bool:
    return name.startswith("python") or name.startswith("pypy")


def check_interpreter(python: str, environ: Mapping[str, str]) -> None:
    """Refuse a Python that cannot import gym-artifacts (the hook would do nothing there)."""
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('gym_artifacts') is None)"
    try:
        proc = subprocess.run(
            [python, "-c", probe], env=dict(environ), capture_output=True, timeout=60
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return  # the command itself will say what is wrong with its interpreter
    if proc.returncode == 1:
        raise InstrumentError(
            f"instrument: gym-artifacts is not installed in {python}, the Python that runs the "
            f"command: install it there first ({python} -m pip install gym-artifacts), so that "
            "NeMo Gym's exporters can be replaced in that process",
            EXIT_USAGE,
        )


def exec_instrumented(command: Sequence[str], environ: Mapping[str, str] | None = None) -> None:
    """Replace this process by ``command`` under the instrumented environment (never returns).

    Raises InstrumentError (nothing run) for a missing command, one that cannot be executed, or
    a Python command whose interpreter cannot import gym-artifacts.
    """
    env = instrumented_environment(os.environ if environ is None else environ)
    executable = resolve_command(command, env)
    python = python_of(executable)
    if python is not None:
        check_interpreter(python, env)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(executable, list(command), env)
    except PermissionError as exc:
        raise InstrumentError(f"instrument: {command[0]}: {exc.strerror}", EXIT_NOT_EXECUTABLE) from exc
    except OSError as exc:
        raise InstrumentError(f"instrument: {command[0]}: {exc.strerror}", EXIT_NOT_EXECUTABLE) from exc
