"""The backend contract suite over every registered backend (gym_artifacts/testing/contract.py).

Registration alone adds a backend here: built-ins through pyproject.toml, installed plugins
through their own entry points (CI installs examples/ledger_plugin). ``GYM_ARTIFACTS_CONTRACT_REQUIRE``
names backends that must be among them, so an install that silently failed cannot pass.
"""

from __future__ import annotations

import os

from gym_artifacts.testing.contract import *  # noqa: F403  (the suite's fixtures and tests)
from gym_artifacts.testing.contract import contract_exporters

REQUIRED = ("local", "mlflow", "wandb")


def test_required_backends_are_under_contract() -> None:
    required = {*REQUIRED, *filter(None, os.environ.get("GYM_ARTIFACTS_CONTRACT_REQUIRE", "").split(","))}
    assert required <= set(contract_exporters())
