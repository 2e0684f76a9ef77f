"""RunPayload: one payload per export, rollouts read once per backend, every artifact kind masked.

The opens are counted with an audit hook (``open`` events: Python's ``open``, ``os.open`` and
whatever an SDK opens through them), attributed to the backend whose ``export`` is running.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from gym_artifacts import export_run
from gym_artifacts.contract.exporter import Exporter
from gym_artifacts.contract.hooks import ExportPlan
from gym_artifacts.contract.run_payload import RunPayload
from gym_artifacts.run.artifacts import RunArtifacts
from tests.mlflow_store import mlflow_sqlite

_WATCHED: dict[str, Any] = {"path": None, "backend": None, "opens": Counter()}


def _tail_check() -> bool:
    """The open is ``partial_last_line``'s: a look at the file's last line, not a read of it."""
    frame = sys._getframe(2)
    for _ in range(4):
        if frame is None:
            return False
        if frame.f_code.co_name == "partial_last_line":
            return True
        frame = frame.f_back
    return False


def _opens_watched(opened: str, watched: str) -> bool:
    """``opened`` is the watched file, or a symbolic link to it (a backend's upload staged
    under another name reads the file through one)."""
    return opened == watched or (
        os.path.islink(opened) and os.path.realpath(opened) == os.path.realpath(watched)
    )


def _audit(event: str, args: tuple[Any, ...]) -> None:
    watched = _WATCHED["path"]
    if (
        event == "open"
        and watched is not None
        and args
        and isinstance(args[0], str | Path)
        and _opens_watched(str(args[0]), watched)
    ):
        who = _WATCHED["backend"] or "core"
        if threading.current_thread().name == "gym-artifacts-identity":
            who = "core"  # the identity hashed beside a backend's send, whichever backend is sending
        _WATCHED["opens"][f"{who} tail" if _tail_check() else who] += 1


@pytest.fixture
def count_opens(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``watch(path)`` starts counting opens of ``path`` by backend; returns the live Counter."""
    if not _WATCHED.get("hooked"):  # once per session (a hook cannot be removed); idle unless watching
        sys.addaudithook(_audit)
        _WATCHED["hooked"] = True
    from gym_artifacts.export import engine

    def attributed(send: Any) -> Any:
        """``send`` with the opens while it runs counted for the backend it sends to."""

        def sending(backend: Exporter, run: RunArtifacts, plan: ExportPlan) -> Any:
            _WATCHED["backend"] = backend.name
            try:
                return send(backend, run, plan)
            finally:
                _WATCHED["backend"] = None

        return sending

    # both ways the engine sends: a new backend run, or completing a live one
    monkeypatch.setattr(Exporter, "export", attributed(Exporter.export))
    monkeypatch.setattr(engine, "export_live", attributed(engine.export_live))

    def watch(path: Path) -> Counter[str]:
        _WATCHED.update(path=str(path), opens=Counter())
        return _WATCHED["opens"]

    yield watch
    _WATCHED.update(path=None, backend=None)


def _config(tmp_path: Path) -> Any:
    return OmegaConf.create(
        {
            "exporters": {
                "local": {"enabled": True, "root": str(tmp_path / "local")},
                "tensorboard": {"enabled": True, "logdir": str(tmp_path / "tb")},
                "mlflow": {
                    "enabled": True,
                    "tracking_uri": mlflow_sqlite(tmp_path / 'mlflow.db'),
                    "artifact_location": (tmp_path / "mlartifacts").as_uri(),
                },
            }
        }
    )


@pytest.mark.slow
def test_each_backend_reads_the_rollouts_file_once(quickstart_run: Path, tmp_path: Path, count_opens: Any) -> None:
    """Rows come from a pass the export makes anyway, not a recount; each backend reads the
    rollouts once."""
    opens = count_opens(quickstart_run)
    results = export_run(quickstart_run, _config(tmp_path))
    assert [r.status.value for r in results] == ["EXPORTED"] * 3, results
    assert {r.exporter: r.rows for r in results} == {"local": 300, "tensorboard": 300, "mlflow": 300}
    # the core reads it once for all backends (issue 43's one read: its bytes for the send key,
    # the rows counted from the same read, its records for the identity, TensorBoard's per-row
    # values); local copies it, and the two reports, built after the receipts (outside the send,
    # so counted with the core: local's and MLflow's), read it for their tables (no second
    # hashing: a report takes the export's identities), as does NeMo Gym's rollouts.json table,
    # built after MLflow's receipt (this run's config holds a secret: the table is masked from the
    # file; without one it comes from the one read, test_one_read). TensorBoard scans it once for the config's secrets (decoded
    # records are masked only when the file holds one; the scan is cached per export and
    # backend) and reads its table's first rows. MLflow uploads it. Looks at the last line (a
    # torn line?) read a few bytes from the end, no more.
    assert (opens["core"], opens["local"], opens["tensorboard"], opens["mlflow"]) == (4, 1, 2, 1), opens
    assert opens["local tail"] + opens["tensorboard tail"] + opens["mlflow tail"] <= 1, opens
    shipped = tmp_path / "local" / "default"
    [folder] = list(shipped.iterdir())
    assert (folder / "rollouts.jsonl").read_bytes() == quickstart_run.read_bytes()


def test_one_payload_per_export_counts_rows_once(quickstart_run: Path, count_opens: Any) -> None:
    """Without the identity pass's count, the rows are counted once for all backends."""
    run = RunArtifacts.from_path(quickstart_run)
    plan = ExportPlan(identities={}, run_identity="b3:x", upload_rollouts=True, rollout_rows=None)
    opens = count_opens(quickstart_run)
    first = RunPayload.of(run, plan)
    assert RunPayload.of(run, plan) is first
    assert [RunPayload.of(run, plan).rollout_rows for _ in range(3)] == [300, 300, 300]
    assert opens["core"] == 1, opens
    other = ExportPlan(identities={}, run_identity="b3:x", upload_rollouts=True, rollout_rows=None)
    assert RunPayload.of(run, other) is not first  # another export, another payload


def test_a_torn_last_line_is_never_in_the_payload(quickstart_run: Path, count_opens: Any) -> None:
    """Streamed records and the uploadable file both stop before the torn line."""
    with quickstart_run.open("ab") as fh:
        fh.write(b'{"torn": ')
    run = RunArtifacts.from_path(quickstart_run)
    torn = run.partial_rollouts_line()
    assert torn is not None
    plan = ExportPlan(identities={}, run_identity="b3:x", upload_rollouts=True, partial_line=torn)
    payload = RunPayload.of(run, plan)
    assert sum(1 for _ in payload.rollout_records()) == 300
    with payload.rollouts_file() as complete:
        assert complete is not None
        assert complete.read_bytes() == quickstart_run.read_bytes()[: torn.complete_bytes]
    assert payload.omitted_partial_line == {"omitted_partial_lines": 1, "omitted_partial_line_bytes": 9}
    assert RunPayload.of(run, ExportPlan({}, "b3:y", upload_rollouts=False)).rollout_rows == 0


CANARY = "canary-payload-secret-7q8r9s"


def test_every_artifact_kind_is_masked(quickstart_run: Path) -> None:
    """A config secret in the aggregate, the acceptance record, a sidecar, a JSON and a YAML runtime
    artifact: the payload ships none of it (bytes or file), nor in values, tables or metadata; a
    file without a secret ships as the run's own file."""
    agg_fpath = quickstart_run.with_name("eval_aggregate_metrics.json")
    entries = json.loads(agg_fpath.read_text())
    entries[0]["judge_url"] = f"https://judge.example/?note={CANARY}"
    agg_fpath.write_text(json.dumps(entries))
    quickstart_run.with_name("eval_acceptance.json").write_text(
        json.dumps({"planned_rows": 300, "omitted_rows": 0, "reason": f"by {CANARY}"})
    )
    failures = quickstart_run.with_name("eval_failures.jsonl")
    failures.write_text(failures.read_text() + json.dumps({"error": f"401 for key {CANARY}"}) + "\n")
    artifacts = quickstart_run.with_name("eval_artifacts")
    (artifacts / "server.json").write_text(json.dumps({"model": "m", "api_key": CANARY}))
    (artifacts / "server.yaml").write_text(f"model: m\nopenai_key: {CANARY}\n")
    (artifacts / "plain.json").write_text(json.dumps({"model": "m"}))
    run = RunArtifacts.from_path(quickstart_run)
    plan = ExportPlan({}, "b3:x", upload_rollouts=True, secrets=frozenset({CANARY}))
    payload = RunPayload.of(run, plan)
    items = [payload.aggregate_file, payload.acceptance_file, *payload.sidecars, *payload.runtime_artifacts]
    kinds = Counter(item.kind for item in items if item is not None and item.masked)
    assert kinds == {"aggregate": 1, "acceptance": 1, "sidecar": 1, "runtime": 2}, kinds
    for item in items:
        assert item is not None
        with item.as_file() as shipped:
            assert CANARY.encode() not in shipped.read_bytes(), item.name
            assert shipped.name == item.basename
        written = item.write_to(Path(str(quickstart_run.parent / "out") + "/" + item.name))
        assert written == item.size
    plain = next(i for i in payload.runtime_artifacts if i.name == "plain.json")
    assert plain.content == artifacts / "plain.json"  # nothing to mask: the file itself
    shown = json.dumps([payload.values, [t.rows for t in payload.tables], payload.experiment_metadata])
    assert CANARY not in shown
    assert "weather_simple_agent/judge_url" in payload.values  # redacted, not dropped
