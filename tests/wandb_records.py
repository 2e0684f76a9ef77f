"""Reading an offline W&B run back from its ``.wandb`` file, with wandb's own inspector."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.processes import run_bounded


@dataclass
class OfflineRun:
    """What one offline run folder recorded."""

    folder: Path
    run_id: str
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    artifacts: list[dict[str, Any]] = field(default_factory=list)
    exit_code: int | None = None
    notes: str = ""

    @property
    def steps(self) -> list[int]:
        return [row["_step"] for row in self.history]

    def file(self, relative: str) -> Path:
        return self.folder / "files" / relative


def _value(raw: Any) -> Any:
    return raw


def inspected_records(wandb_file: Path) -> list[dict[str, Any]]:
    """Every record of a ``.wandb`` file, as wandb's own inspector prints it."""
    wandb_bin = Path(sys.executable).with_name("wandb")
    proc = run_bounded(
        [str(wandb_bin), "leet", "inspect", "--json", str(wandb_file)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return [json.loads(line) for line in proc.stdout.splitlines()]


def read_offline_run(wandb_file: Path) -> OfflineRun:
    run = OfflineRun(folder=wandb_file.parent, run_id=wandb_file.stem.removeprefix("run-"))
    for record in inspected_records(wandb_file):
        kind = record.get("type")
        body = record.get(kind, {})
        if kind == "run":
            run.config.update(body.get("config", {}).get("update", {}))
            run.notes = body.get("notes", run.notes) or run.notes
        elif kind == "config":
            run.config.update(body.get("update", {}))
        elif kind == "history":
            run.history.append(body.get("item", {}))
        elif kind == "summary":
            run.summary.update(body.get("update", {}))
        elif kind == "artifact":
            run.artifacts.append(body)
        elif kind == "exit":
            run.exit_code = body.get("exit_code", 0)
    return run


def offline_runs(root: Path) -> list[OfflineRun]:
    """Every offline run under ``root``, oldest first."""
    files = sorted(root.rglob("offline-run-*/run-*.wandb"), key=lambda p: p.parent.name)
    return [read_offline_run(p) for p in files]
