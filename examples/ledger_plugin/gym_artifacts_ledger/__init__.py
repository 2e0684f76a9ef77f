"""An example third-party backend: each backend run is one JSON-lines ledger, ``<folder>/<run id>.jsonl``."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from gym_artifacts import plugin as ga  # the whole surface a backend needs


class LedgerSettings(ga.ExporterConfig):
    folder: Path = Path("./ledgers")  # exporters.ledger.folder


class LedgerExporter(ga.LiveExporter):
    name = "ledger"
    config_model = LedgerSettings

    @classmethod
    def contract_settings(cls, folder: Path) -> dict[str, Any]:
        return {"folder": str(folder)}

    def _ledger(self, run_id: str) -> Path:
        return self.settings.folder / f"{run_id}.jsonl"

    def _append(self, kind: str, data: Any, run_id: str | None = None) -> None:
        fpath = self._ledger(run_id or self.run_id)
        fpath.parent.mkdir(parents=True, exist_ok=True)
        with open(fpath, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"kind": kind, "data": ga.json_safe(data)}) + "\n")

    def _setup(self) -> str:  # reopen the earlier run when resuming and its ledger is still there
        reopen = self.resume_run_id is not None and self._ledger(self.resume_run_id).is_file()
        return self.resume_run_id if reopen else uuid.uuid4().hex

    def _log_config(self, config: dict[str, Any]) -> None:
        self._append("config", config)

    def _log_metrics(self, metrics: dict[str, Any], step: int, timestamp: float) -> None:
        self._append("metrics", {"step": step, "time": timestamp, "metrics": metrics})

    def _log_rollouts(self, rollouts: list[Any]) -> None:
        for rollout in rollouts:
            self._append("rollout", rollout)

    def _teardown(self, status: ga.RunStatus) -> None:
        self._append("status", status.value)

    def _export(self, run: ga.RunArtifacts, plan: ga.ExportPlan) -> ga.Sent:
        run_id = plan.run_identity.removeprefix("b3:")[:32]  # the same run always lands in one ledger
        payload = ga.RunPayload.of(run, plan)  # what to send: masked, complete lines only, read once
        lines = [{"kind": "config", "data": payload.config or {}}]
        lines += [{"kind": "metrics", "data": vars(entry)} for entry in payload.journal()]
        lines += [{"kind": "rollout", "data": r} for r in payload.rollout_records()]
        lines += [{"kind": "aggregate", "data": payload.values}]
        data = b"".join(json.dumps(ga.json_safe(line)).encode() + b"\n" for line in lines)
        ga.atomic_write_bytes(self._ledger(run_id), data)  # whole or not at all: a retry cannot duplicate
        return ga.Sent(run_id, rows=payload.rollout_rows, bytes=len(data))

    def _certify(self, run: ga.RunArtifacts, plan: ga.ExportPlan, live_run_id: str) -> ga.Sent:
        if not self._ledger(live_run_id).is_file():
            raise ga.CannotCertify(f"ledger {live_run_id} is gone")
        self._append("aggregate", ga.RunPayload.of(run, plan).values, live_run_id)
        self._append("status", "CERTIFIED", live_run_id)
        return ga.Sent(live_run_id)
