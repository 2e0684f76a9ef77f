"""The backend contract suite over every registered backend (gym_artifacts/testing/contract.py).

Registration alone adds a backend here: built-ins through pyproject.toml, installed plugins
through their own entry points (CI installs examples/ledger_plugin). ``GYM_ARTIFACTS_CONTRACT_REQUIRE``
names backends that must be among them, so an install that silently failed cannot pass.

LangSmith and Phoenix need a service: the fixtures below give the suite their settings, the local
endpoint the real ``langsmith`` client talks to (tests/langsmith_api.py) and the session's real
``phoenix serve`` (conftest.py, shared with tests/test_phoenix.py). Cost: the endpoint starts in
milliseconds; Phoenix's start is paid once per session; their exports of the suite's 12-rollout
runs take seconds, and their live tests skip (post-run only).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from gym_artifacts.contract import registry
from gym_artifacts.testing.contract import *  # noqa: F403  (the suite's fixtures and tests)
from gym_artifacts.testing.contract import ContractService, contract_exporters

REQUIRED = ("local", "mlflow", "wandb", "tensorboard", "langsmith", "phoenix")

# The suite's cases that run whole exports on every backend take seconds each: slow, marked here
# where the suite is brought in (a renamed case fails this import). tests/conftest.py marks the
# rest of the slow ones by what they use (MLflow and W&B cases, the Phoenix server).
for _exporting_case in (
    test_class_keeps_the_contract,  # noqa: F405
    test_export_skip_and_change,  # noqa: F405
    test_one_receipt_per_destination,  # noqa: F405
    test_resume_reopens_or_starts_over,  # noqa: F405
):
    pytest.mark.slow(_exporting_case)


def _named_after(folder: Path) -> str:
    """A dataset name per contract folder: two folders, two destinations."""
    return f"contract-{folder.name}-{hashlib.sha256(str(folder).encode()).hexdigest()[:10]}"


@pytest.fixture(scope="session")
def contract_service_langsmith() -> Iterator[ContractService]:
    pytest.importorskip("langsmith")
    from tests.langsmith_api import LangsmithApi

    api = LangsmithApi().start()

    def sent() -> list[bytes]:  # every request as the real client sent it
        with api.state.lock:
            return [r.path.encode() + json.dumps(r.headers).encode() + r.body for r in api.state.requests]

    yield ContractService(lambda folder: {"api_url": api.url, "dataset_name": _named_after(folder)}, sent)
    api.stop()


@pytest.fixture(scope="session")
def contract_service_phoenix(phoenix_server: object) -> ContractService:
    root, url = phoenix_server.root, phoenix_server.url  # type: ignore[attr-defined]

    def stored() -> list[bytes]:  # the server's SQLite database (and its log)
        return [p.read_bytes() for p in root.rglob("*") if p.is_file()]

    return ContractService(lambda folder: {"base_url": url, "dataset_name": _named_after(folder)}, stored)


def test_required_backends_are_under_contract() -> None:
    required = {*REQUIRED, *filter(None, os.environ.get("GYM_ARTIFACTS_CONTRACT_REQUIRE", "").split(","))}
    assert required <= set(contract_exporters())
    # Under contract, not skipped: a required backend whose SDK is missing would skip every test.
    assert [n for n in sorted(required) if not registry.get_entry(n).sdk_installed()] == []
