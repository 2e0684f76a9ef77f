"""Issue 27 (1): a config secret of any shape -- non-ASCII, quotes, backslashes, control
characters, very long -- is found by value in every place a run carries it (aggregate metrics,
a rollout, a journal text metric, a runtime artifact) and masked on the decoded values before any
encoding, so no backend stores it in any encoding: the raw text, JSON's escapes (ASCII or not),
HTML's entities. Read back from what each real backend stored. (The rollouts file itself is
shipped byte for byte, as the eval wrote it: its copy ``rollouts.jsonl`` is the one file not
scanned; every rollout a backend turns into traces, rows or request bodies is.)"""

from __future__ import annotations

import html
import json
import shutil
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from gym_artifacts import export_run
from gym_artifacts.report import build_report
from tests.conftest import copy_quickstart
from tests.langsmith_api import LangsmithApi
from tests.mlflow_store import mlflow_sqlite

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

# Every character class an encoder treats apart; a recognisable prefix so that a short draw is
# still told from the run's own text.
_tails = st.text(
    st.sampled_from(list("aZ09-_ ") + list('"\\\'<>&/') + ["é", "ß", "中", "😀", "\u2028", "\t", "\n", "\x01", "\x7f"]),
    min_size=1, max_size=12,
)  # fmt: skip
secrets_st = st.one_of(
    _tails.map(lambda t: f"gen-secret-{t}"),
    _tails.map(lambda t: f"gen-secret-{t}" + "Long" * 300),
)


def encodings(secret: str) -> set[bytes]:
    """How a stored file could spell the secret: raw, JSON-escaped (ASCII or not), HTML-escaped."""
    forms = {secret, json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1]}
    forms |= {html.escape(f) for f in list(forms)}
    return {f.encode("utf-8") for f in forms}


def plant(run: Path, secret: str) -> None:
    config = run.with_name("eval_config.yaml")
    config.write_text(config.read_text() + yaml.safe_dump({"judge_api_key": secret}, width=1 << 20))
    aggregate = run.with_name("eval_aggregate_metrics.json")
    entries = json.loads(aggregate.read_text())
    entries[0]["judge_note"] = f"judged with {secret} ok"
    aggregate.write_text(json.dumps(entries))  # ASCII-escaped, as Python writes JSON
    rows = run.read_text().splitlines()
    first = json.loads(rows[0])
    first["responses_create_params"]["metadata"] = {"note": f"with {secret}"}
    rows[0] = json.dumps(first)
    run.write_text("\n".join(rows) + "\n")
    with run.with_name("eval_metrics.jsonl").open("a") as fh:
        fh.write(
            json.dumps({"step": 10_000, "time": 1.0, "metrics": {"judge_note": f"text {secret}"}}) + "\n"
        )
    artifact = run.with_name("eval_artifacts") / "server_config.json"
    artifact.write_text(json.dumps({"model": "m", "note": f"uses {secret}"}))
    aggregate.touch()


@pytest.fixture(scope="module")
def langsmith() -> object:
    api = LangsmithApi().start()
    yield api
    api.stop()


@settings(max_examples=2, deadline=None, suppress_health_check=list(HealthCheck))
@example(secret="clé-sécrète-0a1b2c3d")  # the two: non-ASCII, quote and backslash
@example(secret='quo"te\\back-4e5f6a7b')
@example(secret="gen-secret-0")
@example(secret="gen-secret-\t\" &'990😀")
@given(secret=secrets_st)
def test_no_generated_secret_in_any_encoding_anywhere_a_backend_stored(
    tmp_path_factory: pytest.TempPathFactory, langsmith: LangsmithApi, secret: str
) -> None:
    root = tmp_path_factory.mktemp("gen")
    run = copy_quickstart(root / "runs")
    plant(run, secret)
    cfg = OmegaConf.create({"exporters": {
        "local": {"enabled": True, "root": str(root / "local")},
        "mlflow": {"enabled": True, "tracking_uri": mlflow_sqlite(root / 'mlflow.db'),
                   "artifact_location": str(root / "mlartifacts"), "log_traces": True},
        "wandb": {"enabled": True, "mode": "offline", "dir": str(root / "wb"), "project": "gen"},
        "tensorboard": {"enabled": True, "logdir": str(root / "tb")},
        "langsmith": {"enabled": True, "api_url": langsmith.url, "api_key": "lsv2_pt_gen-key-0d93"},
    }})  # fmt: skip
    sent = len(langsmith.state.requests)
    results = export_run(run, cfg)
    assert [r.status.value for r in results] == ["EXPORTED"] * 5, [r.reason for r in results]
    report = build_report(run, root / "report" / "report.html")
    forms = encodings(secret)
    stored: list[tuple[str, bytes]] = [
        (str(p), p.read_bytes())
        for folder in (root / "local", root / "mlartifacts", root / "wb", root / "tb")
        for p in folder.rglob("*") if p.is_file() and p.name != "rollouts.jsonl"
    ]  # fmt: skip
    stored.append(("mlflow.db", (root / "mlflow.db").read_bytes()))
    stored.append(("report", report.read_bytes()))
    stored += [(f"langsmith {q.method} {q.path}", q.body) for q in langsmith.state.requests[sent:]]
    assert len(stored) > 20
    for name, data in stored:
        for form in forms:
            assert form not in data, f"{form[:40]!r}... found in {name}"
    shutil.rmtree(root, ignore_errors=True)


@settings(max_examples=1, deadline=None, suppress_health_check=list(HealthCheck))
@example(secret="clé-sécrète-0a1b2c3d")
@example(secret='quo"te\\back-4e5f6a7b')
@given(secret=secrets_st)
def test_no_generated_secret_reaches_phoenix(
    tmp_path_factory: pytest.TempPathFactory, phoenix_server: object, secret: str
) -> None:
    """The same, read back from what the session's real ``phoenix serve`` stored (its SQLite
    database and working folder)."""
    root = tmp_path_factory.mktemp("genpx")
    run = copy_quickstart(root / "runs")
    plant(run, secret)
    dataset = f"gen-{root.name}"
    cfg = OmegaConf.create(
        {"exporters": {"phoenix": {"enabled": True, "base_url": phoenix_server.url, "dataset_name": dataset}}}
    )
    [result] = export_run(run, cfg)
    assert result.status.value == "EXPORTED", result.reason
    stored = [(str(p), p.read_bytes()) for p in Path(phoenix_server.root).rglob("*") if p.is_file()]
    assert stored
    for name, data in stored:
        for form in encodings(secret):
            assert form not in data, f"{form[:40]!r}... found in {name}"
    shutil.rmtree(root, ignore_errors=True)
