"""The Phoenix backend: a dataset of tasks and an experiment of rollouts (``arize-phoenix-client``).

Names: the project (traces), the dataset and the experiment are named from the run, ``<agent>
<run name> <date> <id>`` (e.g. ``example_single_tool_call_simple_agent with-failures-rollouts
2026-12-01 3f2a1c9b``: the agents of the aggregate, the run's name, the eval's start date, the
start of its content identity), so two runs are told apart at a glance; settings override each.

Mapping: a dataset with one example per task (input: the task's request, NeMo Gym's
``responses_create_params``, a failed-only task's planned one; metadata: ``task``), an
experiment on it whose metadata hold the run's identity, the masked config, the aggregate
metrics and ``coverage`` (the ``coverage/*`` figures the trackers log), one experiment run per
planned rollout (output: the response; repetition: the rollout's ``repeat`` + 1, else its
occurrence of the task): a failed one (``OUT_failures.jsonl``) is an ERROR run with its failure.
Each run is linked to its rollout's trace (``trace_id``, when traces are sent) and each numeric
verdict (``reward`` first) is a ``CODE`` evaluation of it.

Exactly once: Phoenix assigns its own ids, so everything is found before it is created: the
dataset by name, the experiment by the identity in its metadata, and the runs already in the
experiment by (example, repetition); only missing runs are logged. Evaluations are upserts keyed
by (run, name) in Phoenix, so a retry rewrites them in place.

Live (``log_traces``): each rollout handed to ``export_rollouts`` is sent as its trace on the
backend's worker (``LiveTraces``: batched, backed off when Phoenix pushes back, bounded) into the
live run's project (``project_name``, else ``<run name> <date> live-<id>``: the live run's id). The
export that completes the live run (``_certify``) sends the dataset and experiment, and of the
traces only those the project lacks (same ids: the live project's scope and each rollout's key),
each experiment run linked to its live trace.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import re
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr

from gym_artifacts.plugin import (
    ExporterConfig,
    ExportPlan,
    LiveExporter,
    LiveTraces,
    LiveTracing,
    RunArtifacts,
    RunPayload,
    RunStatus,
    Sent,
    agent_label,
    dataset_service_destination,
    failed_trajectory,
    run_times,
    saved_config_run_name,
    trace_id_for,
)

from ._phoenix_traces import BATCH as TRACE_BATCH
from ._phoenix_traces import only_missing, send_traces
from ._rollouts import Rollout, as_object, failed_rollouts, masked, payload_rollouts, payload_traces

IDENTITY_KEY = "gym_artifacts.identity"
Planned = tuple[str, Rollout, "str | None"]  # trace key, the rollout, its failure (None: scored)


class PhoenixSettings(ExporterConfig):
    """Settings of ``exporters.phoenix``."""

    base_url: str = "http://127.0.0.1:6006"
    api_key: SecretStr | None = None
    dataset_name: str | None = None  # default ``<agent> <run name> <date> <id>`` (the module doc)
    experiment_name: str | None = None  # default the dataset's name
    request_timeout: int = Field(default=60, gt=0, le=3600)
    # The whole export (every request and retry) ends FAILED after this many seconds, even
    # against a server that never answers or drips a byte at a time (gym_artifacts.core.watchdog).
    export_deadline: float = Field(default=600.0, gt=0, le=24 * 3600)
    # Every rollout as a trace (OpenInference span tree, failed rollouts as ERROR traces, verdicts
    # as span annotations) in the project ``project_name`` (default: the dataset's name).
    log_traces: bool = True
    project_name: str | None = None
    # How long Phoenix may take to store one batch of traces, from when it was posted (it inserts
    # in the background).
    traces_landed_timeout: float = Field(default=600.0, gt=0, le=24 * 3600)
    # The dataset of tasks and the experiment of rollouts (one request per rollout).
    log_experiment: bool = True


def live_scope(project: str) -> str:
    """The scope of a live run's trace ids: its project (the live run's id)."""
    return f"phoenix/{project}/live"


class PhoenixExporter(LiveTracing, LiveExporter):
    """Phoenix datasets and experiments through ``phoenix.client.Client``; traces live."""

    name = "phoenix"
    config_model = PhoenixSettings
    sdk_module = "phoenix"  # the client lives in the phoenix namespace package (phoenix.client)
    settings: PhoenixSettings

    def __init__(self, settings: PhoenixSettings) -> None:
        super().__init__(settings)
        self._live_client: Any = None

    @classmethod
    def contract_settings(cls, folder: Path) -> dict[str, Any] | None:
        """None: it needs a running `phoenix serve` (tests/test_phoenix.py starts one)."""
        return None

    @classmethod
    def destination_for(cls, settings: Any) -> dict[str, Any]:
        """The base_url without credentials, the dataset and experiment names, and the project's
        when it is set (by default it is the dataset's)."""
        destination = dataset_service_destination(settings, "base_url")
        if getattr(settings, "project_name", None):
            destination["project_name"] = settings.project_name
        return destination

    def export_deadline_s(self) -> float | None:
        return self.settings.export_deadline

    def server_url(self) -> str | None:
        return self.settings.base_url

    def expected_errors(self) -> tuple[type[BaseException], ...]:
        import httpx

        return (*super().expected_errors(), httpx.HTTPError, ValueError)

    def _client(self) -> Any:
        from phoenix.client import Client

        key = self.settings.api_key.get_secret_value() if self.settings.api_key else None
        return Client(base_url=self.settings.base_url, api_key=key)

    # -- live ----------------------------------------------------------------------------------
    def _setup(self) -> str:
        """The live run is its project (reopened by name when resuming); traces only: Phoenix
        holds no step metrics, and the dataset and experiment are the export's."""
        assert self.run is not None
        project = self.resume_run_id or self.settings.project_name or live_title(self.run)
        self._live_client = client = self._client()
        self.live_traces = None
        if self.settings.log_traces:
            s = self.settings

            def send(traces: list[Any]) -> None:  # a batch landed and annotated, or raises
                send_traces(client, project, traces, float(s.request_timeout), float(s.request_timeout))

            self.live_traces = LiveTraces(
                send, live_scope(project), self.secrets, on_sent=self.live_progress, batch=TRACE_BATCH
            )
        return project

    def _log_config(self, config: dict[str, Any]) -> None:
        return None  # the experiment's metadata hold it (the export's)

    def _log_metrics(self, metrics: dict[str, Any], step: int, timestamp: float) -> None:
        return None  # Phoenix holds traces and experiments, not step metrics

    def _log_rollouts(self, rollouts: list[Any]) -> None:
        self._log_rollouts_batch([rollouts])

    def _log_rollouts_batch(self, batches: list[list[Any]]) -> None:
        """Every queued call's rollouts as traces, in batches (a trace not sent is the export's)."""
        self.trace_rollouts(batches)

    def _teardown(self, status: RunStatus) -> None:
        client, self._live_client = self._live_client, None
        try:
            if self.live_traces is not None:
                self.live_traces.close()
        finally:
            with contextlib.suppress(Exception):
                client._client.close()

    def _certify(self, run: RunArtifacts, plan: ExportPlan, live_run_id: str) -> Sent:
        """Complete the live run: the dataset and experiment, and the traces its project lacks;
        the backend run stays the live one (its project)."""
        sent = self._with_client(lambda client: self._export_with(client, run, plan, live_run_id))
        return Sent(backend_run_id=live_run_id, rows=sent.rows, bytes=sent.bytes, note=sent.note)

    # -- post-run --------------------------------------------------------------------------------
    def _export(self, run: RunArtifacts, plan: ExportPlan) -> Sent:
        return self._with_client(lambda client: self._export_with(client, run, plan))

    def _with_client(self, send: Any) -> Sent:
        client = self._client()
        try:
            return send(client)  # type: ignore[no-any-return]
        finally:  # its connections closed now, never left to the garbage collector
            with contextlib.suppress(Exception):
                client._client.close()

    def _export_with(self, client: Any, run: RunArtifacts, plan: ExportPlan, live: str | None = None) -> Sent:
        """Send the run; ``live``: the live run's project, completed (its traces' scope, and only
        the traces it lacks)."""
        payload = RunPayload.of(run, plan)
        if not payload.sends_rollouts:
            return Sent(
                backend_run_id=None, note="no rollouts sent: Phoenix holds runs only as an experiment"
            )
        backend_run_id = None
        rows = payload.rollout_rows
        project = live or self.settings.project_name or self._dataset_name(run, plan, payload)
        # of the trace ids, linked from the runs
        scope = live_scope(project) if live else f"phoenix/{project}/{plan.run_identity}"
        if self.settings.log_traces:
            backend_run_id = project
            self._send_traces(client, project, payload, plan, scope, completing=live is not None)
        if self.settings.log_experiment:
            # Two passes (tasks first: the dataset must exist before its runs), each streamed.
            tasks, repetitions = self._tasks(self._rollouts(payload), plan)
            dataset = self._dataset(client, run, plan, payload, tasks)
            example_of_task = {str(e["metadata"].get("task")): e["id"] for e in dataset.examples}
            backend_run_id = self._experiment(client, run, plan, payload, dataset.id, repetitions)
            rollouts = self._rollouts(payload)
            traces = scope if self.settings.log_traces else None
            rows = self._send_runs(client, run, backend_run_id, example_of_task, rollouts, plan, traces)
        return Sent(backend_run_id=backend_run_id, rows=rows)

    @staticmethod
    def _rollouts(payload: RunPayload) -> Iterator[Planned]:
        """``(trace key, rollout, failure or None)`` of every planned rollout with a result: the
        scored ones, then each failed one with its planned input (streamed)."""
        for r in payload_rollouts(payload):
            yield r.key, r, None
        for index, record, planned in failed_rollouts(payload):
            t = failed_trajectory(index, record, planned)
            view = Rollout(t.row, t.task, t.repeat, t.agent, t.request, None, {}, {}, None, key=t.key)
            yield t.key, view, t.failure.text if t.failure is not None else "failed"

    def _dataset_name(self, run: RunArtifacts, plan: ExportPlan, payload: RunPayload) -> str:
        return self.settings.dataset_name or run_title(run, plan, payload)

    def _send_traces(
        self, client: Any, project: str, payload: RunPayload, plan: ExportPlan, scope: str, completing: bool
    ) -> None:
        """Every rollout (failed ones too) as a trace in ``project`` (see _phoenix_traces), ids in
        ``scope``; ``completing`` a live run: only those the project lacks. A rollout without its
        own time is placed at the eval's start."""
        times = run_times(payload.run)
        fallback = times.start if times is not None else 0.0
        traces = payload_traces(payload, scope, fallback, plan)
        s = self.settings
        if completing:
            traces = only_missing(client, project, traces, float(s.request_timeout))
        send_traces(client, project, traces, float(s.request_timeout), s.traces_landed_timeout)

    @staticmethod
    def _tasks(rollouts: Iterable[Planned], plan: ExportPlan) -> tuple[dict[str, Any], int]:
        """Each task's request (its first rollout's, masked) and the most repetitions of a task."""
        tasks: dict[str, Any] = {}
        occurrences: dict[str, int] = {}
        for _, r, _ in rollouts:
            occurrences[r.task] = occurrences.get(r.task, 0) + 1
            if r.task not in tasks:
                tasks[r.task] = masked(as_object(r.request, "responses_create_params"), plan.secrets)
        return tasks, max(occurrences.values(), default=1)

    def _dataset(
        self, client: Any, run: RunArtifacts, plan: ExportPlan, payload: RunPayload, tasks: dict[str, Any]
    ) -> Any:
        import httpx

        name = self._dataset_name(run, plan, payload)
        try:
            return client.datasets.get_dataset(dataset=name, timeout=self.settings.request_timeout)
        except (ValueError, httpx.HTTPStatusError):
            pass  # not there yet
        return client.datasets.create_dataset(
            name=name,
            inputs=list(tasks.values()),
            outputs=[{} for _ in tasks],
            metadata=[{"task": task} for task in tasks],
            dataset_description=f"Tasks of the eval run {saved_config_run_name(run, self.name)} "
            f"({plan.run_identity})",
            timeout=self.settings.request_timeout,
        )

    def _experiment(
        self, client: Any, run: RunArtifacts, plan: ExportPlan, payload: RunPayload, dataset_id: str,
        repetitions: int,
    ) -> str:  # fmt: skip
        for experiment in client.experiments.list(
            dataset_id=dataset_id, timeout=self.settings.request_timeout
        ):
            if (experiment.get("metadata") or {}).get(IDENTITY_KEY) == plan.run_identity:
                return str(experiment["id"])
        metadata: dict[str, Any] = {
            IDENTITY_KEY: plan.run_identity,
            "config": plan.config,
            **RunPayload.of(run, plan).experiment_metadata,
        }
        created = client.experiments.create(
            dataset_id=dataset_id,
            experiment_name=self.settings.experiment_name or self._dataset_name(run, plan, payload),
            experiment_metadata=masked(metadata, plan.secrets),
            repetitions=repetitions,
            timeout=self.settings.request_timeout,
        )
        return str(created["id"])

    def _existing_runs(self, client: Any, experiment_id: str) -> dict[tuple[str, int], str]:
        """``{(example id, repetition): run id}`` of the runs the experiment already holds."""
        found: dict[tuple[str, int], str] = {}
        cursor = None
        while True:
            params: dict[str, Any] = {"limit": 1000}
            if cursor:
                params["cursor"] = cursor
            response = client._client.get(f"v1/experiments/{experiment_id}/runs", params=params)
            response.raise_for_status()
            body = response.json()
            for item in body["data"]:
                found[(item["dataset_example_id"], item["repetition_number"])] = item["id"]
            cursor = body.get("next_cursor")
            if not cursor:
                return found

    def _send_runs(
        self,
        client: Any,
        run: RunArtifacts,
        experiment_id: str,
        example_of_task: dict[str, str],
        rollouts: Iterable[Planned],
        plan: ExportPlan,
        trace_scope: str | None,
    ) -> int:
        """Log the runs the experiment lacks, linked to their traces (``trace_scope``: the ids'
        scope, None when no traces are sent), failed ones as ERROR runs; then their verdicts."""
        existing = self._existing_runs(client, experiment_id)
        # a rollout without a time of its own: the eval's start (never the epoch, 1970)
        times = run_times(run)
        fallback_s = times.start if times is not None else time.time()
        occurrences: dict[str, int] = {}
        rows = 0
        for key, r, failure in rollouts:
            rows += 1
            occurrences[r.task] = occurrences.get(r.task, 0) + 1
            repetition = r.repeat + 1 if r.repeat is not None else occurrences[r.task]
            example_id = example_of_task[r.task]
            start, end = r.times(fallback_s)
            run_id = existing.get((example_id, repetition))
            if run_id is None:
                output = {"error": failure} if failure is not None else as_object(r.response, "response")
                logged = client.experiments.log_run(
                    experiment_id=experiment_id,
                    dataset_example_id=example_id,
                    output=masked(output, plan.secrets),
                    start_time=start,
                    end_time=end,
                    repetition_number=repetition,
                    trace_id=trace_id_for(trace_scope, key) if trace_scope is not None else None,
                    error=masked(failure, plan.secrets) if failure is not None else None,
                    timeout=self.settings.request_timeout,
                )
                run_id = logged["id"]
            for name, score in r.verdicts.items():
                client.experiments.log_evaluation(
                    experiment_run_id=run_id,
                    name=name,
                    annotator_kind="CODE",
                    start_time=end,
                    end_time=end,
                    score=score,
                    timeout=self.settings.request_timeout,
                )
        return rows


_UNSAFE_NAME = re.compile(r"[/?#\\]+")  # Phoenix refuses them in a project name used as a path


def live_title(run: RunArtifacts) -> str:
    """A live run's project: ``<run name> <date> live-<id>`` (the eval's start date is not known
    yet, nor its content: today's date and a random id keep two live runs apart)."""
    day = dt.datetime.now(dt.timezone.utc).date().isoformat()
    name = f"{saved_config_run_name(run, 'phoenix')} {day} live-{uuid.uuid4().hex[:8]}"
    return _UNSAFE_NAME.sub("-", name)[:200]


def run_title(run: RunArtifacts, plan: ExportPlan, payload: RunPayload) -> str:
    """``<agent> <run name> <date> <id>``: the agents of the aggregate (the first two and a
    count), the run's name, the eval's start date (UTC; left out when unknown) and the first 8
    digits of its content identity (two runs of one name and day stay apart)."""
    agents = [agent_label(e.get("agent_ref")) for e in payload.aggregate_entries or [] if isinstance(e, dict)]
    label = "+".join(agents[:2]) + (f"+{len(agents) - 2}" if len(agents) > 2 else "")
    times = run_times(run)
    day = dt.datetime.fromtimestamp(times.start, dt.timezone.utc).date().isoformat() if times else ""
    parts = [label, saved_config_run_name(run, "phoenix"), day, plan.run_identity.split(":")[-1][:8]]
    return _UNSAFE_NAME.sub("-", " ".join(p for p in parts if p))[:200]
