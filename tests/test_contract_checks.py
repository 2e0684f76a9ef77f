"""The contract suite's destination check fails the backends it is meant to catch.

Two post-run backends, each wrong in one way, run through the documented command: one names its
folder as written (so ``./x/`` and ``/abs/x`` are two destinations and a re-export duplicates),
one puts its URL in the destination as given (credentials and all).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.processes import run_bounded

REPO = Path(__file__).resolve().parent.parent

BACKENDS = '''
import json
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from gym_artifacts import plugin as ga
from gym_artifacts.contract import registry


class Settings(ga.ExporterConfig):
    folder: str = "./out"
    url: str = "http://127.0.0.1:9"
    api_key: SecretStr | None = None


class Unresolved(ga.Exporter):
    """Writes the run's rollouts count into ``folder``; its destination is the folder as written."""

    name = "unresolved"
    config_model = Settings

    @classmethod
    def contract_settings(cls, folder: Path) -> dict[str, Any]:
        return {"folder": str(folder)}

    @classmethod
    def destination_for(cls, settings: Any) -> dict[str, Any]:
        return {"folder": settings.folder}

    def _export(self, run: Any, plan: Any) -> Any:
        rows = [r for _, r in ga.iter_jsonl(run.rollouts_fpath)]
        target = Path(self.settings.folder) / f"{plan.run_identity.removeprefix('b3:')[:16]}.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        ga.atomic_write_json(target, {"rows": ga.json_safe(rows)})
        return ga.Sent(target.stem, rows=len(rows))


class Leaky(Unresolved):
    """Like Unresolved with a resolved folder, but its destination carries the URL as given."""

    name = "leaky"

    @classmethod
    def destination_for(cls, settings: Any) -> dict[str, Any]:
        return {"folder": str(Path(settings.folder).resolve()), "url": settings.url}


registry.register(Unresolved)
registry.register(Leaky)
'''


@pytest.mark.slow
def test_the_destination_check_catches_unresolved_paths_and_credentials(tmp_path: Path) -> None:
    (tmp_path / "wrong_backends.py").write_text(BACKENDS)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "gym_artifacts.testing", "unresolved", "leaky", "--",
               "-p", "wrong_backends", "-k", "destination", "-W", "ignore::DeprecationWarning"]  # fmt: skip
    proc = run_bounded(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    out = proc.stdout
    assert proc.returncode == 1, out[-3000:] + proc.stderr[-2000:]
    assert "2 failed" in out, out[-3000:]
    assert "FAILED" in out and "test_one_receipt_per_destination[unresolved]" in out
    assert "test_one_receipt_per_destination[leaky]" in out
    # each fails at its own fault: the respelled folder is another destination; the credential shows
    assert "assert backend.destination(settings) in (here_dest, elsewhere_dest)" in out, out[-3000:]
    assert "CREDENTIAL_CANARY.encode() not in canonical_json" in out, out[-3000:]


@pytest.mark.slow
def test_the_suite_command_keeps_pytest_arguments_whole_and_names_an_unknown_backend() -> None:
    """``python -m gym_artifacts.testing NAME -- -k "a and not b"``: the expression reaches pytest
    as one argument; an unregistered NAME is one line naming it, exit 2, no traceback."""
    import sys

    run = [sys.executable, "-m", "gym_artifacts.testing"]
    ok = run_bounded([*run, "local", "--", "-k", "class_keeps and not live"],
                        capture_output=True, text=True, timeout=300)  # fmt: skip
    assert ok.returncode == 0, ok.stdout[-2000:] + ok.stderr[-2000:]
    assert "1 passed" in ok.stdout, ok.stdout[-500:]
    unknown = run_bounded([*run, "no_such_backend"], capture_output=True, text=True, timeout=120)
    assert unknown.returncode == 2
    assert "no_such_backend" in unknown.stderr and "Traceback" not in unknown.stderr + unknown.stdout
    for flag in ("--help", "-h"):  # not taken for a backend's name
        helped = run_bounded([*run, flag], capture_output=True, text=True, timeout=120)
        assert helped.returncode == 0 and helped.stdout.startswith("usage: python -m gym_artifacts.testing")
    assert len(unknown.stderr.strip().splitlines()) == 1, unknown.stderr
