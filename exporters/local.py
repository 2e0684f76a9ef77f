"""The local backend: each run as a plain folder under ``<root>/<experiment>/<run id>/``.

The folder holds ``run.json`` (status, identities, times), ``config.json`` (masked),
``metrics.jsonl``, ``summary.json`` (aggregate metrics, every level), ``rollouts.jsonl`` and
``artifacts/``. Every file is published atomically; run files are hard-linked when on the same
filesystem, else copied. A post-run export's run id derives from the run's identity, so a
retried export rewrites the same folder instead of creating another.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import field_validator

from gym_artifacts.atomic import atomic_write_bytes, atomic_write_json, atomic_writer, link_or_copy
from gym_artifacts.config import ExporterConfig
from gym_artifacts.exporter import Exporter, ExportPlan, Sent
from gym_artifacts.jsonio import canonical_json, json_safe, read_json
from gym_artifacts.payload import aggregate_metrics, count_lines, iter_journal
from gym_artifacts.receipts import utc_now_iso
from gym_artifacts.run import RunArtifacts
from gym_artifacts.secrets import mask_secrets

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
MASKABLE_MAX_BYTES = 16 << 20


def safe_name(text: str) -> str:
    """A single path component made of safe characters."""
    name = _UNSAFE.sub("_", text).strip("._") or "run"
    return name[:100]


class LocalSettings(ExporterConfig):
    """Settings of ``exporters.local``."""

    root: Path = Path("./gym-artifacts-runs")
    experiment: str = "default"

    @field_validator("experiment")
    @classmethod
    def _plain_experiment(cls, value: str) -> str:
        if not value or value in (".", "..") or "/" in value or "\\" in value or "\0" in value:
            raise ValueError("must be a plain folder name (no '/', '..' or empty)")
        return value


class LocalExporter(Exporter):
    """Runs as folders on a local (or mounted) filesystem."""

    name = "local"
    config_model = LocalSettings
    settings: LocalSettings

    def experiment_dpath(self) -> Path:
        return self.settings.root.expanduser() / self.settings.experiment

    def post_run_id(self, run: RunArtifacts, plan: ExportPlan) -> str:
        """Deterministic: the same run identity always names the same folder."""
        return f"{safe_name(run.name)}-{plan.run_identity.split(':')[-1][:16]}"

    def _export(self, run: RunArtifacts, plan: ExportPlan) -> Sent:
        run_id = self.post_run_id(run, plan)
        dpath = self.experiment_dpath() / run_id
        dpath.mkdir(parents=True, exist_ok=True)
        created_at = utc_now_iso()
        run_json = {
            "run_id": run_id,
            "status": "RUNNING",
            "kind": "post-run",
            "source": str(run.stem),
            "run_identity": plan.run_identity,
            "identities": plan.identities,
            "created_at": created_at,
        }
        atomic_write_json(dpath / "run.json", run_json)
        sent_bytes = 0
        if plan.config is not None:
            data = canonical_json(json_safe(plan.config))
            atomic_write_bytes(dpath / "config.json", data)
            sent_bytes += len(data)
        sent_bytes += self._write_journal(run, dpath)
        omitted = run.omitted_rows()
        if run.aggregate_metrics_fpath.is_file() and run.has_rollouts_file:
            entries = run.read_aggregate_metrics()
            summary: dict[str, Any] = dict(aggregate_metrics(entries))
            summary["omitted_rows"] = omitted
            atomic_write_json(dpath / "summary.json", json_safe(summary))
            sent_bytes += link_or_copy(run.aggregate_metrics_fpath, dpath / "aggregate_metrics.json")
        if run.has_rollouts_file and run.acceptance_fpath.is_file():
            sent_bytes += link_or_copy(run.acceptance_fpath, dpath / "acceptance.json")
        rows = 0
        rollouts = run.rollouts_fpath
        if plan.upload_rollouts and rollouts is not None and rollouts.is_file():
            rows = count_lines(rollouts)
            sent_bytes += link_or_copy(rollouts, dpath / "rollouts.jsonl")
        for rel, fpath in run.runtime_artifact_files().items():
            sent_bytes += publish_artifact(fpath, dpath / "artifacts" / rel, plan.secrets)
        run_json.update(
            status="FINISHED",
            finished_at=utc_now_iso(),
            rows=rows,
            omitted_rows=omitted,
            upload_rollouts=plan.upload_rollouts,
        )
        atomic_write_json(dpath / "run.json", run_json)
        return Sent(backend_run_id=run_id, rows=rows, bytes=sent_bytes)

    @staticmethod
    def _write_journal(run: RunArtifacts, dpath: Path) -> int:
        """The live journal with its original steps and times, one canonical line each."""
        if not run.has_rollouts_file or not run.metrics_journal_fpath.is_file():
            return 0
        with atomic_writer(dpath / "metrics.jsonl") as fh:
            for entry in iter_journal(run):
                line = {"step": entry.step, "time": entry.time, "metrics": entry.metrics}
                fh.write(canonical_json(line) + b"\n")
            return fh.tell()


def publish_artifact(src: Path, dst: Path, secrets: frozenset[str]) -> int:
    """Link or copy one artifact; a small JSON file that holds a secret is masked first."""
    if src.suffix == ".json" and src.stat().st_size <= MASKABLE_MAX_BYTES:
        content = read_json(src)
        data = canonical_json(json_safe(mask_secrets(content, secrets)))
        if data != canonical_json(json_safe(content)):
            atomic_write_bytes(dst, data)
            return len(data)
    return link_or_copy(src, dst)
