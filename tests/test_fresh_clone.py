"""A fresh clone is the whole project: the repository cloned into an empty folder (no sibling
folder of any kind, so nothing beside the checkout) runs the tests that read the NeMo Gym fixtures, and they
pass there, none skipped."""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from tests.processes import run_bounded

REPO = Path(__file__).resolve().parent.parent
SLICE = ["tests/test_nemo_gym.py", "-m", "not slow"]  # reads tests/fixtures/nemo-gym-0.7.0


@pytest.mark.slow
def test_a_clone_without_siblings_runs_the_fixture_tests(tmp_path: Path) -> None:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout: nothing to clone")
    alone = tmp_path / "alone"
    alone.mkdir()
    clone = alone / "gym-artifacts"
    run_bounded(["git", "clone", "-q", str(REPO), str(clone)], check=True, timeout=120, capture_output=True)
    assert os.listdir(alone) == ["gym-artifacts"]  # nothing beside the clone
    assert (clone / "tests" / "fixtures" / "nemo-gym-0.7.0").is_dir()
    # The clone's own code and tests, not this checkout's: a path into this checkout would
    # be a file the clone does not have.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHONPATH"))}
    env["PYTHONPATH"] = str(clone)
    proc = run_bounded(
        [sys.executable, "-m", "pytest", *SLICE, "-n", "0", "-q", "-p", "no:cacheprovider", "-rs"],
        cwd=clone, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert re.search(r"\d+ passed", summary) and "skipped" not in summary, summary
    assert str(REPO) not in proc.stdout  # no traceback or path pointed back into this checkout


# Spellings of a path outside the checkout (written in pieces so this file does not hold them).
OUTSIDE = re.compile("|".join([r"REPO\.parent\b", r"\.\./" + "shared", r"/" + r"work/", r"parent\.parent\.parent"]))
SCANNED = ("tests", "examples", "benchmarks", "docs", "scripts", ".ci", "configs")


def test_no_file_names_a_path_outside_the_checkout() -> None:
    """Tests, examples, benchmarks, docs and scripts name no path beside or above the checkout."""
    found = []
    for top in SCANNED:
        for fpath in sorted((REPO / top).rglob("*")):
            if fpath.is_file() and fpath.suffix in {".py", ".md", ".sh", ".toml", ".yaml", ".yml", ".txt", ""}:
                if "fixtures" in fpath.relative_to(REPO).parts[:2]:
                    continue  # recorded output: its own READMEs say what was replaced
                for lineno, line in enumerate(fpath.read_text(errors="replace").splitlines(), 1):
                    if OUTSIDE.search(line):
                        found.append(f"{fpath.relative_to(REPO)}:{lineno}: {line.strip()}")
    assert found == [], "\n".join(found)


def test_every_listed_slow_test_exists() -> None:
    """A renamed or deleted test cannot linger in tests/slow_tests.txt (it would mark nothing):
    each listed name is defined in its file (or in a module it star-imports)."""
    from tests.conftest import slow_tests

    missing = []
    for entry in sorted(slow_tests()):
        path, _, name = entry.split("[", 1)[0].partition("::")
        source = REPO / path
        text = source.read_text() if source.is_file() else ""
        for star in re.findall(r"^from ([\w.]+) import \*", text, flags=re.M):  # the contract suite
            text += (REPO / (star.replace(".", "/") + ".py")).read_text()
        if not re.search(rf"^(async )?def {re.escape(name)}\(", text, flags=re.M):
            missing.append(entry)
    assert missing == []
