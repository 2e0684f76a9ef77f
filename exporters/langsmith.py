"""The LangSmith backend: NeMo Gym's mapping, post-run, with deterministic ids (SDK imported lazily).

Mapping (as NeMo Gym's own LangSmith exporter): a dataset with one example per task (inputs: the
task's request, NeMo Gym's ``responses_create_params``), an experiment (a LangSmith project whose
reference dataset is that dataset, its metadata holding the masked config, the aggregate
metrics and ``coverage``: the ``coverage/*`` figures the trackers log), one trace per rollout from
the span model (``gym_artifacts.run.rollout_spans``): a root ``chain`` run (inputs: the request
without null fields, conversation first; outputs: the response; the rollout's place and other
fields as metadata; linked to its task's example), an ``llm`` run per model turn (messages,
``usage_metadata``) and a ``tool`` run per function call; a failed rollout is a root run with its
failure as ``error``; each numeric verdict (``reward`` first) is feedback on the root run.

Exactly once: dataset and experiment are found by name before any is created; example, run and
feedback ids derive from the dataset's and experiment's ids and the run's identity (and task,
rollout, span, verdict), so a retry sends the same ids, and another destination on the same server (another
dataset) its own and LangSmith keeps the first copy (it answers a repeated id with 409, which the client and
this exporter treat as "already there").

Live (as NeMo Gym main's LangSmith exporter, opened from its ``langsmith_*`` keys by
``gym_artifacts.nemo_gym``): setup finds or creates the dataset and creates (upserts) the
experiment; each ``export_rollouts`` batch becomes examples, runs and feedback at once, with ids
from the experiment and the rollout's row, so the export that completes the live run
(``_certify``) sends only what is missing; teardown sets the experiment's end time.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr

from gym_artifacts.plugin import (
    AGENT,
    LLM,
    TOOL,
    ExporterConfig,
    ExportPlan,
    GymArtifactsError,
    LiveExporter,
    LiveTraces,
    LiveTracing,
    RolloutTrace,
    RunArtifacts,
    RunPayload,
    RunStatus,
    Sent,
    dataset_service_destination,
    json_safe,
    made_progress,
    run_times,
)

from ._rollouts import as_object, masked, payload_traces

BATCH = 100  # traces a flush
RUN_TYPES = {AGENT: "chain", LLM: "llm", TOOL: "tool"}  # LangSmith run types of the span kinds


class LangsmithSettings(ExporterConfig):
    """Settings of ``exporters.langsmith``."""

    api_url: str = "https://api.smith.langchain.com"
    api_key: SecretStr | None = None
    # Default names: ``<run name>-<identity>`` for the dataset, the same plus ``-rollouts`` for
    # the experiment.
    dataset_name: str | None = None
    experiment_name: str | None = None
    # The workspace (LangSmith's ``X-Tenant-Id`` header) for a key that reaches several; None:
    # the client's own choice (LANGSMITH_WORKSPACE_ID, else the key's default workspace).
    workspace_id: str | None = None
    request_timeout: float = Field(default=60.0, gt=0, le=3600)
    # The whole export (every request and retry) ends FAILED after this many seconds, even
    # against a server that never answers or drips a byte at a time (gym_artifacts.core.watchdog).
    export_deadline: float = Field(default=600.0, gt=0, le=24 * 3600)


class IngestFailed(GymArtifactsError):
    """LangSmith refused a batch of runs (the client reports it to a callback, not by raising)."""


def _default_name(run: RunArtifacts, plan: ExportPlan) -> str:
    return f"{run.name}-{plan.run_identity.split(':')[-1][:12]}"


def _live_namespace(dataset_id: Any, project_id: Any) -> uuid.UUID:
    """Where the ids of a live experiment's examples, runs and feedback come from."""
    return uuid.uuid5(uuid.NAMESPACE_URL, f"gym-artifacts/langsmith/live/{dataset_id}/{project_id}")


class LangsmithExporter(LiveTracing, LiveExporter):
    """LangSmith datasets, experiments, runs and feedback through the ``langsmith`` client."""

    name = "langsmith"
    config_model = LangsmithSettings
    sdk_module = "langsmith"
    settings: LangsmithSettings

    @classmethod
    def contract_settings(cls, folder: Path) -> dict[str, Any] | None:
        """None: LangSmith is a hosted service (tests/test_langsmith.py runs the real client
        against a local endpoint)."""
        return None

    @classmethod
    def destination_for(cls, settings: Any) -> dict[str, Any]:
        """The api_url without credentials, the dataset and experiment names, and the workspace
        where one is named (left out otherwise, so earlier receipts keep their destination)."""
        where = dataset_service_destination(settings, "api_url")
        if settings.workspace_id:
            where["workspace_id"] = settings.workspace_id
        return where

    def export_deadline_s(self) -> float | None:
        return self.settings.export_deadline

    def server_url(self) -> str | None:
        return self.settings.api_url

    def expected_errors(self) -> tuple[type[BaseException], ...]:
        import requests
        from langsmith.utils import LangSmithError

        return (*super().expected_errors(), LangSmithError, requests.RequestException, ValueError)

    def _client(self, errors: list[BaseException]) -> Any:
        from langsmith import Client

        key = self.settings.api_key.get_secret_value() if self.settings.api_key else None
        return Client(
            api_url=self.settings.api_url,
            api_key=key,
            workspace_id=self.settings.workspace_id,
            timeout_ms=int(self.settings.request_timeout * 1000),
            auto_batch_tracing=False,
            # Plain JSON batch ingestion (``POST /runs/batch``); asking /info is not needed.
            info={"version": "", "batch_ingest_config": {"use_multipart_endpoint": False}},
            tracing_error_callback=errors.append,
        )

    # -- live ----------------------------------------------------------------------------------
    def _setup(self) -> str:
        assert self.run is not None
        self._errors: list[BaseException] = []
        self._ls = client = self._client(self._errors)
        suffix = f"{self.run.name}-live-{uuid.uuid4().hex[:12]}"
        dataset_name = self.settings.dataset_name or suffix
        if client.has_dataset(dataset_name=dataset_name):
            dataset = client.read_dataset(dataset_name=dataset_name)
        else:
            description = f"Tasks of the eval run {self.run.name}"
            dataset = client.create_dataset(dataset_name, description=description)
        self._project_name = self.settings.experiment_name or f"{suffix}-rollouts"
        project = client.create_project(self._project_name, reference_dataset_id=dataset.id, upsert=True)
        self._dataset_id, self._project_id = dataset.id, project.id
        namespace = _live_namespace(dataset.id, project.id)
        errors = self._errors

        def send(traces: list[RolloutTrace]) -> None:
            errors.clear()  # a batch refused earlier was counted then; this one starts clean
            self._send_rollouts(
                client, iter(traces), dataset.id, project.id, self._project_name, namespace, errors
            )

        on_sent = self.live_progress
        self.live_traces = LiveTraces(send, str(namespace), self.secrets, on_sent=on_sent, batch=BATCH)
        return str(project.id)

    def _log_config(self, config: dict[str, Any]) -> None:
        self._ls.update_project(self._project_id, metadata={"config": json_safe(config)})

    def _log_metrics(self, metrics: dict[str, Any], step: int, timestamp: float) -> None:
        return None  # as NeMo Gym's: LangSmith holds rollouts and their verdicts, not step metrics

    def _log_rollouts(self, rollouts: list[Any]) -> None:
        self._log_rollouts_batch([rollouts])

    def _log_rollouts_batch(self, batches: list[list[Any]]) -> None:
        """Every queued call's rollouts as runs, examples and feedback, in batches (``LiveTraces``:
        backed off when LangSmith refuses or limits; what is not sent is the export's)."""
        self.trace_rollouts(batches)

    def _teardown(self, status: RunStatus) -> None:
        import datetime as dt

        client, self._ls = self._ls, None
        try:
            if self.live_traces is not None:
                self.live_traces.close()
            client.update_project(self._project_id, end_time=dt.datetime.now(dt.timezone.utc))
        finally:
            client.close()

    def _certify(self, run: RunArtifacts, plan: ExportPlan, live_run_id: str) -> Sent:
        """Send into the live experiment what it lacks: rows it never got (same ids: LangSmith
        keeps the first copy) and the run's metadata (aggregate metrics, coverage)."""
        from langsmith.utils import LangSmithNotFoundError

        from gym_artifacts.plugin import CannotCertify

        errors: list[BaseException] = []
        client = self._client(errors)
        try:
            project = client.read_project(project_id=live_run_id)
        except LangSmithNotFoundError as exc:
            raise CannotCertify(f"live experiment {live_run_id} is gone") from exc
        if project.reference_dataset_id is None:
            raise CannotCertify(f"live experiment {live_run_id} has no dataset")
        rows = 0
        payload = RunPayload.of(run, plan)
        if payload.sends_rollouts:
            namespace = _live_namespace(project.reference_dataset_id, project.id)
            times = run_times(run)
            traces = payload_traces(payload, str(namespace), times.start if times is not None else 0.0, plan)
            rows = self._send_rollouts(
                client, traces, project.reference_dataset_id, project.id, project.name, namespace, errors
            )
        metadata = {**(project.metadata or {}), **self._experiment_metadata(run, plan), "certified": True}
        client.update_project(project.id, metadata=metadata)
        return Sent(backend_run_id=str(project.id), rows=rows)

    def _mark_superseded(self, live_run_id: str, new_run_id: str) -> None:
        client = self._client([])
        project = client.read_project(project_id=live_run_id)
        metadata = {**(project.metadata or {}), "gym_artifacts.superseded_by": new_run_id}
        client.update_project(project.id, metadata=metadata)

    # -- post-run --------------------------------------------------------------------------------
    def _export(self, run: RunArtifacts, plan: ExportPlan) -> Sent:
        from langsmith.utils import LangSmithNotFoundError

        errors: list[BaseException] = []
        client = self._client(errors)
        name = _default_name(run, plan)
        dataset_name = self.settings.dataset_name or name
        # A named (shared) dataset: one experiment per run and dataset, so that another
        # destination (another dataset) never adds its runs to this one's experiment.
        shared = "" if self.settings.dataset_name is None else f"-{dataset_name}"
        project_name = self.settings.experiment_name or f"{name}{shared}-rollouts"
        if client.has_dataset(dataset_name=dataset_name):
            dataset = client.read_dataset(dataset_name=dataset_name)
        else:
            dataset = client.create_dataset(
                dataset_name,
                description=f"Tasks of the eval run {run.name}",
                metadata={"gym_artifacts.identity": plan.run_identity},
            )
        try:
            project = client.read_project(project_name=project_name)
        except LangSmithNotFoundError:
            project = client.create_project(
                project_name,
                reference_dataset_id=dataset.id,
                metadata=self._experiment_metadata(run, plan),
                upsert=True,
            )
        # LangSmith ids are global: ids of this run *in this dataset and experiment*, the same on a
        # retry (both are found by name), others in another destination on the same server.
        where = f"{dataset.id}/{project.id}/{plan.run_identity}"
        namespace = uuid.uuid5(uuid.NAMESPACE_URL, f"gym-artifacts/langsmith/{where}")
        rows = 0
        payload = RunPayload.of(run, plan)
        if payload.sends_rollouts:
            times = run_times(run)
            traces = payload_traces(payload, str(namespace), times.start if times is not None else 0.0, plan)
            rows = self._send_rollouts(
                client, traces, dataset.id, project.id, project_name, namespace, errors
            )
        return Sent(backend_run_id=str(project.id), rows=rows)

    @staticmethod
    def _experiment_metadata(run: RunArtifacts, plan: ExportPlan) -> dict[str, Any]:
        metadata: dict[str, Any] = {
            "gym_artifacts.identity": plan.run_identity,
            "config": plan.config,
            **RunPayload.of(run, plan).experiment_metadata,
        }
        return masked(json_safe(metadata), plan.secrets)

    def _send_rollouts(
        self,
        client: Any,
        traces: Iterator[RolloutTrace],
        dataset_id: Any,
        session_id: Any,
        project_name: str,
        namespace: uuid.UUID,
        errors: list[BaseException],
    ) -> int:
        """Each trace's runs (root ``chain``, ``llm`` per model turn, ``tool`` per call), its
        task's example and its feedback, a batch of traces at a time; returns the scored rows."""
        seen_tasks: set[str] = set()
        examples: list[dict[str, Any]] = []
        runs: list[dict[str, Any]] = []
        verdicts: list[tuple[str, RolloutTrace]] = []
        rows = 0

        def flush() -> None:
            if examples:
                ids = [e["id"] for e in examples]
                present = {str(e.id) for e in client.list_examples(dataset_id=dataset_id, example_ids=ids)}
                missing = [e for e in examples if e["id"] not in present]
                if missing:  # an earlier attempt may have sent some: LangSmith refuses a repeated id
                    client.create_examples(dataset_id=dataset_id, examples=missing)
                examples.clear()
            if runs:
                client.batch_ingest_runs(create=list(runs))
                runs.clear()
                if errors:
                    raise IngestFailed(f"LangSmith refused runs: {errors[0]}")
            for run_id, trace in verdicts:
                self._feedback(client, run_id, trace, session_id)
            verdicts.clear()
            made_progress()  # the export's deadline bounds a stalled server, not the batches

        for trace in traces:
            rows += not trace.failed
            task = trace.tags["task"]
            example_id = str(uuid.uuid5(namespace, f"example/{task}"))
            if task not in seen_tasks and trace.root.inputs is not None:
                seen_tasks.add(task)
                inputs = as_object(trace.root.inputs, "responses_create_params")
                examples.append({"id": example_id, "inputs": inputs, "metadata": {"task": task}})
            trace_runs = self._run_dicts(trace, example_id, project_name)
            runs.extend(trace_runs)
            verdicts.append((trace_runs[0]["id"], trace))
            if len(verdicts) == BATCH:
                flush()
        flush()
        return rows

    @staticmethod
    def _run_dicts(trace: RolloutTrace, example_id: str, project_name: str) -> list[dict[str, Any]]:
        """LangSmith runs of one trace, root first: ids from the trace's (the root's id is the
        trace id), dotted order from start times, token usage on the ``llm`` runs."""
        root_id = uuid.UUID(hex=trace.trace_id)
        ids = {trace.root.span_id: root_id}
        dotted: dict[str, str] = {}
        out = []
        for span in trace.spans:
            run_id = ids.setdefault(span.span_id, uuid.uuid5(root_id, span.span_id))
            start = dt.datetime.fromtimestamp(span.start_ns / 1e9, dt.timezone.utc)
            end = dt.datetime.fromtimestamp(span.end_ns / 1e9, dt.timezone.utc)
            own = f"{start.strftime('%Y%m%dT%H%M%S%fZ')}{run_id}"
            dotted[span.span_id] = own if span.parent_id is None else f"{dotted[span.parent_id]}.{own}"
            outputs = as_object(span.outputs, "output") if span.outputs is not None else None
            metadata: dict[str, Any] = dict(span.attributes)
            if span.usage and outputs is not None and span.kind == LLM:  # LangSmith sums the llm runs'
                outputs = {**outputs, "usage_metadata": usage_metadata(span.usage)}
            if span.model:
                metadata["ls_model_name"] = span.model
            run: dict[str, Any] = {
                "id": str(run_id),
                "trace_id": str(root_id),
                "dotted_order": dotted[span.span_id],
                "name": span.name,
                "run_type": RUN_TYPES.get(span.kind, "chain"),
                "inputs": as_object(span.inputs, "input") if span.inputs is not None else {},
                "outputs": outputs,
                "start_time": start,
                "end_time": end,
                "session_name": project_name,
                "extra": {"metadata": json_safe(metadata)},
            }
            if span.error is not None:
                run["error"] = span.error
            if span.parent_id is None:
                run["reference_example_id"] = example_id
                run["extra"]["metadata"].update(trace.feedback)
                run["tags"] = [f"{k}:{v}" for k, v in trace.tags.items()]
            else:
                run["parent_run_id"] = str(ids[span.parent_id])
            out.append(run)
        return out

    @staticmethod
    def _feedback(client: Any, run_id: str, trace: RolloutTrace, session_id: Any) -> None:
        from langsmith.utils import LangSmithConflictError

        for key, score in trace.feedback.items():
            with contextlib.suppress(LangSmithConflictError):  # an earlier attempt sent this id
                client.create_feedback(
                    run_id,
                    key,
                    score=score,
                    trace_id=run_id,
                    session_id=session_id,
                    feedback_id=uuid.uuid5(uuid.UUID(run_id), key),
                )


def usage_metadata(usage: dict[str, int]) -> dict[str, Any]:
    """A model call's tokens as LangSmith's ``usage_metadata`` (cache-read and reasoning counts
    under its ``input_token_details`` / ``output_token_details``)."""
    keys = ("input_tokens", "output_tokens", "total_tokens")
    out: dict[str, Any] = {k: usage[k] for k in keys if k in usage}
    if "cached_tokens" in usage:
        out["input_token_details"] = {"cache_read": usage["cached_tokens"]}
    if "reasoning_tokens" in usage:
        out["output_token_details"] = {"reasoning": usage["reasoning_tokens"]}
    return out

