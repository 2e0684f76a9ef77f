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


def test_the_slow_mark_follows_from_what_a_test_uses() -> None:
    """Slow marks are derived, not listed: a real server, Ray, NeMo Gym, a browser or a fresh
    MLflow store make a test slow wherever it is; a test using none of them is not."""
    from tests.conftest import slow_because

    assert slow_because("tests/test_x.py::test_a", ["tmp_path", "mlflow_server"]) == "uses mlflow_server"
    assert slow_because("tests/test_x.py::test_a", ["browser", "tracking_uri"]) == "uses browser, tracking_uri"
    assert slow_because("tests/test_ray.py::test_any", []) == "uses the session's ray_cluster"
    assert slow_because("tests/test_nemo_gym_real.py::test_any", ["tmp_path"]) is not None
    assert slow_because("tests/test_contract.py::test_no_secret_is_stored[wandb]", []) is not None
    assert slow_because("tests/test_contract.py::test_no_secret_is_stored[local]", ["store"]) is None
    assert slow_because("tests/test_x.py::test_a", ["tmp_path", "quickstart_run", "capsys"]) is None


# Tests known to take 3 s or more, each slow for a different reason: its own mark, a fixture, the
# contract suite's marks, a session service; and one known quick test beside them.
KNOWN_SLOW = (
    "tests/reliability/test_crash.py::test_local_export_killed_then_rerun[publish_receipt#1-after]",
    "tests/test_mlflow_report.py::test_report_failure_never_fails_the_mlflow_export[sqlite]",
    "tests/test_mlflow_report.py::test_mlflow_export_killed_while_building_the_report_keeps_run_and_receipt",
    "tests/test_report_charts.py::test_every_mark_lies_inside_its_chart[0]",
    "tests/test_contract.py::test_export_skip_and_change[local]",
    "tests/test_contract.py::test_live_then_certify[mlflow]",
    "tests/test_contract.py::test_class_keeps_the_contract[phoenix]",
)
KNOWN_QUICK = (
    "tests/test_contract.py::test_listing_imports_no_sdk[local]",
    "tests/test_mlflow_report.py::test_report_choices_are_the_local_backends",
    "tests/reliability/test_crash.py::test_session_killed_mid_finalize[_copy_fd#3]",
)


@pytest.mark.slow
def test_the_known_slow_tests_are_marked_slow_and_a_quick_one_is_not() -> None:
    """``-m slow`` collects every known slow test and none of the known quick ones."""
    files = sorted({nodeid.split("::", 1)[0] for nodeid in KNOWN_SLOW + KNOWN_QUICK})
    proc = run_bounded(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "slow", "-n", "0", "-p", "no:cacheprovider", *files],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    collected = set(proc.stdout.splitlines())
    assert [n for n in KNOWN_SLOW if n not in collected] == []
    assert [n for n in KNOWN_QUICK if n in collected] == []
