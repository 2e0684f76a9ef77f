"""A pytest plugin (tests/conftest.py loads it): every subprocess a test starts with pipes has
them closed by the end of that test, or the test errors at teardown naming what it left open.

Each ``subprocess.Popen`` that test code makes while a test runs (its fixtures' setup
included; session fixtures made earlier are not the test's; an SDK's or the library's own are
not recorded) is. At the test's teardown, any whose pipes
are still open is reaped (killed if it still runs, waited for, pipes closed: tests/processes.py),
so that nothing of it reaches the garbage collector during a later test: pytest would fail that
innocent test on the unraisable ``ResourceWarning: unclosed file`` (issue 42, 15). A test that
passed but left pipes open gets an error saying so; one that failed keeps its own failure.
"""

from __future__ import annotations

import subprocess
import sys
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.processes import reap

_made: list[weakref.ref[subprocess.Popen[Any]]] | None = None  # while a test runs: its Popens
_original_init = subprocess.Popen.__init__


REPO = Path(__file__).resolve().parent.parent
# Code whose subprocesses are not a test's own: the interpreter's and the installed packages'
# (an SDK's long-lived service, such as wandb-core, outlives the test that started it by design),
# and the library's.
NOT_TEST_CODE = tuple(dict.fromkeys([sys.prefix, sys.base_prefix, str(REPO / "gym_artifacts"), str(REPO / "exporters")]))


def _recording_init(self: subprocess.Popen[Any], *args: Any, **kwargs: Any) -> None:
    _original_init(self, *args, **kwargs)
    if _made is not None and not sys._getframe(1).f_code.co_filename.startswith(NOT_TEST_CODE):
        _made.append(weakref.ref(self))


subprocess.Popen.__init__ = _recording_init  # type: ignore[method-assign]


def _open_pipes(proc: subprocess.Popen[Any]) -> list[str]:
    return [name for name in ("stdin", "stdout", "stderr")
            if (stream := getattr(proc, name, None)) is not None and not stream.closed]  # fmt: skip


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    global _made
    _made = []
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    global _made
    yield
    made, _made = _made or [], None
    left = []
    for ref in made:
        proc = ref()
        if proc is None:
            continue
        pipes = _open_pipes(proc)
        if pipes:
            running = proc.poll() is None
            reap(proc)
            left.append(f"{proc.args!r} ({', '.join(pipes)}{'; still running, killed' if running else ''})")
    if left and not _failed(item):
        raise AssertionError(f"the test left subprocess pipes open (now closed): {'; '.join(left)}")


def _failed(item: pytest.Item) -> bool:
    """Whether the test itself failed (its own failure says enough; the leak was cleaned up)."""
    report = getattr(item, "_leaks_call_report", None)
    return bool(report is not None and report.failed)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item._leaks_call_report = report  # type: ignore[attr-defined]
