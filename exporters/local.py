"""The local backend: each run as a plain folder under ``<root>/<experiment>/<run id>/``.

The folder holds ``run.json`` (status, identities, coverage, times), ``config.json`` (masked),
``metrics.jsonl``, ``summary.json`` (the bounded aggregate values under NeMo Gym's names and
``coverage/*``, see ``gym_artifacts.run.aggregate``), ``tables/<level>.jsonl`` (the per-task and
per-repeat levels), ``nemo_gym/`` (NeMo Gym's sidecars: failures, materialized inputs, quality
summary, verdicts), ``rollouts.jsonl`` and ``artifacts/``. Post-run files are published
atomically as snapshot copies (never hard links: the run can never change the export, nor the
export the run); a post-run export's run id derives from the run's identity, so a retried export
rewrites the same folder. An export whose identity is hashed while it sends
(``hashes_while_sending``) writes into a hidden folder named by the run's send key (a digest of
its files' bytes) and renames it to the identity's folder once the identity is known; a retried
export of the same bytes finds that folder again. ``report.html`` is built off the export's
critical path: after the data, ``run.json`` and the receipt are published (``report: after``,
the default), in a detached process the export does not wait for (``background``), or not at all
(``off``; then ``gym-artifacts report`` builds it); a report that fails leaves
``report.html.error``, and one that fails or is killed never fails the export. Live runs append
one complete line per call and flush, so a killed process leaves every line it wrote readable; a
resumed run appends to the same files.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import uuid
from pathlib import Path
from typing import IO, Any

from pydantic import field_validator

from gym_artifacts.plugin import (
    RECORDING,
    CannotCertify,
    ConfigError,
    ExporterConfig,
    ExportPlan,
    LiveExporter,
    ReportWhen,
    RunArtifacts,
    RunPayload,
    RunStatus,
    Sent,
    atomic_write_bytes,
    atomic_write_json,
    atomic_writer,
    canonical_json,
    eval_times,
    journal_line,
    json_safe,
    open_regular,
    read_json,
    repair_partial_last_line,
    resolved_path,
    saved_config_run_name,
    snapshot_copy,
    sync_barrier,
    utc_now_iso,
    write_table_jsonl,
)

logger = logging.getLogger(__name__)
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
REPORT = "report.html"


NAME_CHARS = 100  # the readable part of a run folder's name; its unique suffix is never cut


def safe_name(text: str) -> str:
    """A single path component made of safe characters, its readable part at most ``NAME_CHARS``."""
    return safe_component(text)[:NAME_CHARS]


def safe_component(text: str) -> str:
    """``text`` as one path component of safe characters, never shortened: a run id that is one
    already (what ``run_folder_name`` makes) is returned as it is."""
    return _UNSAFE.sub("_", text).strip("._") or "run"


def run_folder_name(name: str, unique: str) -> str:
    """A run folder's name: the run's name made safe and shortened, then ``-<unique>`` whole (the
    identity's digest or a live run's random id). The name is shortened once, here, so a folder
    keeps its identity whatever its length or bytes: one folder per identity (ASCII, at most
    ``NAME_CHARS`` + 1 + ``len(unique)`` bytes)."""
    return f"{safe_name(name)}-{safe_component(unique)}"


class LocalSettings(ExporterConfig):
    """Settings of ``exporters.local``."""

    root: Path = Path("./gym-artifacts-runs")
    experiment: str = "default"
    # When report.html is built: after the receipt in the exporting process, in a detached
    # process the export does not wait for, or never (``gym-artifacts report`` builds it).
    report: ReportWhen = "after"

    @field_validator("root", mode="before")
    @classmethod
    def _root_not_empty(cls, value: Any) -> Any:
        """``Path("")`` is ``.``: an empty root would scatter runs in the working directory."""
        if value is None or (isinstance(value, (str, os.PathLike)) and not os.fspath(value).strip()):
            raise ValueError("must not be empty (a folder path, e.g. ./gym-artifacts-runs)")
        return value

    @field_validator("experiment")
    @classmethod
    def _plain_experiment(cls, value: str) -> str:
        if not value or value in (".", "..") or "/" in value or "\\" in value or "\0" in value:
            raise ValueError("must be a plain folder name (no '/', '..' or empty)")
        return value


def publish_folder(sending: Path, final: Path, run_identity: str) -> None:
    """Rename the finished ``sending`` folder to ``final``, durably. A finished folder already
    there with this identity (the same content from another folder's copy) is kept and
    ``sending`` dropped; any other (an attempt that died before its receipt) is replaced."""
    if final.exists():
        try:
            existing = read_json(final / "run.json")
        except Exception:  # unreadable or missing: not a finished run
            existing = None
        if (
            isinstance(existing, dict)
            and existing.get("status") == "FINISHED"
            and existing.get("run_identity") == run_identity
        ):
            shutil.rmtree(sending, ignore_errors=True)  # (gone: another export of it published it)
            return
        shutil.rmtree(final)  # a kill here leaves ``sending`` whole: the retry publishes it
    os.rename(sending, final)
    fd = os.open(final.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalExporter(LiveExporter):
    """Runs as folders on a local (or mounted) filesystem."""

    name = "local"
    config_model = LocalSettings
    hashes_while_sending = True

    @classmethod
    def contract_settings(cls, folder: Path) -> dict[str, Any]:
        return {"root": str(folder / "local")}

    settings: LocalSettings

    def __init__(self, settings: LocalSettings) -> None:
        super().__init__(settings)
        self._metrics_fh: IO[bytes] | None = None
        self._rollouts_fh: IO[bytes] | None = None
        self._status_before_reopen: str | None = None

    @classmethod
    def destination_for(cls, settings: LocalSettings) -> dict[str, Any]:
        """The resolved root folder and the experiment."""
        return {"root": resolved_path(settings.root), "experiment": settings.experiment}

    def backend_run_exists(self, backend_run_id: str) -> bool | None:
        """The run folder still has its ``run.json``."""
        return (self.run_dpath(backend_run_id) / "run.json").is_file()

    def experiment_dpath(self) -> Path:
        return self.settings.root.expanduser() / self.settings.experiment

    def run_dpath(self, run_id: str) -> Path:
        return self.experiment_dpath() / safe_component(run_id)

    # -- post-run ----------------------------------------------------------------------------
    def post_run_id(self, run: RunArtifacts, plan: ExportPlan) -> str:
        """Deterministic: the same run identity always names the same folder. A finished folder
        of this identity under another name (a copy of the run in another folder exported before,
        the export's identity lock ordering copies; or the live run an export completed) is that
        folder: one per content."""
        short = plan.run_identity.split(":")[-1][:16]
        holder = self.finished_holder(plan.run_identity)
        return holder or run_folder_name(saved_config_run_name(run, self.name), short)

    def finished_holder(self, run_identity: str) -> str | None:
        """The folder that holds ``run_identity`` FINISHED (a post-run export's, named by it, or a
        completed live run's), if any."""
        short = run_identity.split(":")[-1][:16]
        experiment = self.experiment_dpath()
        if not experiment.is_dir():
            return None
        for other in sorted(experiment.glob(f"*-{short}")) + sorted(experiment.glob("*-live-*")):
            try:
                finished = read_json(other / "run.json")
            except Exception:  # unreadable or missing: not a finished run
                continue
            if (
                isinstance(finished, dict)
                and finished.get("status") == "FINISHED"
                and finished.get("run_identity") == run_identity
            ):
                return other.name
        return None

    def _refuse_root_inside(self, run: RunArtifacts) -> None:
        """A root inside the run's folder would be copied into itself (and change the run while it
        is exported): refused before anything is written."""
        root = Path(os.path.realpath(self.settings.root.expanduser()))
        run_dpath = Path(os.path.realpath(run.artifacts_dpath))
        if root.is_relative_to(run_dpath):
            raise ConfigError(
                f"exporters.local.root {str(root)!r} is inside the run being exported ({run_dpath}): "
                "choose a root outside the run's folder"
            )

    def sending_dpath(self, run: RunArtifacts, plan: ExportPlan) -> Path | None:
        """Where an export of these bytes writes while its identity is hashed (None without a
        send key): hidden, named by the send key, so that a retry of the same bytes finds it."""
        if not plan.send_key:
            return None
        key = plan.send_key.split(":")[-1][:16]
        return self.experiment_dpath() / f".sending-{safe_name(saved_config_run_name(run, self.name))}-{key}"

    def _export(self, run: RunArtifacts, plan: ExportPlan) -> Sent:
        self._refuse_root_inside(run)
        if plan.identities_pending:
            return self._export_while_hashing(run, plan)
        holder = self.finished_holder(plan.run_identity)
        if holder is not None:  # a copy of this run, or its completed live run, is here already
            rows = RunPayload.of(run, plan).rollout_rows
            return Sent(backend_run_id=holder, rows=rows, note=f"already in {holder} (holds this identity)")
        run_id = self.post_run_id(run, plan)
        dpath = self.run_dpath(run_id)
        dpath.mkdir(parents=True, exist_ok=True)
        run_json: dict[str, Any] = {
            "run_id": run_id,
            "status": "RUNNING",
            "kind": "post-run",
            "source": str(run.stem),
            "created_at": utc_now_iso(),
        }
        atomic_write_json(dpath / "run.json", run_json)
        rows, sent_bytes = self._write_run_content(run, plan, dpath)
        run_json.update(self._finished_fields(run, plan, rows))
        run_json.update(self._report_fields())
        atomic_write_json(dpath / "run.json", run_json)
        sending = self.sending_dpath(run, plan)
        if sending is not None and sending.exists():  # an attempt that died before its rename
            shutil.rmtree(sending)
        return Sent(backend_run_id=run_id, rows=rows, bytes=sent_bytes)

    def _export_while_hashing(self, run: RunArtifacts, plan: ExportPlan) -> Sent:
        """The run's files copied into the send key's folder while the identity is hashed, then
        the folder renamed to the identity's (``publish_folder``)."""
        sending = self.sending_dpath(run, plan)
        assert sending is not None
        sending.mkdir(parents=True, exist_ok=True)
        run_json: dict[str, Any] = {
            "run_id": None,
            "status": "RUNNING",
            "kind": "post-run",
            "source": str(run.stem),
            "created_at": utc_now_iso(),
            "bytes_digest": plan.send_key,  # the send key: what a retry of these bytes finds
        }

        def undo() -> None:
            shutil.rmtree(sending, ignore_errors=True)

        try:
            atomic_write_json(sending / "run.json", run_json)
            rows, sent_bytes = self._write_run_content(run, plan, sending)
        except Exception:
            plan.complete_or_undo(undo)  # a malformed file: its identity's error, nothing left
            raise
        plan = plan.complete_or_undo(undo)
        run_id = self.post_run_id(run, plan)
        run_json.update(run_id=run_id, **self._finished_fields(run, plan, rows), **self._report_fields())
        atomic_write_json(sending / "run.json", run_json)
        publish_folder(sending, self.run_dpath(run_id), plan.run_identity)
        return Sent(backend_run_id=run_id, rows=rows, bytes=sent_bytes)

    def _report_fields(self) -> dict[str, Any]:
        """What ``run.json`` says of the report, written before the report exists."""
        if self.settings.report == "off":
            return {"report": None}
        return {"report": REPORT, "report_built": self.settings.report}

    def _after_receipt(self, run: RunArtifacts, plan: ExportPlan, backend_run_id: str | None) -> None:
        """``report.html`` in the run folder, once the data and the receipt are published (from
        the export's identities and coverage: the run is not hashed again)."""
        from gym_artifacts.plugin import ReportJob, build_report_job, start_report_in_background

        if self.settings.report == "off" or backend_run_id is None:
            return
        dpath = self.run_dpath(backend_run_id)
        href = f"artifacts/{RECORDING}" if (dpath / "artifacts" / RECORDING).is_file() else None
        job = ReportJob(run, dpath / REPORT, href, plan.identities, plan.coverage, plan.secrets)
        if self.settings.report == "background":
            start_report_in_background(job)
        else:
            build_report_job(job)

    def _certify(self, run: RunArtifacts, plan: ExportPlan, live_run_id: str) -> Sent:
        dpath = self.run_dpath(live_run_id)
        run_json_fpath = dpath / "run.json"
        if not run_json_fpath.is_file():
            raise CannotCertify(f"live run folder {dpath} is gone")
        rows, sent_bytes = self._write_run_content(run, plan, dpath)
        run_json = read_json(run_json_fpath)
        run_json.update(self._finished_fields(run, plan, rows), certified=True)
        run_json.update(self._report_fields())
        atomic_write_json(run_json_fpath, run_json)
        return Sent(backend_run_id=live_run_id, rows=rows, bytes=sent_bytes)

    def _mark_superseded(self, live_run_id: str, new_run_id: str) -> None:
        """Note the complete run on the live one, and end the live one if it never ended (KILLED)."""
        run_json_fpath = self.run_dpath(live_run_id) / "run.json"
        if run_json_fpath.is_file():
            run_json = read_json(run_json_fpath)
            run_json["superseded_by"] = new_run_id
            if run_json.get("status") == "RUNNING":
                run_json.update(status="KILLED", ended_at=utc_now_iso())
            atomic_write_json(run_json_fpath, run_json)

    @staticmethod
    def _finished_fields(run: RunArtifacts, plan: ExportPlan, rows: int) -> dict[str, Any]:
        return {
            "status": "FINISHED",
            "finished_at": utc_now_iso(),
            "run_identity": plan.run_identity,
            "identities": plan.identities,
            "rows": rows,
            "omitted_rows": run.omitted_rows(),
            **RunPayload.of(run, plan).omitted_partial_line,
            **eval_times(run),
            "coverage": plan.coverage.to_json() if plan.coverage is not None else None,
            "upload_rollouts": plan.upload_rollouts,
        }

    def _write_run_content(self, run: RunArtifacts, plan: ExportPlan, dpath: Path) -> tuple[int, int]:
        """Config, journal, aggregate metrics, rollouts and artifacts; returns (rows, bytes).

        Durable when it returns, by one barrier for all the files (``sync_barrier``) rather than
        a wait per file: ``run.json`` says FINISHED only after it."""
        with sync_barrier():
            return self._write_files(run, plan, dpath)

    def _write_files(self, run: RunArtifacts, plan: ExportPlan, dpath: Path) -> tuple[int, int]:
        payload = RunPayload.of(run, plan)
        sent_bytes = 0
        if payload.config is not None:
            data = canonical_json(json_safe(payload.config))
            atomic_write_bytes(dpath / "config.json", data)
            sent_bytes += len(data)
        sent_bytes += self._write_journal(payload, dpath)
        summary = payload.values
        summary.update(payload.omitted_partial_line)
        atomic_write_json(dpath / "summary.json", json_safe(summary))
        for table in payload.tables:
            with atomic_writer(dpath / "tables" / f"{table.name}.jsonl") as fh:
                sent_bytes += write_table_jsonl(table, fh.write)
        if payload.aggregate_file is not None:
            sent_bytes += payload.aggregate_file.write_to(dpath / payload.aggregate_file.name)
        for item in payload.sidecars:
            sent_bytes += item.write_to(dpath / "nemo_gym" / item.name)
        if payload.acceptance_file is not None:
            sent_bytes += payload.acceptance_file.write_to(dpath / payload.acceptance_file.name)
        with payload.rollouts_file() as complete:
            if complete is not None:
                sent_bytes += snapshot_copy(complete, dpath / "rollouts.jsonl")
        for item in payload.runtime_artifacts:
            sent_bytes += item.write_to(dpath / "artifacts" / item.name)
        return payload.rollout_rows, sent_bytes

    @staticmethod
    def _write_journal(payload: RunPayload, dpath: Path) -> int:
        """The live journal with its original steps and times, one canonical line each."""
        run = payload.run
        if not run.has_rollouts_file or not run.metrics_journal_fpath.is_file():
            return 0
        with atomic_writer(dpath / "metrics.jsonl") as fh:
            for entry in payload.journal():
                fh.write(journal_line(entry.metrics, entry.step, entry.time) + b"\n")
            return fh.tell()

    # -- live ----------------------------------------------------------------------------------
    def _setup(self) -> str:
        assert self.run is not None
        if self.resume_run_id is not None:
            dpath = self.run_dpath(self.resume_run_id)
            run_json_fpath = dpath / "run.json"
            if run_json_fpath.is_file():
                run_json = read_json(run_json_fpath)
                self._status_before_reopen = run_json.get("status")
                run_json.update(status="RUNNING", reopened_at=utc_now_iso())
                atomic_write_json(run_json_fpath, run_json)
                self._open_live_files(dpath, resume=True)
                return self.resume_run_id
            logger.info("local: live run %s is gone; opening a new one", self.resume_run_id)
        run_id = run_folder_name(saved_config_run_name(self.run, self.name), f"live-{uuid.uuid4().hex[:12]}")
        dpath = self.run_dpath(run_id)
        dpath.mkdir(parents=True, exist_ok=False)
        atomic_write_json(
            dpath / "run.json",
            {
                "run_id": run_id,
                "status": "RUNNING",
                "kind": "live",
                "source": str(self.run.stem),
                "created_at": utc_now_iso(),
            },
        )
        self._open_live_files(dpath, resume=False)
        return run_id

    def _open_live_files(self, dpath: Path, *, resume: bool) -> None:
        for name in ("metrics.jsonl", "rollouts.jsonl"):
            if resume:
                repair_partial_last_line(dpath / name)
        self._metrics_fh = open_regular(dpath / "metrics.jsonl", "ab")  # closed in _close_live_files
        self._rollouts_fh = open_regular(dpath / "rollouts.jsonl", "ab")

    def _log_config(self, config: dict[str, Any]) -> None:
        assert self.run_id is not None
        atomic_write_bytes(self.run_dpath(self.run_id) / "config.json", canonical_json(json_safe(config)))

    def _log_metrics(self, metrics: dict[str, Any], step: int, timestamp: float) -> None:
        assert self._metrics_fh is not None
        line = journal_line(metrics, step, timestamp)
        self._metrics_fh.write(line + b"\n")
        self._metrics_fh.flush()

    def _log_metrics_batch(self, entries: list[tuple[dict[str, Any], int, float]]) -> None:
        assert self._metrics_fh is not None
        lines = [journal_line(m, step, ts) for m, step, ts in entries]
        self._metrics_fh.write(b"\n".join(lines) + b"\n")
        self._metrics_fh.flush()

    def _log_rollouts(self, rollouts: list[Any]) -> None:
        assert self._rollouts_fh is not None
        self._rollouts_fh.write(b"".join(canonical_json(r) + b"\n" for r in rollouts))
        self._rollouts_fh.flush()

    def _close_live_files(self) -> None:
        for fh in (self._metrics_fh, self._rollouts_fh):
            if fh is not None:
                with contextlib.suppress(OSError):
                    fh.flush()
                    os.fsync(fh.fileno())
                fh.close()
        self._metrics_fh = self._rollouts_fh = None

    def _set_status(self, status: str | None, **extra: Any) -> None:
        assert self.run_id is not None
        run_json_fpath = self.run_dpath(self.run_id) / "run.json"
        run_json = read_json(run_json_fpath)
        run_json["status"] = status
        run_json.update(extra)
        atomic_write_json(run_json_fpath, run_json)

    def _teardown(self, status: RunStatus) -> None:
        self._close_live_files()
        self._set_status(status.value, ended_at=utc_now_iso())

    def _release_reopened(self) -> None:
        self._close_live_files()
        self._set_status(self._status_before_reopen)
