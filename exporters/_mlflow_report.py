"""The MLflow run's ``report.html``, built and uploaded off the export's critical path.

MLflow's run page previews an HTML artifact, so the run gets the eval's report; building it
(charts, every rollout's row) costs seconds on a large run, more than the upload of its data.
It is built once the run is complete in MLflow and the export's receipt is written
(``exporters.mlflow.report``): ``after`` in the exporting process, ``background`` in a detached
process the export does not wait for (``start_report_in_background`` with this module's
``main``), or ``off``. A build that fails uploads ``report.html.error`` (one line: why) instead;
one that is killed uploads nothing. Either way the run, its data and the receipt stay as they
were: a missing report never means missing data, and a rerun is SKIPPED.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gym_artifacts.plugin import ExportPlan, RunArtifacts

from ._mlflow_client import RequestLimits, ScopedMlflow

REPORT_NAME = "report.html"
STAGING_PREFIX = "gym-artifacts-mlflow-report-"


@dataclass(frozen=True)
class ReportTarget:
    """The MLflow run a report goes to, and how to reach it from another process."""

    tracking_uri: str
    token: str | None
    run_id: str
    limits: RequestLimits

    def client(self) -> ScopedMlflow:
        return ScopedMlflow(self.tracking_uri, self.token, self.limits)

    def to_context(self) -> dict[str, Any]:
        """What travels to the background process with the job (on its standard input)."""
        return {"tracking_uri": self.tracking_uri, "token": self.token, "run_id": self.run_id,
                "limits": asdict(self.limits)}  # fmt: skip

    @classmethod
    def from_context(cls, context: dict[str, Any]) -> ReportTarget:
        limits = RequestLimits(**context["limits"])
        return cls(context["tracking_uri"], context["token"], context["run_id"], limits)


def has_report(ml: ScopedMlflow, run_id: str) -> bool:
    """The run holds a report already (an earlier export of the same content uploaded it)."""
    return any(f.path == REPORT_NAME for f in ml.client.list_artifacts(run_id))


def job_for(run: RunArtifacts, plan: ExportPlan, run_id: str) -> Any:
    """A report job (``ReportJob``) into a fresh staging folder named by the MLflow run."""
    from gym_artifacts.plugin import ReportJob

    staging = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{run_id}-"))
    return ReportJob(run, staging / REPORT_NAME, None, plan.identities, plan.coverage, plan.secrets)


def build_and_upload(job: Any, ml: ScopedMlflow, run_id: str) -> bool:
    """Build the job's report and upload it to the run (``report.html.error`` when the build
    failed); the staging folder is removed. True when the report was built and uploaded."""
    from gym_artifacts.plugin import build_report_job

    try:
        built = build_report_job(job)
        page = job.dest if built else job.error_fpath
        if page.is_file():
            ml.log_artifact(run_id, page, None)
        return bool(built)
    finally:
        shutil.rmtree(job.dest.parent, ignore_errors=True)


def start(job: Any, target: ReportTarget) -> bool:
    """Build and upload in a detached process; False when it could not start (staging removed)."""
    from gym_artifacts.plugin import start_report_in_background

    started = bool(start_report_in_background(job, __name__, target.to_context()))
    if not started:
        shutil.rmtree(job.dest.parent, ignore_errors=True)
    return started


def main(dest: str, job_json: bytes) -> int:
    """The background process: build the report, upload it to the run named in the context."""
    from gym_artifacts.plugin import ReportJob

    job = ReportJob.from_json(job_json)
    context = ReportJob.context_of(job_json)
    if Path(dest) != job.dest or context is None:
        return 2
    target = ReportTarget.from_context(context)
    return 0 if build_and_upload(job, target.client(), target.run_id) else 1
