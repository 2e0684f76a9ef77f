"""Packaging: an unrelated ``exporters`` package first on the path cannot shadow the built-in backends.

The repository keeps its backends in a top-level ``exporters/`` folder; installs expose them as
``gym_artifacts._builtin_exporters``. Each case runs the CLI in a fresh interpreter whose current
directory and first ``sys.path`` entry hold somebody else's ``exporters`` package (whose
``local`` module would fail loudly if imported), and checks the listing, an export's bytes, and
that the user's own package still imports as itself.
"""

from __future__ import annotations

import json
import os
import sys
import sysconfig
from importlib.metadata import distribution
from pathlib import Path

import pytest

from tests.processes import run_bounded

REPO = Path(__file__).resolve().parent.parent

CHECK = """
import inspect, json, sys
import exporters
from gym_artifacts.cli import main
from gym_artifacts.contract.registry import discover
loaded = {name: inspect.getfile(discover()[name].load()) for name in ("local", "mlflow", "wandb")}
import gym_artifacts
code = main(sys.argv[1:])
print(json.dumps({"code": code, "loaded": loaded, "user_exporters": exporters.WHO,
                  "gym_artifacts": gym_artifacts.__file__}))
"""


@pytest.fixture
def shadow(tmp_path: Path) -> Path:
    """A folder holding an unrelated ``exporters`` package (with its own ``local`` module)."""
    pkg = tmp_path / "shadow" / "exporters"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text('WHO = "somebody else"\n')
    (pkg / "local.py").write_text('raise ImportError("the unrelated exporters.local was imported")\n')
    (pkg / "mlflow.py").write_text('raise ImportError("the unrelated exporters.mlflow was imported")\n')
    return pkg.parent


def _run(python_args: list[str], shadow: Path, quickstart_run: Path, store: Path, env: dict[str, str]) -> dict:
    argv = ["export", str(quickstart_run), "-e", "local", f"exporters.local.root={store}", "--json"]
    proc = run_bounded(
        [sys.executable, *python_args, "-c", CHECK, *argv],
        cwd=shadow, env={**os.environ, **env}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["code"] == 0
    assert report["user_exporters"] == "somebody else"  # the user's package still imports as itself
    for name in ("local", "mlflow", "wandb"):
        assert Path(report["loaded"][name]).parent.name == "_builtin_exporters" or Path(
            report["loaded"][name]
        ).parent == REPO / "exporters", report["loaded"]
    exported = list(store.rglob("rollouts.jsonl"))
    assert len(exported) == 1
    assert exported[0].read_bytes() == quickstart_run.read_bytes()
    return report


@pytest.mark.slow
def test_editable_install_ignores_an_unrelated_exporters_package(
    shadow: Path, quickstart_run: Path, tmp_path: Path
) -> None:
    direct_url = distribution("gym-artifacts").read_text("direct_url.json") or "{}"
    if not json.loads(direct_url).get("dir_info", {}).get("editable"):
        pytest.skip("gym-artifacts is not installed editable in this environment")
    report = _run([], shadow, quickstart_run, tmp_path / "store", {"PYTHONPATH": str(shadow)})
    assert Path(report["gym_artifacts"]).is_relative_to(REPO)
    assert Path(report["loaded"]["local"]) == REPO / "exporters" / "local.py"


@pytest.mark.slow
def test_wheel_install_ignores_an_unrelated_exporters_package(
    shadow: Path, quickstart_run: Path, tmp_path: Path
) -> None:
    from hatchling.builders.wheel import WheelBuilder

    (wheel,) = WheelBuilder(str(REPO)).build(directory=str(tmp_path / "dist"), versions=["standard"])
    target = tmp_path / "site"
    run_bounded(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(target), wheel],
        check=True, timeout=120, capture_output=True,
    )  # fmt: skip
    assert not (target / "exporters").exists()  # the wheel ships no top-level ``exporters``
    # -S: no .pth files, so the checkout (the editable install) stays off the path; the wheel's
    # folder comes right after the unrelated package, dependencies from this environment after.
    env = {"PYTHONPATH": os.pathsep.join([str(shadow), str(target), sysconfig.get_paths()["purelib"]])}
    report = _run(["-S"], shadow, quickstart_run, tmp_path / "store", env)
    assert Path(report["gym_artifacts"]).is_relative_to(target)
    assert Path(report["loaded"]["local"]) == target / "gym_artifacts" / "_builtin_exporters" / "local.py"
