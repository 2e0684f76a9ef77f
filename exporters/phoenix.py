"""The Phoenix backend: a dataset of tasks and an experiment of rollouts (``arize-phoenix-client``).

Mapping: a dataset with one example per task (input: the task's request, NeMo Gym's
``responses_create_params``; metadata: ``task``), an experiment on it whose metadata hold the
run's identity, the masked config, the aggregate metrics and ``coverage`` (the ``coverage/*``
figures the trackers log), one experiment run per rollout
(output: the response; repetition: the rollout's ``repeat`` + 1, else its occurrence of the task)
and each numeric verdict (``reward`` first) as a ``CODE`` evaluation of that run.

Exactly once: Phoenix assigns its own ids, so everything is found before it is created: the
dataset by name, the experiment by the identity in its metadata, and the runs already in the
experiment by (example, repetition); only missing runs are logged. Evaluations are upserts keyed
by (run, name) in Phoenix, so a retry rewrites them in place. Post-run only.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr

from gym_artifacts.plugin import (
    Exporter,
    ExporterConfig,
    ExportPlan,
    RunArtifacts,
    RunPayload,
    Sent,
    dataset_service_destination,
    run_times,
)

from ._phoenix_traces import send_traces
from ._rollouts import Rollout, as_object, masked, payload_rollouts, payload_traces

IDENTITY_KEY = "gym_artifacts.identity"


class PhoenixSettings(ExporterConfig):
    """Settings of ``exporters.phoenix``."""

    base_url: str = "http://127.0.0.1:6006"
    api_key: SecretStr | None = None
    dataset_name: str | None = None  # default ``<run name>-<identity>``
    experiment_name: str | None = None  # default the run's name
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


class PhoenixExporter(Exporter):
    """Phoenix datasets and experiments through ``phoenix.client.Client``."""

    name = "phoenix"
    config_model = PhoenixSettings
    sdk_module = "phoenix"  # the client lives in the phoenix namespace package (phoenix.client)
    settings: PhoenixSettings

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

    def _export(self, run: RunArtifacts, plan: ExportPlan) -> Sent:
        client = self._client()
        try:
            return self._export_with(client, run, plan)
        finally:  # its connections closed now, never left to the garbage collector
            with contextlib.suppress(Exception):
                client._client.close()

    def _export_with(self, client: Any, run: RunArtifacts, plan: ExportPlan) -> Sent:
        payload = RunPayload.of(run, plan)
        if not payload.sends_rollouts:
            return Sent(
                backend_run_id=None, note="no rollouts sent: Phoenix holds runs only as an experiment"
            )
        backend_run_id = None
        rows = payload.rollout_rows
        if self.settings.log_traces:
            backend_run_id = project = self.settings.project_name or self._dataset_name(run, plan)
            self._send_traces(client, project, payload, plan)
        if self.settings.log_experiment:
            # Two passes (tasks first: the dataset must exist before its runs), each streamed.
            tasks, repetitions = self._tasks(payload_rollouts(payload), plan)
            dataset = self._dataset(client, run, plan, tasks)
            example_of_task = {str(e["metadata"].get("task")): e["id"] for e in dataset.examples}
            backend_run_id = self._experiment(client, run, plan, dataset.id, repetitions)
            rollouts = payload_rollouts(payload)
            rows = self._send_runs(client, run, backend_run_id, example_of_task, rollouts, plan)
        return Sent(backend_run_id=backend_run_id, rows=rows)

    def _dataset_name(self, run: RunArtifacts, plan: ExportPlan) -> str:
        return self.settings.dataset_name or f"{run.name}-{plan.run_identity.split(':')[-1][:12]}"

    def _send_traces(self, client: Any, project: str, payload: RunPayload, plan: ExportPlan) -> None:
        """Every rollout (failed ones too) as a trace in ``project`` (see _phoenix_traces); ids
        scoped by the project and the run's identity. A rollout without its own time is placed at
        the eval's start."""
        from gym_artifacts.plugin import run_times

        times = run_times(payload.run)
        fallback = times.start if times is not None else 0.0
        traces = payload_traces(payload, f"phoenix/{project}/{plan.run_identity}", fallback, plan)
        s = self.settings
        send_traces(client, project, traces, float(s.request_timeout), s.traces_landed_timeout)

    @staticmethod
    def _tasks(rollouts: Iterable[Rollout], plan: ExportPlan) -> tuple[dict[str, Any], int]:
        """Each task's request (its first rollout's, masked) and the most repetitions of a task."""
        tasks: dict[str, Any] = {}
        occurrences: dict[str, int] = {}
        for r in rollouts:
            occurrences[r.task] = occurrences.get(r.task, 0) + 1
            if r.task not in tasks:
                tasks[r.task] = masked(as_object(r.request, "responses_create_params"), plan.secrets)
        return tasks, max(occurrences.values(), default=1)

    def _dataset(self, client: Any, run: RunArtifacts, plan: ExportPlan, tasks: dict[str, Any]) -> Any:
        import httpx

        name = self._dataset_name(run, plan)
        try:
            return client.datasets.get_dataset(dataset=name, timeout=self.settings.request_timeout)
        except (ValueError, httpx.HTTPStatusError):
            pass  # not there yet
        return client.datasets.create_dataset(
            name=name,
            inputs=list(tasks.values()),
            outputs=[{} for _ in tasks],
            metadata=[{"task": task} for task in tasks],
            dataset_description=f"Tasks of the eval run {run.name} ({plan.run_identity})",
            timeout=self.settings.request_timeout,
        )

    def _experiment(
        self, client: Any, run: RunArtifacts, plan: ExportPlan, dataset_id: str, repetitions: int
    ) -> str:
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
            experiment_name=self.settings.experiment_name or run.name,
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
        rollouts: Iterable[Rollout],
        plan: ExportPlan,
    ) -> int:
        existing = self._existing_runs(client, experiment_id)
        # a rollout without a time of its own: the eval's start (never the epoch, 1970)
        times = run_times(run)
        fallback_s = times.start if times is not None else time.time()
        occurrences: dict[str, int] = {}
        rows = 0
        for r in rollouts:
            rows += 1
            occurrences[r.task] = occurrences.get(r.task, 0) + 1
            repetition = r.repeat + 1 if r.repeat is not None else occurrences[r.task]
            example_id = example_of_task[r.task]
            start, end = r.times(fallback_s)
            run_id = existing.get((example_id, repetition))
            if run_id is None:
                logged = client.experiments.log_run(
                    experiment_id=experiment_id,
                    dataset_example_id=example_id,
                    output=masked(as_object(r.response, "response"), plan.secrets),
                    start_time=start,
                    end_time=end,
                    repetition_number=repetition,
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
