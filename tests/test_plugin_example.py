"""The example plugin (examples/ledger_plugin) as a user gets it: built, installed into a fresh
folder, listed by ``gym-artifacts exporters`` and put through the contract suite with one command."""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.processes import run_bounded

REPO = Path(__file__).resolve().parent.parent
PLUGIN = REPO / "examples" / "ledger_plugin"


@pytest.mark.slow
def test_example_plugin_installs_lists_and_passes_the_contract_suite(tmp_path: Path) -> None:
    from hatchling.builders.wheel import WheelBuilder

    (wheel,) = WheelBuilder(str(PLUGIN)).build(directory=str(tmp_path / "dist"), versions=["standard"])
    target = tmp_path / "site"
    run_bounded(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(target), wheel],
        check=True, timeout=120, capture_output=True,
    )  # fmt: skip
    # A fresh folder for the plugin, this environment's gym-artifacts under it; no copy of the
    # plugin anywhere else on the path (an editable install of it would shadow the wheel's).
    paths = [str(target), str(REPO), sysconfig.get_paths()["purelib"]]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    env.pop("GYM_ARTIFACTS_CONTRACT", None)
    cli = "import sys; from gym_artifacts.cli import main; sys.exit(main(sys.argv[1:]))"
    listing = run_bounded([sys.executable, "-S", "-c", cli, "exporters"], env=env, cwd=tmp_path,
                             capture_output=True, text=True, timeout=120)  # fmt: skip
    assert listing.returncode == 0, listing.stderr[-2000:]
    [row] = [line.split() for line in listing.stdout.splitlines() if line.startswith("ledger ")]
    assert row[-1] == "gym-artifacts-ledger"  # listed, with its provider
    probe = "import gym_artifacts_ledger as m; print(m.__file__)"
    where = run_bounded([sys.executable, "-S", "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert Path(where.stdout.strip()).is_relative_to(target), where.stderr
    # The documented command (docs/plugins.md): python -m gym_artifacts.testing ledger
    suite = run_bounded([sys.executable, "-S", "-m", "gym_artifacts.testing", "ledger"], env=env,
                           cwd=tmp_path, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert suite.returncode == 0, suite.stdout[-3000:] + suite.stderr[-2000:]
    assert "7 passed" in suite.stdout, suite.stdout[-2000:]


SERVICE_FIXTURES = '''
import pytest
from gym_artifacts.testing.contract import ContractService
from tests.langsmith_api import LangsmithApi

@pytest.fixture(scope="session")
def contract_service_langsmith():
    api = LangsmithApi().start()
    yield ContractService(
        settings=lambda folder: {"api_url": api.url, "dataset_name": f"contract-{folder.name}"},
        stored=lambda: [r.body for r in api.state.requests],
    )
    api.stop()
'''


@pytest.mark.slow
def test_a_service_backend_runs_the_suite_with_the_documented_fixture_module(tmp_path: Path) -> None:
    """docs/plugins.md: ``python -m gym_artifacts.testing NAME -- -p MODULE`` with a
    ``contract_service_<name>`` fixture in MODULE; without it the backend is skipped, saying why."""
    pytest.importorskip("langsmith")
    (tmp_path / "contract_fixtures.py").write_text(SERVICE_FIXTURES)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "gym_artifacts.testing", "langsmith", "--", "-rs",
               "-W", "ignore::DeprecationWarning"]  # fmt: skip
    bare = run_bounded(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert "7 skipped" in bare.stdout and "no fixture contract_service_langsmith" in bare.stdout, bare.stdout[-2000:]
    served = run_bounded([*command, "-p", "contract_fixtures"], env=env, cwd=tmp_path, capture_output=True,
                            text=True, timeout=300)  # fmt: skip
    assert served.returncode == 0, served.stdout[-3000:] + served.stderr[-2000:]
    # LangSmith logs live (issue 24): the live tests (live then certify, resume) run too
    assert "7 passed" in served.stdout, served.stdout[-2000:]
