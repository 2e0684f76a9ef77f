"""ExperimentSession: a session's runtime artifacts, each independent, atomic, and accounted for.

``maybe_build_session()`` returns a session only when ``EXPERIMENT_ID`` is set and this is rank
0; otherwise None, at no cost. ``mark_start`` writes ``session_start.json`` at once (so a
crashed process leaves a trace of what it was) and starts NVML sampling; ``mark_end`` stops it;
``finalize`` writes every artifact independently (one that fails for any reason is recorded
and the others are still written) and ``manifest.json`` last, listing each artifact's name,
size and identity and every failure.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import socket
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gym_artifacts.core.atomic import TEMP_PREFIX, atomic_write_bytes, atomic_write_json
from gym_artifacts.core.ranks import is_rank_zero
from gym_artifacts.run.identity import identity_of
from gym_artifacts.run.layout import (
    ARTIFACTS_SUFFIX,
    DERIVED_CONFIG,
    MANIFEST,
    NVML_SERIES,
    NVML_SUMMARY,
    PROFILER_TRACE,
    RECORDING,
    SESSION_START,
    SESSION_TIMES,
)
from gym_artifacts.runtime.nvml import NVMLSampler
from gym_artifacts.runtime.recording import assemble_recording

logger = logging.getLogger(__name__)



def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def validate_experiment_id(experiment_id: str) -> str:
    """An id that is safe as one path component."""
    if (
        not experiment_id
        or experiment_id in (".", "..")
        or any(c in experiment_id for c in ("/", "\\", "\0"))
        or len(experiment_id) > 200
    ):
        raise ValueError(f"EXPERIMENT_ID={experiment_id!r} must be a plain name (no path separators)")
    return experiment_id


def artifacts_dpath_for(experiment_id: str, output_jsonl_fpath: str | os.PathLike[str] | None) -> Path:
    """``EXPERIMENT_ARTIFACTS_DIR``, else ``STEM_artifacts/``, else ``/tmp/experiment-<id>``."""
    explicit = os.environ.get("EXPERIMENT_ARTIFACTS_DIR")
    if explicit:
        return Path(explicit)
    if output_jsonl_fpath is not None:
        stem = Path(output_jsonl_fpath).with_suffix("")
        return stem.with_name(stem.name + ARTIFACTS_SUFFIX)
    return Path("/tmp") / f"experiment-{experiment_id}"


def maybe_build_session(
    output_jsonl_fpath: str | os.PathLike[str] | None = None,
    *,
    nvml_interval: float | None = None,
    sampler_factory: Callable[..., NVMLSampler] = NVMLSampler,
) -> ExperimentSession | None:
    """A session when ``EXPERIMENT_ID`` is set on rank 0; None otherwise (never raises)."""
    experiment_id = os.environ.get("EXPERIMENT_ID")
    if not experiment_id or not is_rank_zero():
        return None
    try:
        validate_experiment_id(experiment_id)
        interval = (
            nvml_interval
            if nvml_interval is not None
            else float(os.environ.get("EXPERIMENT_NVML_INTERVAL", "1.0"))
        )
        dpath = artifacts_dpath_for(experiment_id, output_jsonl_fpath)
        return ExperimentSession(
            experiment_id, dpath, nvml_interval=interval, sampler_factory=sampler_factory
        )
    except (ValueError, OSError) as exc:
        logger.error("no experiment session: %s", exc)
        return None


class ExperimentSession:
    """Produces one session's runtime artifacts into ``artifacts_dpath``."""

    def __init__(
        self,
        experiment_id: str,
        artifacts_dpath: Path,
        *,
        nvml_interval: float = 1.0,
        sampler_factory: Callable[..., NVMLSampler] = NVMLSampler,
    ) -> None:
        self.experiment_id = validate_experiment_id(experiment_id)
        self.artifacts_dpath = Path(artifacts_dpath)
        self.nvml_interval = nvml_interval
        self._sampler_factory = sampler_factory
        self.sampler: NVMLSampler | None = None
        self.started_at: dt.datetime | None = None
        self.ended_at: dt.datetime | None = None
        self.failures: dict[str, str] = {}
        self.notes: dict[str, Any] = {}

    @property
    def _series_partial(self) -> Path:
        return self.artifacts_dpath / f"{TEMP_PREFIX}{NVML_SERIES}"

    def mark_start(self, devices: Sequence[int] | None = None) -> None:
        """Record the start (``session_start.json`` at once) and start NVML sampling."""
        self.started_at = _now()
        self.artifacts_dpath.mkdir(parents=True, exist_ok=True)
        self._attempt(
            SESSION_START,
            lambda: atomic_write_json(
                self.artifacts_dpath / SESSION_START,
                {
                    "experiment_id": self.experiment_id,
                    "started_at": self.started_at.isoformat() if self.started_at else None,
                    "pid": os.getpid(),
                    "host": socket.gethostname(),
                    "argv": sys.argv,
                    "devices": list(devices) if devices is not None else None,
                    "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                },
            ),
        )
        try:
            self.sampler = self._sampler_factory(
                interval=self.nvml_interval, devices=devices, series_fpath=self._series_partial
            )
            self.sampler.start()
        except Exception as exc:
            self.failures["nvml"] = f"{type(exc).__name__}: {exc}"
            logger.warning("NVML sampling not started: %s", exc)

    def mark_end(self) -> None:
        """Record the end and stop sampling."""
        self.ended_at = _now()
        if self.sampler is not None:
            try:
                self.sampler.stop()
            except Exception as exc:
                self.failures["nvml"] = f"{type(exc).__name__}: {exc}"

    def _attempt(self, name: str, write: Callable[[], Any]) -> Any:
        try:
            result = write()
        except Exception as exc:
            self.failures[name] = f"{type(exc).__name__}: {exc}"
            logger.warning("runtime artifact %s not written: %s", name, self.failures[name])
            return None
        self.failures.pop(name, None)
        return result

    def finalize(
        self, derived_config: Any = None, recording_session_dir: Path | str | None = None
    ) -> dict[str, Any]:
        """Write every artifact (each on its own), then ``manifest.json``; returns the manifest."""
        if self.ended_at is None:
            self.mark_end()
        dpath = self.artifacts_dpath
        dpath.mkdir(parents=True, exist_ok=True)
        times = {
            "start": self.started_at.isoformat() if self.started_at else None,
            "end": self.ended_at.isoformat() if self.ended_at else None,
        }
        if self.started_at and self.ended_at:
            times["duration_s"] = (self.ended_at - self.started_at).total_seconds()
        self._attempt(SESSION_TIMES, lambda: atomic_write_json(dpath / SESSION_TIMES, times))
        summary = (
            self.sampler.summary()
            if self.sampler is not None
            else {"samples": 0, "reason": self.failures.get("nvml", "NVML sampling did not start")}
        )
        self._attempt(NVML_SUMMARY, lambda: atomic_write_json(dpath / NVML_SUMMARY, summary))
        if self.sampler is not None:
            try:
                self.sampler.shutdown()  # the summary is taken: release NVML (nvmlShutdown)
            except Exception as exc:
                self.failures["nvml"] = f"{type(exc).__name__}: {exc}"
        if self._series_partial.exists():
            self._attempt(NVML_SERIES, lambda: os.replace(self._series_partial, dpath / NVML_SERIES))
        if derived_config is not None:
            self._attempt(
                DERIVED_CONFIG,
                lambda: atomic_write_bytes(
                    dpath / DERIVED_CONFIG,
                    json.dumps(derived_config, indent=2, sort_keys=True, allow_nan=False).encode(),
                ),
            )
        if recording_session_dir is not None:
            report = self._attempt(
                RECORDING, lambda: assemble_recording(Path(recording_session_dir), dpath / RECORDING)
            )
            if report is not None:
                self.notes["recording"] = {
                    "chunks": report.chunks,
                    "first_index": report.first_index,
                    "last_index": report.last_index,
                    "missing_ranges": [list(r) for r in report.missing_ranges],
                    "missing_count": report.missing_count,
                    "bytes": report.bytes,
                    "copy": report.method,
                }
        self._finish_profilers()
        return self._write_manifest()

    def _finish_profilers(self) -> None:
        """Close the chunk-range profilers of this folder (a range past the last chunk is still
        open) and record what each covers, or why it wrote no trace."""
        from gym_artifacts.runtime.profiler import finish_profilers

        try:
            outcomes = finish_profilers(self.artifacts_dpath)
        except Exception as exc:
            self.failures[PROFILER_TRACE] = f"{type(exc).__name__}: {exc}"
            return
        for note, failure in outcomes:
            if note is not None:
                self.notes["profile"] = note
            if failure is not None:
                self.failures[PROFILER_TRACE] = failure

    def _write_manifest(self) -> dict[str, Any]:
        artifacts = []
        for entry in sorted(os.scandir(self.artifacts_dpath), key=lambda e: e.name):
            if entry.name.startswith(".") or entry.name == MANIFEST or not entry.is_file():
                continue
            item: dict[str, Any] = {"name": entry.name, "size": entry.stat().st_size}
            try:
                item["identity"] = identity_of(Path(entry.path))
            except Exception as exc:
                item["identity_error"] = str(exc)
            artifacts.append(item)
        manifest = {
            "experiment_id": self.experiment_id,
            "finalized_at": _now().isoformat(),
            "artifacts": artifacts,
            "failures": [{"artifact": k, "error": v} for k, v in sorted(self.failures.items())],
            **self.notes,
        }
        atomic_write_json(self.artifacts_dpath / MANIFEST, manifest)
        return manifest
