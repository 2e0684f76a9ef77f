"""Issue 42 (15): a test that fails must still clean up what it started, and no test leaks a
descriptor. A test module run by pytest in a subprocess (with this suite's plugins and warning
filters): its first test starts a subprocess with pipes and fails while the subprocess runs,
the Popen kept alive past the test (as a failure's traceback keeps it); its second test does
nothing wrong. The leak is the first test's error; the second one passes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.load import scaled
from tests.processes import reaped, run_bounded

RUN = run_bounded  # how the suite runs a command with a time limit (tests/processes.py)

REPO = Path(__file__).resolve().parent.parent

LEAKY_MODULE = '''
import gc
import re
import subprocess
import sys

KEPT = []  # what a failure's traceback keeps alive until some later test

def test_fails_while_its_subprocess_runs():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    KEPT.append(proc)
    assert False, "failed while the subprocess still runs"

def test_innocent():
    KEPT.clear()
    gc.collect()

def test_passes_but_leaves_its_pipes_open():
    proc = subprocess.Popen([sys.executable, "-c", "pass"], stdout=subprocess.PIPE)
    proc.wait()
    KEPT.append(proc)

def test_innocent_too():
    KEPT.clear()
    gc.collect()
'''


def test_a_leaked_subprocess_is_the_leaking_tests_failure_not_a_later_ones(tmp_path: Path) -> None:
    module = tmp_path / "test_leaky.py"
    module.write_text(LEAKY_MODULE)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", str(module), "-p", "tests.leaks", "-n", "0", "-p", "no:cacheprovider",
         "-p", "no:randomly", "-W", "error", "-q", "-rA", "--rootdir", str(tmp_path), "-c", "/dev/null"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    with reaped(proc):
        out, _ = proc.communicate(timeout=scaled(120))
    outcomes = {name: [k for k, n in re.findall(r"^(PASSED|FAILED|ERROR) \S*test_leaky\.py::(\w+)", out, re.M)
                       if n == name] for name in ("test_innocent", "test_innocent_too",
                                                  "test_fails_while_its_subprocess_runs",
                                                  "test_passes_but_leaves_its_pipes_open")}  # fmt: skip
    assert outcomes["test_innocent"] == ["PASSED"], out[-4000:]
    assert outcomes["test_innocent_too"] == ["PASSED"], out[-4000:]
    assert "FAILED" in outcomes["test_fails_while_its_subprocess_runs"], out[-4000:]
    # a test that passed but left its pipes open: its teardown errors, naming what it left
    assert "ERROR" in outcomes["test_passes_but_leaves_its_pipes_open"] and "left subprocess pipes open" in out, out[-4000:]


# A command that starts a helper of its own (as the CLI starts export workers and a background
# report process): the helper holds the command's output pipes, then both sleep.
STARTS_A_HELPER = """
import pathlib, subprocess, sys, time
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
pathlib.Path(sys.argv[1]).write_text(str(helper.pid))
print("started", flush=True)
time.sleep(120)
"""


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie nobody reaped yet has ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def _open_descriptors() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_a_timed_out_command_leaves_no_process_and_no_descriptor(tmp_path: Path) -> None:
    """The suite's way of running a command with a time limit: when the limit passes, the
    command and every process it started are ended, and no pipe of theirs stays open here."""
    pid_file = tmp_path / "helper.pid"
    before = _open_descriptors()
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as raised:
        RUN([sys.executable, "-c", STARTS_A_HELPER, str(pid_file)], capture_output=True, text=True,
            timeout=scaled(10))  # fmt: skip
    assert time.monotonic() - started < scaled(10) + scaled(30)  # ended at its limit, not at its helper's end
    assert b"started" in (raised.value.stdout or b"")  # what it wrote before its limit is kept
    helper = int(pid_file.read_text())
    deadline = time.monotonic() + scaled(10)
    while _running(helper) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(helper), "the command's own helper process still runs"
    assert _open_descriptors() <= before, "a pipe of the command is still open"


def test_the_suite_runs_commands_only_through_run_bounded() -> None:
    """No test calls ``subprocess.run`` itself (its timeout kills the command, not what the
    command started): commands go through ``run_bounded`` (tests/processes.py). Code a test
    hands to a child interpreter (a string) is the child's own business."""
    import ast

    calls = []
    for fpath in sorted((REPO / "tests").rglob("*.py")):
        if fpath.name == "processes.py":
            continue
        for node in ast.walk(ast.parse(fpath.read_text(), str(fpath))):
            func = node.func if isinstance(node, ast.Call) else None
            if isinstance(func, ast.Attribute) and func.attr in ("run", "call", "check_call", "check_output") \
                    and isinstance(func.value, ast.Name) and func.value.id == "subprocess":  # fmt: skip
                calls.append(f"{fpath.relative_to(REPO)}:{node.lineno} subprocess.{func.attr}")
    assert not calls, calls
