"""``compare --log``: one MLflow run (SQLite store, read back) tagged with both runs' identities,
holding the tables and the page, and one offline W&B run with the tables, exactly once."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from gym_artifacts.cli import main
from gym_artifacts.run.artifacts import RunArtifacts
from gym_artifacts.run.identity import content_identities, run_identity
from tests.fixture_paths import NEMO_GYM_FIXTURES
from tests.mlflow_store import mlflow_sqlite
from tests.wandb_records import offline_runs


def _config(tmp_path: Path, **enabled: bool) -> Path:
    cfg = {"exporters": {
        "local": {"enabled": False},
        "mlflow": {"enabled": enabled.get("mlflow", True), "tracking_uri": mlflow_sqlite(tmp_path / 'mlflow.db'),
                   "artifact_location": (tmp_path / "mlartifacts").as_uri(), "experiment_name": "cmp"},
        "wandb": {"enabled": enabled.get("wandb", True), "project": "tests", "mode": "offline",
                  "dir": str(tmp_path / "wb")},
    }}  # fmt: skip
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _mlflow_runs(tmp_path: Path) -> list[Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_sqlite(tmp_path / 'mlflow.db'))
    exp = client.get_experiment_by_name("cmp")
    return [] if exp is None else list(client.search_runs([exp.experiment_id]))


def _compare(tmp_path: Path, runs: Path, cfg: Path, capsys: Any, *extra: str) -> dict[str, Any]:
    code = main(["compare", str(runs / "clean/rollouts.jsonl"), str(runs / "with-failures/rollouts.jsonl"),
                 "-o", str(tmp_path / "compare.html"), "--log", "-c", str(cfg), "--json", *extra])  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out
    return out


@pytest.mark.slow
def test_log_once_to_mlflow_and_wandb(tmp_path: Path, capsys: Any) -> None:
    runs = tmp_path / "runs"
    shutil.copytree(NEMO_GYM_FIXTURES, runs)
    cfg = _config(tmp_path)
    first = _compare(tmp_path, runs, cfg, capsys)
    statuses = {r["exporter"]: r["status"] for r in first["logged"]}
    assert statuses == {"mlflow": "EXPORTED", "wandb": "EXPORTED"}, first["logged"]

    # MLflow: one run, tagged with both runs' content identities, holding the tables and the page
    (run,) = _mlflow_runs(tmp_path)
    base_id = run_identity(content_identities(RunArtifacts.from_path(runs / "clean/rollouts.jsonl")))
    cand_id = run_identity(content_identities(RunArtifacts.from_path(runs / "with-failures/rollouts.jsonl")))
    tags = run.data.tags
    assert tags["gym_artifacts.kind"] == "compare" and tags["gym_artifacts.complete"] == "true"
    assert tags["gym_artifacts.base_identity"] == base_id
    assert tags["gym_artifacts.candidate_identities"] == cand_id
    assert run.info.status == "FINISHED"
    art = Path(run.info.artifact_uri.removeprefix("file://"))
    assert (art / "compare.html").read_bytes() == (tmp_path / "compare.html").read_bytes()
    results = json.loads((art / "tables/compare_results.json").read_text())
    want = first["comparisons"][0]["results"]
    assert [row[1] for row in results["data"]] == [r["metric"] for r in want]
    p_col = results["columns"].index("p_value")
    assert [row[p_col] for row in results["data"]] == [r["p_value"] for r in want]
    tasks = json.loads((art / "tables/compare_tasks.json").read_text())
    row4 = next(r for r in tasks["data"] if r[1] == "4")
    assert row4[2:7] == ["scored", "failed", 1.0, None, None]  # failed: no value, never 0
    assert run.data.metrics["reward/n_pairs"] == 4.0

    # W&B: one offline run with both tables
    (wb,) = offline_runs(tmp_path / "wb")
    assert wb.run_id == next(r["backend_run_id"] for r in first["logged"] if r["exporter"] == "wandb")
    table = json.loads(wb.file(wb.summary["compare/results.path"]).read_text())
    assert [row[1] for row in table["data"]] == [r["metric"] for r in want]
    assert wb.summary["compare/tasks.nrows"] == 5 and "never scored as 0" in wb.summary["compare/verdict"]

    # a rerun is SKIPPED, from the receipt, and sends nothing
    again = _compare(tmp_path, runs, cfg, capsys)
    assert {r["exporter"]: r["status"] for r in again["logged"]} == {"mlflow": "SKIPPED", "wandb": "SKIPPED"}
    assert len(_mlflow_runs(tmp_path)) == 1 and len(offline_runs(tmp_path / "wb")) == 1

    # a lost receipt: MLflow finds the comparison by its identity (no second run)
    (receipts,) = (runs / "clean/rollouts_comparisons").glob("*_mlflow_export_done.json")
    receipts.unlink()
    lost = _compare(tmp_path, runs, cfg, capsys, "-e", "mlflow")
    (only,) = lost["logged"]
    assert only["status"] == "EXPORTED" and "already in MLflow" in only["reason"]
    assert len(_mlflow_runs(tmp_path)) == 1

    # another test (a margin) is another comparison: logged anew
    other = _compare(tmp_path, runs, cfg, capsys, "-e", "mlflow", "--margin", "0.1")
    assert other["logged"][0]["status"] == "EXPORTED"
    assert len(_mlflow_runs(tmp_path)) == 2


def test_log_to_a_tracker_without_a_place_is_refused(tmp_path: Path, capsys: Any) -> None:
    code = main(["compare", str(NEMO_GYM_FIXTURES / "clean/rollouts.jsonl"),
                 str(NEMO_GYM_FIXTURES / "with-failures/rollouts.jsonl"), "-o", str(tmp_path / "c.html"),
                 "--log", "-c", str(_config(tmp_path)), "-e", "tensorboard"])  # fmt: skip
    assert code == 2 and "no place for a comparison" in capsys.readouterr().err


@pytest.mark.slow
def test_log_to_a_real_mlflow_server(mlflow_server: Any, tmp_path: Path, capsys: Any) -> None:
    """The same through a real ``mlflow server`` (artifacts over HTTP), read back from it."""
    from mlflow.tracking import MlflowClient

    experiment = f"cmp-{tmp_path.name}"
    cfg = tmp_path / "server.yaml"
    cfg.write_text(yaml.safe_dump({"exporters": {"local": {"enabled": False}, "mlflow": {
        "enabled": True, "tracking_uri": mlflow_server.uri, "experiment_name": experiment}}}))  # fmt: skip
    runs = tmp_path / "runs"
    shutil.copytree(NEMO_GYM_FIXTURES, runs)
    first = _compare(tmp_path, runs, cfg, capsys, "--metric", "reward")
    assert first["logged"][0]["status"] == "EXPORTED", first["logged"]
    sent = (tmp_path / "compare.html").read_bytes()
    again = _compare(tmp_path, runs, cfg, capsys, "--metric", "reward")
    assert again["logged"][0]["status"] == "SKIPPED"
    client = MlflowClient(tracking_uri=mlflow_server.uri)
    (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    assert run.info.run_id == first["logged"][0]["backend_run_id"]
    page = client.download_artifacts(run.info.run_id, "compare.html", str(tmp_path / "down"))
    assert Path(page).read_bytes() == sent
    cand = RunArtifacts.from_path(runs / "with-failures/rollouts.jsonl")
    assert run.data.tags["gym_artifacts.candidate_identities"] == run_identity(content_identities(cand))


def _long_named_candidates(tmp_path: Path, count: int) -> list[Path]:
    """``count`` small candidates in folders of 200-character names: their verdict lines make
    a note far longer than MLflow's 8,000-character tag limit."""
    out = []
    for i in range(count):
        folder = tmp_path / (f"{i:02d}-" + "long-sweep-name-" * 12)[:200]
        folder.mkdir()
        path = folder / "r.jsonl"
        path.write_text(
            "".join(json.dumps({"task_id": t, "reward": 0.1 * ((t + i) % 4)}) + "\n" for t in range(4))
        )
        out.append(path)
    return out


@pytest.mark.slow
def test_a_note_longer_than_mlflows_limit_is_never_cut_silently(tmp_path: Path, capsys: Any) -> None:
    base = tmp_path / "base.jsonl"
    base.write_text("".join(json.dumps({"task_id": t, "reward": 0.2}) + "\n" for t in range(4)))
    cands = _long_named_candidates(tmp_path, 24)
    cfg = _config(tmp_path, wandb=False)
    code = main(["compare", str(base), *map(str, cands), "-o", str(tmp_path / "c.html"), "--log", "-c", str(cfg),
                 "--json"])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    out = json.loads(captured.out)
    (logged,) = out["logged"]
    assert logged["status"] == "EXPORTED" and "compare_note.md" in (logged["reason"] or ""), logged
    whole = "\n".join(c["verdict"]["text"] for c in out["comparisons"])
    assert len(whole) > 8000
    (run,) = _mlflow_runs(tmp_path)
    note = run.data.tags["mlflow.note.content"]
    assert len(note) <= 8000 and "compare_note.md" in note  # says where the rest is
    art = Path(run.info.artifact_uri.removeprefix("file://"))
    assert (art / "compare_note.md").read_text() == whole  # the whole note, uncut


@pytest.mark.slow
def test_compare_receipts_are_run_receipts(tmp_path: Path, capsys: Any) -> None:
    """One receipt store: ``compare --log`` publishes the export's own receipt format (version 2,
    one receipt per destination), never a second format of its own."""
    from gym_artifacts.run.receipts import read_receipts

    runs = tmp_path / "runs"
    shutil.copytree(NEMO_GYM_FIXTURES, runs)
    first = _compare(tmp_path, runs, _config(tmp_path, mlflow=False), capsys)
    assert [r["status"] for r in first["logged"]] == ["EXPORTED"]
    assert not list(runs.rglob("*_compare_receipts.json"))
    found = list((runs / "clean").rglob("*_wandb_export_done.json"))
    found = [p for p in found if p.parent != runs / "clean"]  # the run's own receipts stay the run's
    (fpath,) = found
    (receipt,) = read_receipts(fpath)
    assert receipt.exporter == "wandb" and receipt.run_identity == first["logged"][0]["identity"]
    assert receipt.backend_run_id == first["logged"][0]["backend_run_id"]
    assert set(receipt.identities) >= {"base", "candidate 1", "settings"}


def test_compare_log_goes_through_the_backends_hooks() -> None:
    """The comparison's send is a hook of the backend (``_export_comparison``), found through the
    registry; compare imports no backend module and no backend's private helper."""
    import ast

    from gym_artifacts.contract.registry import get_entry

    source = (Path(__file__).parents[1] / "gym_artifacts/compare/log.py").read_text()
    imported = {
        n.module for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ImportFrom) and n.module
    } | {a.name for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Import) for a in n.names}
    assert not [
        m
        for m in imported
        if m.startswith(("exporters", "gym_artifacts._builtin_exporters", "wandb", "mlflow"))
    ]
    for name in ("mlflow", "wandb"):
        assert get_entry(name).load().receives_comparisons()
    assert not get_entry("tensorboard").load().receives_comparisons()


@pytest.mark.slow
def test_log_to_a_server_that_never_answers_ends_failed_within_the_deadline(
    tmp_path: Path, capsys: Any
) -> None:
    """The backend's deadline bounds compare --log as it bounds an export: a TCP black hole gives
    FAILED naming the deadline, exit 1, and no receipt (nothing claimed sent)."""
    import time

    from tests.reliability.faulty_servers import black_hole

    runs = tmp_path / "runs"
    shutil.copytree(NEMO_GYM_FIXTURES, runs)
    with black_hole() as hole:
        cfg = tmp_path / "hole.yaml"
        cfg.write_text(yaml.safe_dump({"exporters": {"local": {"enabled": False}, "mlflow": {
            "enabled": True, "tracking_uri": hole.uri, "experiment_name": "hole", "export_deadline": 8}}}))  # fmt: skip
        start = time.monotonic()
        code = main(["compare", str(runs / "clean/rollouts.jsonl"), str(runs / "with-failures/rollouts.jsonl"),
                     "-o", str(tmp_path / "c.html"), "--log", "-c", str(cfg), "--json"])  # fmt: skip
        elapsed = time.monotonic() - start
    out = json.loads(capsys.readouterr().out)
    (logged,) = out["logged"]
    assert code == 1 and logged["status"] == "FAILED" and "deadline" in logged["reason"], logged
    assert elapsed < 60, elapsed
    assert not list(runs.rglob("*_comparisons/*_export_done.json"))


@pytest.mark.slow
def test_a_gated_comparison_carries_its_verdict_to_mlflow(tmp_path: Path, capsys: Any) -> None:
    """With --policy: the MLflow run holds the gate's verdict (tag) and table, the exit code is
    the verdict's once the log succeeded."""
    runs = tmp_path / "runs"
    shutil.copytree(NEMO_GYM_FIXTURES, runs)
    policy = tmp_path / "policy.yaml"
    policy.write_text("min_paired_coverage: 0.5\nmetrics:\n  - name: reward\n    margin: 0.1\n")
    code = main(["compare", str(runs / "clean/rollouts.jsonl"), str(runs / "with-failures/rollouts.jsonl"),
                 "-o", str(tmp_path / "c.html"), "--log", "-c", str(_config(tmp_path, wandb=False)), "--json",
                 "--policy", str(policy)])  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    verdict = out["gate"]["verdict"]
    assert out["logged"][0]["status"] == "EXPORTED"
    assert code == {"PASS": 0, "WARN": 3, "INCONCLUSIVE": 4, "FAIL": 5}[verdict]
    (run,) = _mlflow_runs(tmp_path)
    assert run.data.tags["gym_artifacts.verdict"] == verdict
    art = Path(run.info.artifact_uri.removeprefix("file://"))
    gate = json.loads((art / "tables/compare_gate.json").read_text())
    assert [row[1] for row in gate["data"]] == [verdict] and gate["data"][0][2] == "reward"


def test_a_gated_comparison_is_the_same_until_a_waiver_expires(tmp_path: Path) -> None:
    """Logged once per policy and waivers in force: the next day is the same comparison (a daily
    CI job is SKIPPED), the day a waiver expires is another one."""
    import datetime as dt

    from gym_artifacts.compare import compare_runs
    from gym_artifacts.compare.log import comparison_identity
    from gym_artifacts.compare.policy import parse_policy

    policy = parse_policy({"metrics": [{"name": "reward"}], "waivers": [
        {"metric": "reward", "reason": "known", "expires": "2027-01-10"}]}, "p.yaml")  # fmt: skip
    base, cand = (
        NEMO_GYM_FIXTURES / "clean/rollouts.jsonl",
        NEMO_GYM_FIXTURES / "with-failures/rollouts.jsonl",
    )

    def identity(day: str) -> str:
        comparison = compare_runs(base, [cand], policy=policy, today=dt.date.fromisoformat(day))
        return comparison_identity(comparison)["identity"]

    assert (
        identity("2027-01-08") == identity("2027-01-09") != identity("2027-01-10") == identity("2027-02-01")
    )
