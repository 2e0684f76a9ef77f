"""README's test command is what CI runs: one set-up + test script, ``scripts/test.sh``.

README's first ``bash`` block holds the command (``bash scripts/test.sh``); ``.ci/run`` must run
exactly that line, so a user's run and CI's can never drift apart again. The script itself must
set up everything the suite needs on a fresh machine and hand its arguments to pytest (the quick
subset is ``bash scripts/test.sh -m "not slow"``).
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.processes import run_bounded

REPO = Path(__file__).resolve().parent.parent
COMMAND = "bash scripts/test.sh"


def _first_bash_block(markdown: str) -> list[str]:
    """The lines of the first fenced ``bash`` block."""
    match = re.search(r"^```bash\n(.*?)^```", markdown, flags=re.S | re.M)
    assert match, "README.md has no ```bash block"
    return [line.strip() for line in match.group(1).splitlines()]


def _commands(script: str) -> list[str]:
    """A shell script's command lines (no comments, no blank lines, no shell options)."""
    lines = [line.strip() for line in script.splitlines()]
    return [line for line in lines if line and not line.startswith("#") and not line.startswith("set -")]


def test_readme_command_two_is_the_test_script() -> None:
    assert COMMAND in _first_bash_block((REPO / "README.md").read_text())


def test_ci_runs_the_readme_command_verbatim() -> None:
    readme = _first_bash_block((REPO / "README.md").read_text())
    readme_command = next(line for line in readme if line.startswith("bash scripts/"))
    ci = _commands((REPO / ".ci" / "run").read_text())
    # .ci/run only moves to the checkout's root, then runs the README's line unchanged.
    assert ci[-1] == readme_command
    assert [line for line in ci[:-1] if not line.startswith("cd ")] == []


def test_the_script_sets_up_a_fresh_machine_and_passes_arguments_to_pytest() -> None:
    script = (REPO / "scripts" / "test.sh").read_text()
    run_bounded(["bash", "-n", str(REPO / "scripts" / "test.sh")], check=True, timeout=30)
    commands = _commands(script)
    assert commands[-1] == 'python -m pytest "$@"'
    for needed in (
        "apt-get install -y -qq chromium",  # the browser tests' Chromium, where missing
        "pip install -q torch==2.13.0",  # torch's CPU build before anything asks for torch
        "install -c .ci/constraints.txt -e '.[all,test]'",  # the lock
        "install -c .ci/constraints.txt ./examples/ledger_plugin",  # the example plugin
        "-c .ci/phoenix-constraints.txt arize-phoenix",  # Phoenix's own environment
        "python -m compileall",
        "ruff check .",
    ):
        assert any(needed in line for line in commands), needed
