"""The MLflow backend: live runs and post-run exports on ``MlflowClient`` with explicit run ids.

Mapping: the masked config as params (dotted keys) and as ``config.json``; step metrics with
their original step and timestamp; every level of the aggregate metrics as metrics named
``<agent>/<level>/<key>``; the NVML summary as ``system/...`` metrics and its series as metric
history at the sample times; rollouts at ``rollouts/rollouts.jsonl`` and runtime artifacts at
``runtime/<name>``, uploaded whole (never appended, so a re-export cannot duplicate rows).
Runs carry the run's send key (a digest of its files' bytes, known before anything is sent) from
their creation and its content identity once complete, both in the one bookkeeping tag
``gym_artifacts`` (see _mlflow_bookkeeping) with the rest of the exporter's own records, so a
post-run export that died before its receipt finds its run again; the identity may be hashed
while the run is sent (``hashes_while_sending``) and is then recorded last, with the completion,
in one request. The SDK is imported only when a run is opened or exported.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import logging
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr

from gym_artifacts.plugin import (
    NVML_SUMMARY,
    CannotCertify,
    ComparisonPayload,
    ExporterConfig,
    ExportPlan,
    LevelTable,
    LiveExporter,
    LiveTraces,
    LiveTracing,
    PartialBatch,
    PayloadArtifact,
    ReportWhen,
    RolloutSpool,
    RunArtifacts,
    RunPayload,
    RunStatus,
    Sent,
    absolute_store_uri,
    canonical_json,
    credential_free_uri,
    eval_end_s,
    json_safe,
    run_times,
    saved_config_run_name,
    snapshot_copy,
    utc_now_iso,
    write_table_split_json,
)

from ._headline import headline
from ._mlflow_bookkeeping import bookkeeping_of
from ._mlflow_client import (
    IDENTITY_KEY,
    RequestDeadlinePassed,
    RequestLimits,
    ScopedMlflow,
    ServerRefused,
    as_refusal,
    check_artifact_name,
    file_mtime_ms,
    is_rest,
)
from ._mlflow_compare import send_comparison
from ._mlflow_mapping import (
    METRICS_TABLE,
    config_params,
    headline_split,
    metrics_table,
    split_metrics,
    tag_value,
)
from ._mlflow_report import ReportTarget, build_and_upload, has_report, job_for
from ._mlflow_report import start as start_report
from ._mlflow_schema import ensure_sqlite_schema
from ._mlflow_traces import BATCH as TRACE_BATCH
from ._mlflow_traces import MlflowTracesSent, log_rollout_traces, only_missing
from ._mlflow_traces import batch_requests as batch_requests  # public: benchmarks/traces.py
from ._mlflow_views import DESCRIPTION_TAG, evaluation_dataset, planned_inputs
from ._nemo_gym_shapes import MLFLOW_TABLE_FILE, file_documents, write_split_table
from ._rollouts import payload_traces

logger = logging.getLogger(__name__)

# Keys of the run's one bookkeeping tag (``gym_artifacts``, see _mlflow_bookkeeping).
KIND_KEY = "kind"
SOURCE_KEY = "source"
CERTIFIED_KEY = "certified"
SUPERSEDED_KEY = "superseded_by"
TIMES_KEY = "times_from"  # session, journal or rollouts: where the run's times came from
# Set last, after the run is FINISHED: every artifact and metric of the identity is in.
COMPLETE_KEY = "complete"
# One export attempt's id: the runs it created, so that it deletes only its own orphans.
ATTEMPT_KEY = "export_attempt"
# The run's send key (``ExportPlan.send_key``), set at creation: what finds a run whose content
# identity was never tagged (an export that died between the upload and the final tag).
SEND_KEY_KEY = "bytes_digest"  # not "..._key": that name would be masked as a secret
LOGGED_ARTIFACTS_TAG = "mlflow.loggedArtifacts"


def logged_artifacts(table_paths: list[str]) -> str:
    """The ``mlflow.loggedArtifacts`` tag: the level tables and NeMo Gym's rollouts table."""
    return json.dumps([{"path": p, "type": "table"} for p in [*table_paths, MLFLOW_TABLE_FILE]])


class MlflowSettings(ExporterConfig):
    """Settings of ``exporters.mlflow``."""

    tracking_uri: str = "sqlite:///mlflow.db"
    experiment_name: str = "gym-evals"
    run_name: str | None = None
    tracking_token: SecretStr | None = None
    tags: dict[str, str] = Field(default_factory=dict)
    artifact_location: str | None = None
    # The live path fails fast and lets the background worker back off; never MLflow's
    # default minutes-long retry loop.
    live_request_timeout: float = Field(default=5.0, gt=0, le=600)
    live_request_retries: int = Field(default=0, ge=0, le=10)
    export_request_timeout: float = Field(default=120.0, gt=0, le=3600)
    export_request_retries: int = Field(default=5, ge=0, le=20)
    # The whole post-run export to an MLflow server (every request and retry) ends within this
    # many seconds, FAILED when the server does not answer (a black hole, a byte at a time).
    export_deadline: float = Field(default=600.0, gt=0, le=24 * 3600)
    # After a failed runs/create, how long to look for the run it may still have created
    # (default: twice export_request_timeout, at least 10 s).
    create_lookup_seconds: float | None = Field(default=None, ge=0, le=3600)
    # Every rollout also as an MLflow trace with its verdicts as feedback (off by default: one
    # request per rollout; figures in BENCHMARKS.md). On an MLflow server, a live run sends each
    # rollout's trace as it is handed to export_rollouts; the export adds only what is missing.
    log_traces: bool = False
    # Verdicts as MLflow assessments (the Traces tab's reward column and histogram): one
    # start_trace request a trace, MLflow's only way to attach them. Off: verdicts as trace tags,
    # and the spans alone make each trace (several times fewer requests; BENCHMARKS notes).
    trace_assessments: bool = True
    # When the run's report.html is built and uploaded: once the run is complete and the receipt
    # written, in the exporting process (after), in a detached process (background), or never.
    report: ReportWhen = "after"


class MlflowExporter(LiveTracing, LiveExporter):
    """MLflow tracking: SQLite or another database store, or an ``mlflow server``."""

    name = "mlflow"
    config_model = MlflowSettings
    sdk_module = "mlflow"
    hashes_while_sending = True
    # NeMo Gym's rollouts.json table comes from the export's one read of the rollouts (engine)
    ships_rollouts_table = True

    @classmethod
    def contract_settings(cls, folder: Path) -> dict[str, Any]:
        return {
            "tracking_uri": f"sqlite:///{folder / 'mlflow.db'}",
            "artifact_location": (folder / "mlartifacts").as_uri(),
        }

    settings: MlflowSettings

    def __init__(self, settings: MlflowSettings) -> None:
        super().__init__(settings)
        self._ml: ScopedMlflow | None = None
        self._status_before_reopen: str | None = None
        self._rollouts: RolloutSpool | None = None

    @classmethod
    def destination_for(cls, settings: MlflowSettings) -> dict[str, Any]:
        """The tracking URI without credentials (file stores made absolute) and the experiment."""
        return {
            "tracking_uri": credential_free_uri(settings.tracking_uri),
            "experiment_name": settings.experiment_name,
        }

    def backend_run_exists(self, backend_run_id: str) -> bool | None:
        """The run is still in the store and not deleted."""
        from mlflow.exceptions import MlflowException

        try:
            found = self._client(live=False).get_run(backend_run_id)
        except MlflowException as exc:
            if getattr(exc, "error_code", "") == "RESOURCE_DOES_NOT_EXIST":
                return False
            raise
        return bool(found.info.lifecycle_stage == "active")

    def export_deadline_s(self) -> float | None:
        """``export_deadline`` for a tracking server; a database or file store has no server."""
        uri = self.settings.tracking_uri
        return self.settings.export_deadline if uri.startswith(("http://", "https://")) else None

    def server_url(self) -> str | None:
        return self.settings.tracking_uri if self.export_deadline_s() is not None else None

    def _abandon(self) -> None:
        """The abandoned send's sockets were shut down, pooled keep-alive connections of MLflow's
        process-wide request sessions among them: drop those sessions, so that a later export in
        this process (a notebook, a Ray worker) opens fresh connections instead of failing on a
        closed one ("file descriptor cannot be a negative integer")."""
        from mlflow.utils import request_utils

        request_utils._cached_get_request_session.cache_clear()

    @classmethod
    def prepare_destination(cls, settings: MlflowSettings) -> None:
        """A fresh ``sqlite:///`` store gets its schema here, once, before parallel exports."""
        ensure_sqlite_schema(absolute_store_uri(settings.tracking_uri))

    def expected_errors(self) -> tuple[type[BaseException], ...]:
        import sqlite3

        import requests
        from mlflow.exceptions import MlflowException
        from sqlalchemy.exc import SQLAlchemyError

        return (
            *super().expected_errors(), MlflowException, requests.RequestException, ValueError,
            RequestDeadlinePassed, ServerRefused, SQLAlchemyError, sqlite3.Error,
        )  # fmt: skip

    def _client(self, *, live: bool, limits: RequestLimits | None = None) -> ScopedMlflow:
        s = self.settings
        if limits is None and live:
            limits = RequestLimits(s.live_request_timeout, s.live_request_retries, backoff=0.5)
        elif limits is None:
            limits = RequestLimits(
                s.export_request_timeout, s.export_request_retries, backoff=1.0, deadline=s.export_deadline
            )
        token = s.tracking_token.get_secret_value() if s.tracking_token else None
        uri = absolute_store_uri(s.tracking_uri)
        ensure_sqlite_schema(uri)  # never MLflow's own creation, which races in parallel processes
        return ScopedMlflow(uri, token, limits)

    @staticmethod
    def _base_bookkeeping(run: RunArtifacts, kind: str) -> dict[str, str]:
        """What the bookkeeping tag holds from the run's creation: its kind and run stem."""
        return {KIND_KEY: kind, SOURCE_KEY: tag_value(str(run.stem))}

    def _base_tags(self, run: RunArtifacts) -> dict[str, str]:
        """MLflow's own Source and User columns (the run's files and who ran it), plus the
        user's configured tags."""
        source = run.rollouts_fpath or run.artifacts_dpath
        tags = {
            "mlflow.source.name": tag_value(str(source)),
            "mlflow.source.type": "LOCAL",
        }
        with contextlib.suppress(Exception):  # no user name in some containers
            tags["mlflow.user"] = getpass.getuser()
        return {**tags, **self.settings.tags}

    # -- live ----------------------------------------------------------------------------------
    def _setup(self) -> str:
        from mlflow.exceptions import MlflowException

        assert self.run is not None
        self._ml = ml = self._client(live=True)
        experiment_id = ml.experiment_id(self.settings.experiment_name, self.settings.artifact_location)
        if self.resume_run_id is not None:
            try:
                existing = ml.get_run(self.resume_run_id)
            except MlflowException:
                existing = None
            if existing is not None and existing.info.lifecycle_stage == "active":
                self._status_before_reopen = existing.info.status
                ml.set_status(self.resume_run_id, "RUNNING")
                ml.set_tags(self.resume_run_id, {}, {"reopened_at": utc_now_iso()})
                self._start_live_traces(ml, experiment_id, self.resume_run_id)
                return self.resume_run_id
            logger.info("mlflow: run %s cannot be reopened; opening a new one", self.resume_run_id)
        run_id = ml.create_run(
            experiment_id,
            self.settings.run_name or saved_config_run_name(self.run, self.name),
            self._base_tags(self.run),
            int(time.time() * 1000),
            self._base_bookkeeping(self.run, "live"),
        )
        self._start_live_traces(ml, experiment_id, run_id)
        return run_id

    def _start_live_traces(self, ml: ScopedMlflow, experiment_id: str, run_id: str) -> None:
        """Rollouts as traces while the eval runs (``log_traces`` on an MLflow server), their ids
        scoped by the run as the export's that completes it (``_log_traces``). A database store
        has no OTLP endpoint: its traces are the export's."""
        self.live_traces = None
        if not self.settings.log_traces:
            return
        if not is_rest(ml.tracking_uri):
            logger.info("mlflow: a database store takes traces from the export only (no live traces)")
            return
        assessments = self.settings.trace_assessments
        # Their own client: a batch of traces may take a busy server longer than a metric call's
        # live timeout (the worker waits, never the eval); no retries: LiveTraces backs off.
        limits = RequestLimits(self.settings.export_request_timeout, 0, backoff=0.5)
        ml = self._client(live=True, limits=limits)

        def send(traces: list[Any]) -> None:
            log_rollout_traces(ml, experiment_id, run_id, traces, assessments)

        self.live_traces = LiveTraces(
            send, f"mlflow/{run_id}", self.secrets, on_sent=self.live_progress, batch=TRACE_BATCH
        )

    def _log_config(self, config: dict[str, Any]) -> None:
        assert self._ml is not None and self.run_id is not None
        refused = self._ml.log_params(self.run_id, config_params(config))
        if refused:
            self._ml.set_tags(self.run_id, {}, {"params_refused": tag_value(", ".join(refused))})
        self._upload_bytes(self._ml, self.run_id, "config.json", canonical_json(json_safe(config)), None)

    def _log_metrics(self, metrics: dict[str, Any], step: int, timestamp: float) -> None:
        assert self._ml is not None and self.run_id is not None
        numbers, texts = split_metrics(metrics)
        ts = int(timestamp * 1000)
        self._ml.log_metrics(self.run_id, ((k, v, ts, step) for k, v in numbers.items()))
        if texts:
            self._ml.set_tags(self.run_id, texts)

    def _log_metrics_batch(self, entries: list[tuple[dict[str, Any], int, float]]) -> None:
        """Queued steps in as few requests as MLflow allows (1000 points each)."""
        assert self._ml is not None and self.run_id is not None
        points: list[tuple[str, float, int, int]] = []
        texts: dict[str, str] = {}
        for metrics, step, timestamp in entries:
            numbers, strings = split_metrics(metrics)
            ts = int(timestamp * 1000)
            points.extend((k, v, ts, step) for k, v in numbers.items())
            texts.update(strings)
        self._ml.log_metrics(self.run_id, points)
        if texts:
            self._ml.set_tags(self.run_id, texts)

    def _log_rollouts(self, rollouts: list[Any]) -> None:
        self._log_rollouts_batch([rollouts])

    def _log_rollouts_batch(self, batches: list[list[Any]]) -> None:
        """Spooled for the rollouts artifact (uploaded whole at teardown), and as traces: every
        queued call's rollouts in one batch (``LiveTraces``; a trace not sent is the export's)."""
        if self._rollouts is None:
            name = "rollouts.jsonl" if not self.reopened else f"rollouts.resumed-{int(time.time())}.jsonl"
            self._rollouts = RolloutSpool(name, prefix="gym-artifacts-mlflow-")
        for applied, rollouts in enumerate(batches):
            try:
                self._rollouts.append(rollouts)
            except Exception as exc:
                self.trace_rollouts(batches[:applied])
                raise PartialBatch(applied, exc) from exc
        self.trace_rollouts(batches)

    def _teardown(self, status: RunStatus) -> None:
        assert self._ml is not None and self.run_id is not None
        try:
            spooled = self._rollouts.finish() if self._rollouts is not None else None
            if spooled is not None:
                self._ml.log_artifact(self.run_id, spooled, "rollouts")
                if self._upload_nemo_gym_table(self._ml, self.run_id, spooled, self.secrets):
                    self._ml.set_tags(self.run_id, {LOGGED_ARTIFACTS_TAG: logged_artifacts([])})
            if self.live_traces is not None:
                self.live_traces.close()
        finally:
            self._close_spool()
            self._ml.terminate(self.run_id, status.value)

    def _close_spool(self) -> None:
        if self._rollouts is not None:
            self._rollouts.discard()
            self._rollouts = None

    def _release_reopened(self) -> None:
        assert self._ml is not None and self.run_id is not None
        self._close_spool()
        self._ml.set_status(self.run_id, self._status_before_reopen or "KILLED")

    # -- post-run --------------------------------------------------------------------------------
    def _export(self, run: RunArtifacts, plan: ExportPlan) -> Sent:
        for rel in run.runtime_artifact_files():  # refused before anything is sent
            check_artifact_name(rel)
        ml = self._client(live=False)
        experiment_id = ml.experiment_id(self.settings.experiment_name, self.settings.artifact_location)
        found = self._runs_of(ml, experiment_id, plan)
        complete = [r for r in found if bookkeeping_of(r.data.tags).get(COMPLETE_KEY) == "true"]
        if complete:  # another folder's copy of this run (or a lost receipt) already put it here
            run_id = str(complete[0].info.run_id)
            logger.info("mlflow: run %s already holds this run's identity, complete", run_id)
            rows = RunPayload.of(run, plan).rollout_rows
            return Sent(run_id, rows=rows, note=f"already in MLflow (run {run_id} holds this identity)")
        attempt = uuid.uuid4().hex
        if found:  # an earlier export died before its receipt: finish that run, never a second one
            run_id = str(found[0].info.run_id)
            logger.info("mlflow: completing run %s found by the run's identity", run_id)
        times = run_times(run)
        lookup = self._lookup(plan)
        if not found:
            kept = {ATTEMPT_KEY: attempt, **self._base_bookkeeping(run, "post-run")}
            if plan.send_key:
                kept[SEND_KEY_KEY] = plan.send_key
            if not plan.identities_pending:
                kept[IDENTITY_KEY] = plan.run_identity
            if times is not None:
                kept[TIMES_KEY] = times.source
            start_ms = times.start_ms if times is not None else int(time.time() * 1000)
            name = self.settings.run_name or saved_config_run_name(run, self.name)
            run_id = self._create_once(ml, experiment_id, name, self._base_tags(run), kept, lookup, start_ms)

        def undo() -> None:
            ml.delete_run(run_id)

        try:
            rows, sent, traces_note = self._send_run(ml, run_id, run, plan)
        except Exception:
            plan.complete_or_undo(undo)  # a malformed file: its identity's error, no run left
            raise
        plan = plan.complete_or_undo(undo)  # the identity hashed beside the upload
        ml.terminate(run_id, "FINISHED", times.end_ms if times is not None else None)
        kept = self._complete_run(ml, experiment_id, run_id, plan)
        self._delete_orphans(ml, experiment_id, lookup, attempt, keep=kept)
        note = traces_note if kept == run_id else f"already in MLflow (run {kept} holds this identity)"
        return Sent(backend_run_id=kept, rows=rows, bytes=sent, note=note)

    @staticmethod
    def _lookup(plan: ExportPlan) -> tuple[str, str]:
        """The bookkeeping key and value this export's runs are created with and looked up by."""
        return (SEND_KEY_KEY, plan.send_key) if plan.send_key else (IDENTITY_KEY, plan.run_identity)

    @staticmethod
    def _runs_of(ml: ScopedMlflow, experiment_id: str, plan: ExportPlan) -> list[Any]:
        """Runs of this content, oldest first: those tagged with its identity (when known) and
        those of the same bytes (``SEND_KEY_KEY``) never tagged with another identity."""
        found: list[Any] = []
        if not plan.identities_pending:
            found = list(ml.find_runs(experiment_id, IDENTITY_KEY, plan.run_identity))
        if plan.send_key:
            seen = {str(r.info.run_id) for r in found}
            for other in ml.find_runs(experiment_id, SEND_KEY_KEY, plan.send_key):
                tagged = bookkeeping_of(other.data.tags).get(IDENTITY_KEY)
                if str(other.info.run_id) in seen:
                    continue
                if tagged is None or plan.identities_pending or tagged == plan.run_identity:
                    found.append(other)
            found.sort(key=lambda r: r.info.start_time or 0)
        return found

    def _complete_run(self, ml: ScopedMlflow, experiment_id: str, run_id: str, plan: ExportPlan) -> str:
        """The last step: the run tagged with its content identity and as complete, in one
        request. Returns the run kept: when another complete run already holds the identity (a
        copy of the run with other bytes, exported meanwhile), that one, and this one is deleted."""
        for other in ml.find_runs(experiment_id, IDENTITY_KEY, plan.run_identity):
            done = bookkeeping_of(other.data.tags).get(COMPLETE_KEY) == "true"
            if str(other.info.run_id) != run_id and done:
                logger.info("mlflow: run %s holds this identity; deleting %s", other.info.run_id, run_id)
                ml.delete_run(run_id)
                return str(other.info.run_id)
        ml.set_tags(run_id, {}, {IDENTITY_KEY: plan.run_identity, COMPLETE_KEY: "true"})
        return run_id

    def _create_once(
        self,
        ml: ScopedMlflow,
        experiment_id: str,
        name: str,
        tags: dict[str, str],
        kept: dict[str, str],
        lookup: tuple[str, str],
        start_ms: int,
    ) -> str:
        """Create the run for this content, never two: runs/create is sent without transport
        retries; after a failure (a timeout may still create the run on the server) the run is
        looked up by ``lookup`` (its send key, else its identity: bookkeeping it was created with) for a
        while before creating again. Then, if a concurrent exporter elsewhere created one too,
        every exporter continues in the oldest run (and deletes its own).

        A refusal (a 4xx: permission denied, unauthenticated, bad request) created nothing and
        will not change: it is raised at once (ServerRefused), never waited out. A database
        store's failed create was rolled back: its run is looked up once, not waited for."""
        import requests
        from mlflow.exceptions import MlflowException

        s = self.settings
        window = s.create_lookup_seconds
        if window is None:
            window = max(10.0, 2 * s.export_request_timeout) if is_rest(ml.tracking_uri) else 0.0
        last: Exception | None = None
        run_id: str | None = None
        for _ in range(s.export_request_retries + 1):
            try:
                run_id = ml.create_run(experiment_id, name, tags, start_ms, kept)
                break
            except (MlflowException, requests.RequestException) as exc:
                refusal = as_refusal("runs/create", exc)
                if refusal is not None:
                    raise refusal from exc
                last = exc
                logger.warning("mlflow: runs/create failed (%s); looking the run's identity up", exc)
            deadline = time.monotonic() + window
            while run_id is None:
                found = ml.find_runs(experiment_id, *lookup)
                if found:
                    run_id = str(found[0].info.run_id)
                elif time.monotonic() >= deadline:
                    break
                else:
                    time.sleep(0.5)
            if run_id is not None:
                break
        if run_id is None:
            assert last is not None
            raise last
        oldest = ml.find_runs(experiment_id, *lookup)
        if oldest and str(oldest[0].info.run_id) != run_id:
            logger.info("mlflow: run %s of this identity is older; continuing there", oldest[0].info.run_id)
            if kept.get(ATTEMPT_KEY) == bookkeeping_of(ml.get_run(run_id).data.tags).get(ATTEMPT_KEY):
                ml.delete_run(run_id)
            run_id = str(oldest[0].info.run_id)
        return run_id

    @staticmethod
    def _delete_orphans(
        ml: ScopedMlflow, experiment_id: str, lookup: tuple[str, str], attempt: str, keep: str
    ) -> None:
        """Delete the runs this export itself created and did not use (a create that timed out)."""
        for other in ml.find_runs(experiment_id, *lookup):
            if str(other.info.run_id) != keep and bookkeeping_of(other.data.tags).get(ATTEMPT_KEY) == attempt:
                logger.info("mlflow: deleting run %s, orphan of a timed-out create", other.info.run_id)
                ml.delete_run(str(other.info.run_id))

    def _export_comparison(self, comparison: ComparisonPayload) -> Sent:
        """A comparison of runs into one run of the experiment (``_mlflow_compare``)."""
        ml = self._client(live=False)
        experiment_id = ml.experiment_id(self.settings.experiment_name, self.settings.artifact_location)
        return send_comparison(ml, experiment_id, comparison)

    def _certify(self, run: RunArtifacts, plan: ExportPlan, live_run_id: str) -> Sent:
        from mlflow.exceptions import MlflowException

        ml = self._client(live=False)
        try:
            live = ml.get_run(live_run_id)
        except MlflowException as exc:
            raise CannotCertify(f"live run {live_run_id} is gone") from exc
        if live.info.lifecycle_stage != "active":
            raise CannotCertify(f"live run {live_run_id} is deleted")
        kept = {IDENTITY_KEY: plan.run_identity, CERTIFIED_KEY: "true"}
        if plan.send_key:  # a copy of the run's bytes exported later finds this run by them
            kept[SEND_KEY_KEY] = plan.send_key
        ml.set_tags(live_run_id, {}, kept)
        # Everything the run has, whatever the live run lacks (calls lost while the server was
        # down): the store keeps one point per metric, step, time and value, files overwrite.
        rows, sent, note = self._send_run(ml, live_run_id, run, plan)
        ml.terminate(live_run_id, "FINISHED", self._eval_end_ms(live, run))
        ml.set_tags(live_run_id, {}, {COMPLETE_KEY: "true"})
        return Sent(backend_run_id=live_run_id, rows=rows, bytes=sent, note=note)

    @staticmethod
    def _eval_end_ms(live: Any, run: RunArtifacts) -> int | None:
        """When the eval ended, for a live run the export completes: the end its teardown set,
        else (it never ended: the server was down, the process was killed) the run's own times'
        end, never the export's time."""
        if live.info.status != "RUNNING" and live.info.end_time:
            return int(live.info.end_time)
        times = run_times(run)
        return times.end_ms if times is not None else None

    def _after_receipt(self, run: RunArtifacts, plan: ExportPlan, backend_run_id: str | None) -> None:
        """NeMo Gym's ``rollouts.json`` table and ``report.html`` uploaded to the run, now that it
        is complete and the receipt written: neither decides the receipt (``rollouts/rollouts.jsonl``
        holds every row; the report comes from the export's identities and coverage: the run is
        not hashed again). A run that holds a report already (another copy of this content
        exported it) keeps it; the table is written again (a completed live run's may lack rows)."""
        if backend_run_id is None:
            return
        ml = self._client(live=False)
        self._table_after_receipt(ml, run, plan, backend_run_id)
        if self.settings.report == "off":
            return
        if has_report(ml, backend_run_id):
            return
        job = job_for(run, plan, backend_run_id)
        if self.settings.report == "background":
            token = self.settings.tracking_token
            start_report(job, ReportTarget(ml.tracking_uri, token.get_secret_value() if token else None,
                                           backend_run_id, ml.limits))  # fmt: skip
        else:
            build_and_upload(job, ml, backend_run_id)

    def _mark_superseded(self, live_run_id: str, new_run_id: str) -> None:
        """Note the complete run on the live one, and end the live one if it never ended (KILLED:
        it is not the run's record), at the eval's end."""
        ml = self._client(live=False)
        ml.set_tags(live_run_id, {}, {SUPERSEDED_KEY: new_run_id})
        if ml.get_run(live_run_id).info.status == "RUNNING":
            ml.terminate(live_run_id, "KILLED", ml.get_run(new_run_id).info.end_time or None)

    def _send_run(
        self, ml: ScopedMlflow, run_id: str, run: RunArtifacts, plan: ExportPlan
    ) -> tuple[int, int, str | None]:
        """Everything the run has; idempotent (metric points keep their timestamps, files overwrite).
        Returns the rollout rows, the bytes sent and what the result notes (traces outside MLflow's
        default view, ``_mlflow_trace_view``)."""
        payload = RunPayload.of(run, plan)
        sent = 0
        note: str | None = None
        tags: dict[str, str] = {}
        kept: dict[str, str] = {}  # the bookkeeping tag's entries
        if payload.config is not None:
            refused = ml.log_params(run_id, config_params(payload.config))
            if refused:
                kept["params_refused"] = tag_value(", ".join(refused))
            sent += self._upload_bytes(
                ml, run_id, "config.json", canonical_json(json_safe(payload.config)), None
            )
        journal_tags: dict[str, str] = {}

        def journal_points() -> Any:
            for entry in payload.journal():
                numbers, texts = split_metrics(entry.metrics)
                journal_tags.update(texts)
                step = entry.step if entry.step is not None else 0
                for key, value in numbers.items():
                    journaled.add(key)
                    yield key, value, int(entry.time * 1000), step

        journaled: set[str] = set()  # MLflow names the journal holds: its point is their one point
        ml.log_metrics(run_id, journal_points())
        tags.update(journal_tags)
        numbers, texts = split_metrics(payload.values)
        head, rest = headline_split(numbers)  # the rest goes to the metrics table, journaled or not
        ts = int(eval_end_s(run) * 1000)
        ml.log_metrics(run_id, ((k, v, ts, 0) for k, v in head.items() if k not in journaled))
        tags.update(texts)
        if payload.aggregate_file is not None:
            sent += self._upload_artifact(ml, run_id, payload.aggregate_file, None)
        tables = payload.tables
        for table in tables:
            sent += self._upload_written(ml, run_id, f"{table.name}.json", table, "tables")
        table_paths = [f"tables/{t.name}.json" for t in tables]
        if rest:
            sent += self._upload_bytes(ml, run_id, METRICS_TABLE, metrics_table(rest), "tables")
            table_paths.append(f"tables/{METRICS_TABLE}")
        tags[DESCRIPTION_TAG] = headline(payload)
        run_name = self.settings.run_name or saved_config_run_name(run, self.name)
        dataset = planned_inputs(payload, f"{run_name} planned inputs")
        if dataset is not None:
            ml.client.log_inputs(run_id, [dataset])
            experiment_id = str(ml.get_run(run_id).info.experiment_id)
            evaluation_dataset(ml, experiment_id, f"{run_name} planned inputs", payload)
        if payload.coverage is not None:
            kept["coverage"] = payload.coverage.text()
            kept["partial"] = "true" if payload.coverage.partial else "false"
        for item in payload.sidecars:
            sent += self._upload_artifact(ml, run_id, item, "nemo_gym")
        acceptance = payload.acceptance
        if acceptance is not None and payload.acceptance_file is not None:
            kept["accepted_partial"] = "true"
            kept["acceptance_reason"] = acceptance.reason
            kept["omitted_rows"] = str(acceptance.omitted_rows)
            kept["planned_rows"] = str(acceptance.planned_rows)
            sent += self._upload_artifact(ml, run_id, payload.acceptance_file, None)
        self._send_system_metrics(ml, run_id, payload, kept)
        rollouts = run.rollouts_fpath
        with payload.rollouts_file() as complete:
            if complete is not None:
                assert rollouts is not None
                sent += self._upload_file(ml, run_id, complete, "rollouts.jsonl", "rollouts")
                # NeMo Gym's rollouts.json table: after the receipt (``_after_receipt``)
                if self.settings.log_traces:
                    times = run_times(run)
                    start_ms = times.start_ms if times is not None else int(time.time() * 1000)
                    window = self._log_traces(ml, run_id, payload, start_ms, plan).window
                    if window is not None:
                        experiment_id = str(ml.get_run(run_id).info.experiment_id)
                        tags[DESCRIPTION_TAG] += "\n\n" + window.description(experiment_id)
                        note = window.note(experiment_id)
        omitted = payload.omitted_partial_line
        if omitted:
            ts = int(eval_end_s(run) * 1000)
            ml.log_metrics(run_id, ((k, float(v), ts, 0) for k, v in omitted.items()))
            kept.update({k: str(v) for k, v in omitted.items()})
        for item in payload.runtime_artifacts:
            parts = item.name.rsplit("/", 1)
            artifact_dir = "runtime" if len(parts) == 1 else f"runtime/{parts[0]}"
            sent += self._upload_artifact(ml, run_id, item, artifact_dir)
        if table_paths or payload.rollout_rows:
            # MLflow's UI shows these artifacts as tables (what mlflow.log_table records)
            tags[LOGGED_ARTIFACTS_TAG] = logged_artifacts(table_paths)
        if tags or kept:
            ml.set_tags(run_id, tags, kept)
        return payload.rollout_rows, sent, note

    @classmethod
    def _table_after_receipt(cls, ml: ScopedMlflow, run: RunArtifacts, plan: ExportPlan, run_id: str) -> None:
        """NeMo Gym's rollouts table of a run whose rollouts were sent (``_upload_nemo_gym_table``;
        the one the export's read of the rollouts wrote, when it did)."""
        payload = RunPayload.of(run, plan)
        if not payload.sends_rollouts:
            return
        with payload.rollouts_file() as complete:
            if complete is not None:
                cls._upload_nemo_gym_table(ml, run_id, complete, payload.secrets, payload.rollouts_table())

    @staticmethod
    def _upload_nemo_gym_table(
        ml: ScopedMlflow,
        run_id: str,
        rollouts: Path,
        secrets: frozenset[str] = frozenset(),
        written: Any = None,
    ) -> int:
        """The rollouts as NeMo Gym's exporter logs them: table artifact ``rollouts.json``, one
        JSON document per row in column ``Rollout``; returns the bytes sent (0: no rows).
        ``written``: the table as the export's one read of ``rollouts`` wrote it (``path``,
        ``rows``), uploaded as it is."""
        if written is not None:
            return ml.log_artifact(run_id, written.path, None) if written.rows else 0
        with tempfile.TemporaryDirectory(prefix="gym-artifacts-mlflow-") as tmp:
            staged = Path(tmp) / MLFLOW_TABLE_FILE
            try:
                if write_split_table(file_documents(rollouts, secrets), staged) == 0:
                    return 0
                return ml.log_artifact(run_id, staged, None)
            except (OSError, ValueError) as exc:  # rollouts/rollouts.jsonl holds every row anyway
                logger.warning("mlflow: NeMo Gym's %s table not logged: %s", MLFLOW_TABLE_FILE, exc)
                return 0

    def _log_traces(
        self, ml: ScopedMlflow, run_id: str, payload: RunPayload, fallback_ms: int, plan: ExportPlan
    ) -> MlflowTracesSent:
        """Every rollout (failed ones too) as a trace in the run's experiment, linked to the run
        (see _mlflow_traces); a database store gets MLflow's own server for the duration. A
        rollout without its own time is placed at ``fallback_ms`` (the eval's start) plus its row
        in milliseconds. Ids are scoped by the MLflow run, which a rerun finds by identity."""
        from ._mlflow_trace_server import trace_server

        experiment_id = str(ml.get_run(run_id).info.experiment_id)
        traces = payload_traces(payload, f"mlflow/{run_id}", fallback_ms / 1000, plan)
        assessments = self.settings.trace_assessments
        if is_rest(ml.tracking_uri):  # a live run's traces are there already: only the rest
            return log_rollout_traces(ml, experiment_id, run_id, only_missing(ml, traces), assessments)
        # A database store has no server before its traces: the export's deadline bounds their
        # part only, counted from here (the store answered all along before it) and again from
        # each batch of traces the server took: the server's start and the traces' requests.
        ml.deadline.progress()
        with trace_server(ml.tracking_uri, remaining=ml.deadline.remaining) as url:
            local = ScopedMlflow(url, None, ml.limits, deadline=ml.deadline)  # one deadline, one progress
            return log_rollout_traces(local, experiment_id, run_id, traces, assessments)

    @staticmethod
    def _send_system_metrics(
        ml: ScopedMlflow, run_id: str, payload: RunPayload, kept: dict[str, str]
    ) -> None:
        figures, reason = payload.nvml_summary
        if reason is not None:
            kept["nvml"] = reason
        if figures:
            numbers, _ = split_metrics(figures, prefix="system")
            ts = file_mtime_ms(payload.run.artifacts_dpath / NVML_SUMMARY)
            ml.log_metrics(run_id, ((k, v, ts, 0) for k, v in numbers.items()))
        steps: dict[int, int] = {}

        def series_points() -> Any:
            for sample in payload.nvml_series():
                step = steps.get(sample.gpu, 0)
                steps[sample.gpu] = step + 1
                numbers, _ = split_metrics(sample.metrics, prefix=f"system/gpu{sample.gpu}")
                for key, value in numbers.items():
                    yield key, value, int(sample.time * 1000), step

        ml.log_metrics(run_id, series_points())

    # -- artifact helpers -----------------------------------------------------------------------------
    @staticmethod
    def _upload_file(ml: ScopedMlflow, run_id: str, src: Path, name: str, artifact_dir: str | None) -> int:
        """``src`` uploaded as ``<artifact_dir>/<name>``. Staged under that name as a symbolic
        link (MLflow names an artifact by its file), so the rollouts are read once, by the upload
        (issue 43); the store keeps a copy of what the link reads. A file changed while it is sent
        is caught by the export (``files_unchanged``: no receipt). A copy where no link can be made."""
        if src.name == name:
            return ml.log_artifact(run_id, src, artifact_dir)
        with tempfile.TemporaryDirectory(prefix="gym-artifacts-mlflow-") as tmp:
            staged = Path(tmp) / name
            try:
                staged.symlink_to(src.resolve())
            except OSError:
                snapshot_copy(src, staged)
            return ml.log_artifact(run_id, staged, artifact_dir)

    @classmethod
    def _upload_bytes(
        cls, ml: ScopedMlflow, run_id: str, name: str, data: bytes, artifact_dir: str | None
    ) -> int:
        with tempfile.TemporaryDirectory(prefix="gym-artifacts-mlflow-") as tmp:
            staged = Path(tmp) / name
            staged.write_bytes(data)
            return ml.log_artifact(run_id, staged, artifact_dir)

    @staticmethod
    def _upload_written(
        ml: ScopedMlflow, run_id: str, name: str, table: LevelTable, artifact_dir: str
    ) -> int:
        """A level table written a row at a time to a staged file (``write_table_split_json``),
        then uploaded: a table of any size is never whole in memory."""
        with tempfile.TemporaryDirectory(prefix="gym-artifacts-mlflow-") as tmp:
            staged = Path(tmp) / name
            with open(staged, "wb") as fh:
                write_table_split_json(table, fh.write)
            return ml.log_artifact(run_id, staged, artifact_dir)

    @staticmethod
    def _upload_artifact(
        ml: ScopedMlflow, run_id: str, item: PayloadArtifact, artifact_dir: str | None
    ) -> int:
        """One run file under its payload name, masked when it held a secret."""
        with item.as_file() as staged:
            return ml.log_artifact(run_id, staged, artifact_dir)
