"""A report built after an export has published its data and receipt, never in its way.

The local backend hands a ``ReportJob`` to ``build`` (in the exporting process, once the
receipt is written) or to ``start_background`` (a detached process the export does not wait
for). Either way the report is
published atomically under its final name or not at all; a build that fails writes
``<report>.error`` (one line: why) beside it, and a build that is killed leaves neither, so a
missing report never means missing data. ``gym-artifacts report RUN -o <folder>/report.html``
builds it again by hand.

The job travels to the background process on its standard input (JSON), not on its command
line: it carries the secret values the page must not quote. A backend whose report goes
somewhere after it is built (MLflow uploads it to the run) names its own ``entry`` module, whose
``main(dest, job_json)`` runs in the detached process, and a ``context`` (JSON) that travels
with the job (``ReportJob.context_of``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gym_artifacts.core.atomic import atomic_writer
from gym_artifacts.run.artifacts import RunArtifacts
from gym_artifacts.run.coverage import Coverage

logger = logging.getLogger(__name__)
MODULE = "gym_artifacts.report.deferred"


@dataclass(frozen=True)
class ReportJob:
    """Everything a report build needs from the export (the run is not hashed again)."""

    run: RunArtifacts
    dest: Path
    recording_href: str | None
    identities: dict[str, str]
    coverage: Coverage | None
    secrets: frozenset[str]

    @property
    def error_fpath(self) -> Path:
        """Where a failed build says why (beside the report it could not write)."""
        from gym_artifacts.report.build import failure_note

        return failure_note(self.dest)

    def to_json(self, context: dict[str, Any] | None = None) -> bytes:
        return json.dumps(
            {
                "run": self.run.model_dump(mode="json"),
                "dest": str(self.dest),
                "recording_href": self.recording_href,
                "identities": self.identities,
                "coverage": dataclasses.asdict(self.coverage) if self.coverage is not None else None,
                "secrets": sorted(self.secrets),
                "context": context,
            }
        ).encode()

    @staticmethod
    def context_of(data: bytes) -> dict[str, Any] | None:
        """The ``context`` a backend sent along with the job (``start_background``)."""
        context = json.loads(data).get("context")
        return dict(context) if isinstance(context, dict) else None

    @classmethod
    def from_json(cls, data: bytes) -> ReportJob:
        obj = json.loads(data)
        return cls(
            run=RunArtifacts.model_validate(obj["run"]),
            dest=Path(obj["dest"]),
            recording_href=obj["recording_href"],
            identities=dict(obj["identities"]),
            coverage=Coverage(**obj["coverage"]) if obj["coverage"] is not None else None,
            secrets=frozenset(obj["secrets"]),
        )


def build(job: ReportJob) -> bool:
    """Build the job's report; on failure write ``<report>.error`` instead. True when built."""
    from gym_artifacts.report import build_report

    try:
        build_report(
            job.run,
            job.dest,
            recording_href=job.recording_href,
            identities=job.identities or None,
            coverage=job.coverage,
            secrets=job.secrets,
        )
    except Exception as exc:
        logger.warning("report %s not written: %s", job.dest, exc)
        try:
            with atomic_writer(job.error_fpath, durable=False) as fh:
                fh.write(f"{type(exc).__name__}: {exc}\n".encode())
        except OSError:
            pass
        return False
    job.error_fpath.unlink(missing_ok=True)
    return True


# Run by ``python -c``: read the job, fork, and let the parent exit at once, so the export reaps
# its child right away and the build goes on in a grandchild nobody has to wait for. Only the
# standard library is loaded before the fork (the process is single-threaded there).
_BOOTSTRAP = """
import os, sys
job = sys.stdin.buffer.read()
if os.fork():
    os._exit(0)
sys.path.insert(0, sys.argv[3])  # the same gym_artifacts as the export's
from importlib import import_module
sys.exit(import_module(sys.argv[2]).main(sys.argv[1], job))
"""
_BOOTSTRAP_WAIT_S = 30.0
_PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])


def start_background(job: ReportJob, entry: str = MODULE, context: dict[str, Any] | None = None) -> bool:
    """Start a detached process that builds the report; False when it cannot start (logged).

    Its own session, so a Ctrl-C of the export's terminal does not reach it; its output goes
    nowhere (the outcome is the report or ``<report>.error``). The export waits only for the
    short-lived first process (it forks the builder and exits), never for the build. ``entry``:
    the module whose ``main(dest, job_json)`` the process runs (this one's builds the report
    only); ``context`` travels with the job, on standard input.
    """
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", _BOOTSTRAP, str(job.dest), entry, _PACKAGE_PARENT],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as exc:
        logger.warning("report %s not started: %s", job.dest, exc)
        return False
    try:
        proc.communicate(job.to_json(context), timeout=_BOOTSTRAP_WAIT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.warning("report %s: the background build did not start: %s", job.dest, exc)
        proc.kill()
        proc.wait()
        return False
    return proc.returncode == 0


def main(dest: str, job_json: bytes) -> int:
    """The background build: ``dest`` is on the command line only so that people and tests can
    tell these processes apart; the job (with its secrets) came on standard input."""
    job = ReportJob.from_json(job_json)
    if Path(dest) != job.dest:
        return 2
    return 0 if build(job) else 1
