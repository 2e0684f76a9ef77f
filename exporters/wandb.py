"""The W&B backend: live runs and post-run exports, online or offline, on explicit run ids.

The API key is given to this exporter's runs only (``wandb.Settings``), never written to
``os.environ`` or to wandb's module state. Live runs use the marker's id with
``resume="allow"``; post-run exports use an id derived from the run's identity, so a retried
export lands in the same W&B run. Steps only grow: a resumed run continues after the last step
it (or the journal) holds, and final aggregate metrics go to the summary, not to a fake step.
Rollouts become ``wandb.Table`` objects within W&B's row limits (real columns when every row
has the same keys, one JSON column otherwise), and all of them go into a table artifact, so
none is silently truncated. The SDK is imported only when a run is opened or exported.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr

from gym_artifacts.plugin import (
    NVML_SERIES,
    NVML_SUMMARY,
    RECORDING,
    ComparisonPayload,
    ExporterConfig,
    ExportPlan,
    GymArtifactsError,
    LevelTable,
    LiveExporter,
    PayloadArtifact,
    RolloutSpool,
    RunArtifacts,
    RunPayload,
    RunStatus,
    Sent,
    Trajectory,
    atomic_write_bytes,
    canonical_json,
    credential_free_uri,
    flatten,
    json_safe,
    read_json,
    resolved_path,
    run_times,
    saved_config_run_name,
    write_table_jsonl,
)

from ._headline import headline
from ._nemo_gym_shapes import ROLLOUT_COLUMN, WANDB_TABLE_KEY, file_documents, rollout_documents
from ._rollouts import READABLE_COLUMNS, payload_table_rows, readable_row, table_rows
from ._wandb_folder import SdkFolder, is_utf8

logger = logging.getLogger(__name__)
_SCALARS = (str, int, float, bool, type(None))


class WandbSettings(ExporterConfig):
    """Settings of ``exporters.wandb``."""

    project: str = "gym-evals"
    entity: str | None = None
    name: str | None = None
    group: str | None = None
    tags: list[str] = Field(default_factory=list)
    # None: the mode ``wandb.init`` takes when given none (WANDB_MODE, W&B's settings file), as
    # under NeMo Gym's own exporter; the NeMo Gym drop-in sets None. Default: offline.
    mode: Literal["online", "offline", "disabled"] | None = "offline"
    api_key: SecretStr | None = None
    dir: Path | None = None
    base_url: str | None = None
    init_timeout: float = Field(default=60.0, gt=0, le=600)
    finish_timeout: float = Field(default=60.0, gt=0, le=3600)
    # Online: the whole post-run export ends FAILED after this many seconds, even against a
    # server that never answers or drips a byte at a time (gym_artifacts.core.watchdog).
    export_deadline: float = Field(default=600.0, gt=0, le=24 * 3600)
    table_max_rows: int = Field(default=10_000, ge=1, le=200_000)
    artifact_part_rows: int = Field(default=100_000, ge=1, le=200_000)


WANDB_CLOUD = "https://api.wandb.ai"
# Beside the offline runs (``<dir>/wandb/``): which run id holds which run identity, so that a
# copy of a run exported later finds its run instead of making another.
OFFLINE_INDEX = ".gym-artifacts-runs"


def sdk_mode() -> Literal["online", "offline", "disabled"]:
    """The mode the W&B SDK takes when ``wandb.init`` is given none: its settings file (``wandb
    offline``), then its ``WANDB_*`` variables (``WANDB_MODE=offline``/``dryrun``: offline,
    ``disabled``: disabled), read with the SDK's own loaders, without starting anything."""
    from wandb.sdk.wandb_settings import Settings

    settings = Settings()
    config_dir = Path(os.environ.get("WANDB_CONFIG_DIR") or "~/.config/wandb").expanduser()
    settings.settings_system = str(config_dir / "settings")
    with contextlib.suppress(Exception):  # an unreadable settings file: the SDK ignores it too
        settings.update_from_system_settings()
    settings.update_from_env_vars(dict(os.environ))
    if settings._noop:
        return "disabled"
    return "offline" if settings._offline else "online"


def effective_mode(settings: WandbSettings) -> Literal["online", "offline", "disabled"]:
    """``settings.mode``, or the SDK's own choice where it is None."""
    return settings.mode if settings.mode is not None else sdk_mode()


def post_run_id(run_identity: str) -> str:
    """A W&B run id derived from the run's identity (the same run always gets the same id)."""
    return "ga" + run_identity.split(":")[-1][:30]


def _remove_earlier_offline_folders(folder: Path, run_id: str) -> None:
    """Once ``folder`` holds the complete offline run, remove an earlier export's folders of the
    same run id (a retry after a lost receipt): one folder per run, so ``wandb sync`` uploads the
    run once instead of replaying the same steps into it a second time."""
    for earlier in offline_folders(folder.parent, run_id):
        if earlier != folder and earlier.is_dir() and not earlier.is_symlink():
            shutil.rmtree(earlier, ignore_errors=True)


def offline_folders(wandb_dpath: Path, run_id: str) -> list[Path]:
    """W&B's offline folders of ``run_id``: ``offline-run-<time>-<id>``, and ``...-<id>-<n>`` when
    two runs of that id started within the same second."""
    pattern = re.compile(rf"offline-run-\d{{8}}_\d{{6}}-{re.escape(run_id)}(-\d+)?")
    return sorted(p for p in wandb_dpath.glob(f"offline-run-*-{run_id}*") if pattern.fullmatch(p.name))


def rollout_table_parts(
    rows: Iterator[Any], part_rows: int, secrets: frozenset[str] = frozenset()
) -> Iterator[tuple[list[str], list[list[Any]]]]:
    """Rollouts in parts of at most ``part_rows`` (``table_layout`` each)."""
    part: list[Any] = []
    for row in rows:
        part.append(row)
        if len(part) == part_rows:
            yield table_layout(part, secrets)
            part = []
    if part:
        yield table_layout(part, secrets)


def table_layout(rows: list[Any], secrets: frozenset[str] = frozenset()) -> tuple[list[str], list[list[Any]]]:
    """Columns and cells for one table: NeMo Gym rollouts (``Trajectory`` rows) as
    ``READABLE_COLUMNS`` (prompt, answer, tool calls, tokens, reward, failure); other records as
    real columns when they agree, else one JSON column."""
    if rows and all(isinstance(r, Trajectory) for r in rows):
        return list(READABLE_COLUMNS), [readable_row(r, secrets) for r in rows]
    if rows and all(isinstance(r, dict) for r in rows):
        keys = list(rows[0].keys())
        if all(list(r.keys()) == keys for r in rows) and keys:
            cells = [
                [v if isinstance(v, _SCALARS) else json.dumps(json_safe(v)) for v in r.values()] for r in rows
            ]
            return keys, cells
    return ["rollout"], [[json.dumps(json_safe(r))] for r in rows]


class WandbExporter(LiveExporter):
    """Weights & Biases, online or offline (synced later with ``wandb sync``)."""

    name = "wandb"
    config_model = WandbSettings
    sdk_module = "wandb"

    @classmethod
    def contract_settings(cls, folder: Path) -> dict[str, Any]:
        """Offline runs under ``folder``, in a project named after it (the project, not the
        folder, is the destination: offline runs are synced there)."""
        return {"mode": "offline", "dir": str(folder), "project": f"contract-{folder.name}"}

    settings: WandbSettings

    def __init__(self, settings: WandbSettings) -> None:
        super().__init__(settings)
        self._wb_run: Any = None
        self._last_step = -1
        self._skipped_steps = 0
        self._rollouts = RolloutSpool(prefix="gym-artifacts-wandb-")
        self._sdk_folders: dict[int, SdkFolder] = {}  # an open W&B run (by id()) -> its folder

    @classmethod
    def destination_for(cls, settings: WandbSettings) -> dict[str, Any]:
        """Server, entity and project (and the mode: an offline run is not on the server).

        An offline run lands in a folder (``dir``, else ``WANDB_DIR``, else the working folder, as
        ``wandb.init`` picks it): that resolved folder is part of where it went, so a second
        folder is a second destination while another spelling of the same one is not.
        """
        s = settings
        where: dict[str, Any] = {
            # as the SDK picks the server: the setting, else WANDB_BASE_URL, else W&B's cloud
            "base_url": credential_free_uri(s.base_url or os.environ.get("WANDB_BASE_URL") or WANDB_CLOUD),
            "entity": s.entity,
            "project": s.project,
            "mode": effective_mode(s),
        }
        if where["mode"] == "offline":
            where["dir"] = resolved_path(s.dir or os.environ.get("WANDB_DIR") or os.getcwd())
        return where

    def export_deadline_s(self) -> float | None:
        """``export_deadline`` online; an offline run is written to a local folder."""
        return self.settings.export_deadline if self.mode == "online" else None

    @property
    def mode(self) -> Literal["online", "offline", "disabled"]:
        """Where this exporter's runs go: its ``mode`` setting, else the SDK's choice."""
        return effective_mode(self.settings)

    def server_url(self) -> str | None:
        """The W&B server, as the SDK picks it (its own telemetry thread also talks to it)."""
        return self.settings.base_url or os.environ.get("WANDB_BASE_URL") or WANDB_CLOUD

    def _abandon(self) -> None:
        """W&B sends from its service process (wandb-core), which keeps trying a server that
        does not answer for minutes (and the interpreter's exit waits for it): tear this
        process's W&B session down, and stop the service if it still has not ended after a
        moment. W&B runs still open in this process end with it."""
        import wandb

        with contextlib.suppress(Exception):  # W&B's telemetry would probe that server at exit
            from wandb.analytics.opentelemetry import opentelemetry_proxy as telemetry

            telemetry.disable()
            proxy = telemetry._singleton_telemetry_proxy
            if proxy is not None and proxy._server_supports_proxy is None:
                proxy._server_supports_proxy = False  # never probed: send it nothing
        setup = getattr(getattr(wandb, "sdk", None), "wandb_setup", None)
        connection = getattr(getattr(setup, "_singleton", None), "_connection", None)
        process = getattr(getattr(connection, "_proc", None), "_process", None)
        ending = threading.Thread(target=wandb.teardown, kwargs={"exit_code": 1}, daemon=True)
        ending.start()
        ending.join(1.0)
        if ending.is_alive() and process is not None:
            logger.info("wandb: stopping its service process (pid %s): export abandoned", process.pid)
            process.kill()
            ending.join(5.0)

    def expected_errors(self) -> tuple[type[BaseException], ...]:
        import wandb

        return (*super().expected_errors(), wandb.Error, ValueError, TimeoutError)

    # -- SDK plumbing ---------------------------------------------------------------------------
    def _sdk_options(self) -> dict[str, Any]:
        """``wandb.Settings`` of this exporter's runs (the API key for them only)."""
        s = self.settings
        options: dict[str, Any] = {
            "mode": self.mode,
            "init_timeout": s.init_timeout,
            "silent": True,
            "console": "off",
            "x_disable_stats": True,
            "reinit": "create_new",
        }
        if s.api_key is not None:
            options["api_key"] = s.api_key.get_secret_value()
        if s.base_url:
            options["base_url"] = s.base_url
        return options

    def _sdk_folder(self) -> SdkFolder | None:
        """The folder given to ``wandb.init``: the ``dir`` setting (made), else none (the SDK's
        own choice: ``WANDB_DIR``, else the working folder) unless that one's name is not UTF-8."""
        if self.settings.dir is not None:
            folder = self.settings.dir.expanduser()  # "~/wb" is a folder at home
            folder.mkdir(parents=True, exist_ok=True)
            return SdkFolder(folder)
        chosen = Path(os.environ.get("WANDB_DIR") or os.getcwd())
        return None if is_utf8(chosen) else SdkFolder(chosen)

    def _init(
        self, run_id: str, run_name: str, config: dict[str, Any] | None, job_type: str | None = None
    ) -> Any:
        import wandb

        s = self.settings
        where = self._sdk_folder()
        try:
            wb_run = wandb.init(
                project=s.project,
                entity=s.entity,
                name=s.name or run_name,
                group=s.group,
                # no tags: the SDK's (WANDB_TAGS)
                tags=[*s.tags, job_type] if job_type else (list(s.tags) or None),
                id=run_id,
                resume="allow",
                job_type=job_type,
                dir=where.path if where is not None else None,
                config=config,
                settings=wandb.Settings(**self._sdk_options()),
            )
        except BaseException:
            if where is not None:
                where.close()
            raise
        if where is not None:
            self._sdk_folders[id(wb_run)] = where  # closed once the run has finished (_finish)
        return wb_run

    def _finish(self, wb_run: Any, exit_code: int) -> None:
        """``finish()`` with a bounded wait: a hung finish never holds the exporter forever."""
        done = threading.Event()
        errors: list[BaseException] = []

        def finish() -> None:
            try:
                wb_run.finish(exit_code=exit_code)
            except BaseException as exc:
                errors.append(exc)
            finally:
                done.set()

        threading.Thread(target=finish, name="wandb-finish", daemon=True).start()
        try:
            if not done.wait(self.settings.finish_timeout):
                raise TimeoutError(f"wandb finish() did not return within {self.settings.finish_timeout}s")
        finally:
            where = self._sdk_folders.pop(id(wb_run), None)
            if where is not None and done.is_set():  # a finish still running still writes through it
                where.close()
        if errors:
            raise errors[0]

    def _run_folder(self, wb_run: Any) -> Path:
        """The folder of an open W&B run (``<dir>/wandb/offline-run-...``) under its real name."""
        where = self._sdk_folders.get(id(wb_run))
        return where.real(wb_run.dir).parent if where is not None else Path(wb_run.dir).parent

    # -- live ----------------------------------------------------------------------------------
    def _setup(self) -> str:
        assert self.run is not None
        run_id = self.resume_run_id or uuid.uuid4().hex[:12]
        self._wb_run = self._init(run_id, saved_config_run_name(self.run, self.name), None)
        self._last_step = -1
        if self.resume_run_id is not None:
            journaled = self.previous_last_step()
            online_next = int(getattr(self._wb_run, "step", 0) or 0)
            self._last_step = max(online_next - 1, journaled if journaled is not None else -1)
        return str(self._wb_run.id)

    def _log_config(self, config: dict[str, Any]) -> None:
        self._wb_run.config.update(json_safe(config), allow_val_change=True)

    def _log_metrics(self, metrics: dict[str, Any], step: int, timestamp: float) -> None:
        if step <= self._last_step:
            self._skipped_steps += 1
            if self._skipped_steps == 1:
                logger.warning(
                    "wandb: step %d is not after %d; W&B steps only grow, skipped", step, self._last_step
                )
            return
        self._wb_run.log(flatten(dict(metrics)), step=step)
        self._last_step = step

    def _log_rollouts(self, rollouts: list[Any]) -> None:
        # on disk until teardown sends them once: the readable table, its artifact and NeMo Gym's
        # ``Rollouts`` table (one of each a run, never one a call: W&B makes an artifact per logged
        # table)
        self._rollouts.append(rollouts)

    @staticmethod
    def _log_nemo_gym_table(wb_run: Any, documents: Iterator[str]) -> int:
        """Rollouts as NeMo Gym's exporter logs them: a ``Rollouts`` table, one JSON document
        per row in column ``Rollout``, logged at the current step (``commit=False``: W&B's step
        does not move, so the eval's metric steps still grow)."""
        import wandb

        rows = [[doc] for doc in documents]
        if rows:
            try:
                wb_run.log({WANDB_TABLE_KEY: wandb.Table(columns=[ROLLOUT_COLUMN], data=rows)}, commit=False)
            except Exception as exc:  # the rollouts artifact holds every row anyway
                logger.warning("wandb: NeMo Gym's %r table not logged: %s", WANDB_TABLE_KEY, exc)
                return 0
        return len(rows)

    def _teardown(self, status: RunStatus) -> None:
        wb_run, self._wb_run = self._wb_run, None
        try:
            if self._rollouts.rows:
                raw = self._rollouts.finish()
                self._log_nemo_gym_table(wb_run, rollout_documents(self._rollouts.records(), self.secrets))
                rows = table_rows(self._rollouts.records())
                self._send_rollouts(wb_run, rows, f"live-rollouts-{wb_run.id}", raw, self.secrets)
        finally:
            try:
                self._finish(wb_run, 0 if status is RunStatus.FINISHED else 1)
            finally:
                self._rollouts.discard()

    def _release_reopened(self) -> None:
        wb_run, self._wb_run = self._wb_run, None
        self._rollouts.discard()
        self._finish(wb_run, 0)

    # -- post-run --------------------------------------------------------------------------------
    def _export(self, run: RunArtifacts, plan: ExportPlan) -> Sent:
        holder = self._offline_run_of(plan.run_identity)
        if holder is not None:  # a copy of this run, or its completed live run, is here already
            return Sent(backend_run_id=holder, note=f"already in W&B run {holder} (it holds this identity)")
        return self._write_run(post_run_id(plan.run_identity), run, plan, certified=False)

    def _certify(self, run: RunArtifacts, plan: ExportPlan, live_run_id: str) -> Sent:
        """Complete the live run under its own id. Offline, the run is written whole (every
        journal step, whatever the live run lost) into one folder that replaces the live one
        (``wandb sync`` then uploads one folder per run id); online, W&B's history only grows: the
        journal's steps after the run's last one are added, with the summary and artifacts."""
        return self._write_run(live_run_id, run, plan, certified=True)

    def _write_run(self, run_id: str, run: RunArtifacts, plan: ExportPlan, *, certified: bool) -> Sent:
        """Open (or resume) W&B run ``run_id`` and send the run into it; offline, the run's earlier
        folders are removed once this one is whole, and the identity recorded (``_offline_run_of``)."""
        offline = self.mode == "offline"
        whole = offline or not certified  # the journal from its first step
        config = json_safe(plan.config) if plan.config and whole else None
        wb_run = self._init(run_id, saved_config_run_name(run, self.name), config)
        folder = self._run_folder(wb_run) if offline else None
        try:
            first_new_step = 0 if offline else int(getattr(wb_run, "step", 0) or 0)
            rows, sent = self._send_run(wb_run, run, plan, first_new_step, rollouts_table=whole)
            wb_run.summary["gym_artifacts/identity"] = plan.run_identity
            if certified:
                wb_run.summary["gym_artifacts/certified"] = True
        except BaseException:
            self._finish(wb_run, 1)
            raise
        self._finish(wb_run, 0)
        if folder is not None:
            _remove_earlier_offline_folders(folder, str(wb_run.id))
            self._record_offline_run(plan.run_identity, str(wb_run.id))
        return Sent(backend_run_id=str(wb_run.id), rows=rows, bytes=sent)

    def _export_comparison(self, comparison: ComparisonPayload) -> Sent:
        """A comparison of runs into one run (job type ``compare``): its tables (``compare/results``,
        ``compare/tasks``...) and the verdict in its summary. The run id derives from the
        comparison's identity: a retry resumes the same run."""
        import wandb

        run_id = "gc" + comparison.identity.split(":")[-1][:30]
        config = {
            "base_identity": comparison.base_identity,
            "comparison": comparison.identity,
            "candidate_identities": list(comparison.candidate_identities),
            **comparison.settings,
        }
        wb_run = self._init(run_id, comparison.name, config, job_type="compare")
        rows = 0
        try:
            tables = {}
            for name, (columns, data) in comparison.tables.items():
                kept = data[: self.settings.table_max_rows]
                tables[f"compare/{name.removeprefix('compare_')}"] = wandb.Table(columns=columns, data=kept)
                rows += len(kept)
            wb_run.log(tables)
            summary: dict[str, Any] = {"compare/verdict": comparison.note}
            if comparison.verdict is not None:
                summary["compare/gate"] = comparison.verdict
            wb_run.summary.update(summary)
        except BaseException:
            self._finish(wb_run, 1)
            raise
        self._finish(wb_run, 0)
        return Sent(run_id, rows=rows)

    def _offline_index(self) -> Path | None:
        """Offline: where this destination records which run id holds which run identity."""
        if self.mode != "offline":
            return None
        return Path(self.destination()["dir"]) / "wandb" / OFFLINE_INDEX

    def _record_offline_run(self, run_identity: str, run_id: str) -> None:
        index = self._offline_index()
        if index is None:
            return
        try:
            index.mkdir(parents=True, exist_ok=True)
            entry = index / f"{post_run_id(run_identity)}.json"
            atomic_write_bytes(entry, canonical_json({"run_id": run_id}))
        except OSError as exc:  # the run is whole; only a later copy's export would not find it
            logger.warning("wandb: could not record run %s in %s: %s", run_id, index, exc)

    def _offline_run_of(self, run_identity: str) -> str | None:
        """Offline: the run id whose one folder holds ``run_identity`` complete (a copy of the run
        exported before, or its completed live run), if any."""
        index = self._offline_index()
        if index is None:
            return None
        try:  # read without blocking: the entry may be anything (a FIFO, a folder)
            recorded = read_json(index / f"{post_run_id(run_identity)}.json", "W&B offline index entry")
        except GymArtifactsError:  # missing, unreadable or not JSON: no run recorded
            return None
        run_id = recorded.get("run_id") if isinstance(recorded, dict) else None
        if isinstance(run_id, str) and offline_folders(index.parent, run_id):
            return run_id
        return None

    def _mark_superseded(self, live_run_id: str, new_run_id: str) -> None:
        if self.mode != "online":
            logger.info(
                "wandb: offline live run %s cannot be marked superseded by %s", live_run_id, new_run_id
            )
            return
        import wandb

        api = wandb.Api(api_key=self.settings.api_key.get_secret_value() if self.settings.api_key else None)
        entity = self.settings.entity or api.default_entity
        live = api.run(f"{entity}/{self.settings.project}/{live_run_id}")
        live.tags = [*live.tags, f"superseded-by:{new_run_id}"]
        live.update()

    def _send_run(
        self, wb_run: Any, run: RunArtifacts, plan: ExportPlan, first_new_step: int, *, rollouts_table: bool
    ) -> tuple[int, int]:
        """Journal steps from ``first_new_step``, summary, tables, media and artifacts; NeMo Gym's
        ``Rollouts`` table when ``rollouts_table`` (a live run online logged it itself)."""
        import wandb

        payload = RunPayload.of(run, plan)
        sent = 0
        for entry in payload.journal():
            if entry.step is None or entry.step < first_new_step:
                continue
            wb_run.log(flatten(dict(entry.metrics)), step=entry.step)
        summary: dict[str, Any] = payload.values
        if payload.coverage is not None:
            summary["coverage/text"] = payload.coverage.text()
        acceptance = payload.acceptance
        if acceptance is not None:
            summary["acceptance/planned_rows"] = acceptance.planned_rows
            summary["acceptance/omitted_rows"] = acceptance.omitted_rows
            summary["acceptance/reason"] = acceptance.reason
        times = run_times(run)  # W&B's API sets a run's start itself: the eval's times go here
        if times is not None:
            summary.update(
                {"eval/start_time": times.iso(times.start), "eval/end_time": times.iso(times.end),
                 "eval/duration_s": times.end - times.start, "eval/times_from": times.source}
            )  # fmt: skip
        figures, reason = payload.nvml_summary
        for key, value in figures.items():
            summary[f"system/{key}"] = value
        if reason is not None:
            summary["system/nvml"] = reason
        wb_run.summary.update(summary)
        wb_run.notes = headline(payload)  # the run's first line in W&B's UI
        sent += self._send_tables(wb_run, payload.tables)
        if payload.sidecars:
            artifact = wandb.Artifact(f"nemo-gym-{wb_run.id}", type="nemo-gym")
            for item in payload.sidecars:
                sent += self._add_file(artifact, item)
            wb_run.log_artifact(artifact)
        rows = 0
        with payload.rollouts_file() as complete:
            if complete is not None:
                records = payload_table_rows(payload)  # every planned rollout, failed ones too
                name = f"rollouts-{wb_run.id}"
                self._send_rollouts(wb_run, records, name, complete, payload.secrets)
                rows = payload.rollout_rows  # the run's rollouts (the table adds the failed ones)
                sent += complete.stat().st_size
                if rollouts_table and rows <= self.settings.table_max_rows:
                    self._log_nemo_gym_table(wb_run, file_documents(complete, payload.secrets))
        for key, value in payload.omitted_partial_line.items():
            wb_run.summary[f"rollouts/{key}"] = value
        artifacts = {item.name: item for item in payload.runtime_artifacts}
        recording = artifacts.get(RECORDING)
        if recording is not None:
            wb_run.summary["recording"] = wandb.Video(str(recording.source), format="mp4")
        groups = {
            "profile": [n for n in artifacts if n.startswith("profile")],
            "nvml": [n for n in artifacts if n in (NVML_SERIES, NVML_SUMMARY)],
            "recording": [n for n in artifacts if n == RECORDING],
        }
        grouped = {n for names in groups.values() for n in names}
        groups["runtime"] = [n for n in artifacts if n not in grouped]
        for kind, names in groups.items():
            if not names:
                continue
            artifact = wandb.Artifact(f"{kind}-{wb_run.id}", type=kind)
            for name in names:
                sent += self._add_file(artifact, artifacts[name])
            wb_run.log_artifact(artifact)
        return rows, sent

    @staticmethod
    def _add_file(artifact: Any, item: PayloadArtifact) -> int:
        """One run file into an artifact under its payload name: its masked bytes, or the file."""
        if isinstance(item.content, bytes):
            with artifact.new_file(item.name, mode="wb") as fh:
                fh.write(item.content)
        else:
            artifact.add_file(str(item.content), name=item.name)
        return item.size

    def _send_tables(self, wb_run: Any, tables: list[LevelTable]) -> int:
        """The per-task and per-repeat levels as ``wandb.Table`` objects in one table artifact;
        each also in the summary (``tables/<level>``) when it fits W&B's row limit."""
        import wandb

        if not tables:
            return 0
        artifact = wandb.Artifact(f"levels-{wb_run.id}", type="aggregate-levels")
        sent = 0
        for table in tables:
            rows = list(table.rows)  # a wandb.Table holds its rows in memory: W&B's own limit
            wb_table = wandb.Table(columns=table.columns, data=rows)
            artifact.add(wb_table, table.name)
            if len(rows) <= self.settings.table_max_rows:
                wb_run.summary[f"tables/{table.name}"] = wb_table
            sent += write_table_jsonl(table, lambda _: None)
        wb_run.log_artifact(artifact)
        return sent

    def _send_rollouts(
        self, wb_run: Any, records: Iterator[Any], artifact_name: str, raw: Path | None = None,
        secrets: frozenset[str] = frozenset(),
    ) -> int:  # fmt: skip
        """Every rollout: a summary table when they fit W&B's row limit, and a table artifact."""
        import wandb

        artifact = wandb.Artifact(artifact_name, type="rollouts")
        if raw is not None:
            artifact.add_file(str(raw), name="rollouts.jsonl")
        total = 0
        parts = 0
        first: wandb.Table | None = None
        parts_of = rollout_table_parts(records, self.settings.artifact_part_rows, secrets)
        for columns, cells in parts_of:
            table = wandb.Table(columns=columns, data=cells)
            artifact.add(table, f"rollouts_part_{parts}")
            if parts == 0:
                first = table
            parts += 1
            total += len(cells)
        if parts == 0:
            return 0
        if parts == 1 and first is not None and total <= self.settings.table_max_rows:
            wb_run.summary["rollouts"] = first
        wb_run.summary["rollouts/rows"] = total
        wb_run.summary["rollouts/parts"] = parts
        wb_run.log_artifact(artifact)
        return total
