"""The example plugin (examples/ledger_plugin) as a user gets it: built, installed into a fresh
folder, listed by ``gym-artifacts exporters`` and put through the contract suite with one command."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PLUGIN = REPO / "examples" / "ledger_plugin"


@pytest.mark.slow
def test_example_plugin_installs_lists_and_passes_the_contract_suite(tmp_path: Path) -> None:
    from hatchling.builders.wheel import WheelBuilder

    (wheel,) = WheelBuilder(str(PLUGIN)).build(directory=str(tmp_path / "dist"), versions=["standard"])
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(target), wheel],
        check=True, timeout=120, capture_output=True,
    )  # fmt: skip
    # A fresh folder for the plugin, this environment's gym-artifacts under it; no copy of the
    # plugin anywhere else on the path (an editable install of it would shadow the wheel's).
    paths = [str(target), str(REPO), sysconfig.get_paths()["purelib"]]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    env.pop("GYM_ARTIFACTS_CONTRACT", None)
    cli = "import sys; from gym_artifacts.cli import main; sys.exit(main(sys.argv[1:]))"
    listing = subprocess.run([sys.executable, "-S", "-c", cli, "exporters"], env=env, cwd=tmp_path,
                             capture_output=True, text=True, timeout=120)  # fmt: skip
    assert listing.returncode == 0, listing.stderr[-2000:]
    [row] = [line.split() for line in listing.stdout.splitlines() if line.startswith("ledger ")]
    assert row[-1] == "gym-artifacts-ledger"  # listed, with its provider
    probe = "import gym_artifacts_ledger as m; print(m.__file__)"
    where = subprocess.run([sys.executable, "-S", "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert Path(where.stdout.strip()).is_relative_to(target), where.stderr
    # The documented command (docs/plugins.md): python -m gym_artifacts.testing ledger
    suite = subprocess.run([sys.executable, "-S", "-m", "gym_artifacts.testing", "ledger"], env=env,
                           cwd=tmp_path, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert suite.returncode == 0, suite.stdout[-3000:] + suite.stderr[-2000:]
    assert "6 passed" in suite.stdout, suite.stdout[-2000:]
