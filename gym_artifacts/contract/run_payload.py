"""``RunPayload``: what a backend sends from one finished run, computed once per export.

Every backend's post-run send (and certify) needs the same things from the run: the masked
config and the secrets it held, the aggregate values and tables, the acceptance record and the
coverage, the NVML summary and series, the journal, the rollouts (complete lines only: a torn
last line the user chose to leave out is never sent) with their row count, and the run's files
to ship (aggregate metrics, acceptance, NeMo Gym's sidecars, runtime artifacts), each masked
when it holds a secret. ``RunPayload.of(run, plan)`` gives the one payload of an export: what
several backends share is read and masked once, lazily (a backend that never asks for a piece
costs nothing), and rollouts are streamed in constant memory, never held.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gym_artifacts.core.jsonio import count_lines
from gym_artifacts.run.journal import JournalEntry, iter_journal
from gym_artifacts.run.sidecars import (
    Masker,
    NvmlSample,
    iter_nvml_series,
    masked_artifact,
    masked_sidecar,
    masked_values,
    nvml_summary,
)

if TYPE_CHECKING:
    from gym_artifacts.contract.hooks import ExportPlan
    from gym_artifacts.core.flatten import Scalar
    from gym_artifacts.run.aggregate import LevelTable
    from gym_artifacts.run.aggregate_read import AggregateRead
    from gym_artifacts.run.artifacts import Acceptance, RunArtifacts
    from gym_artifacts.run.coverage import Coverage
    from gym_artifacts.run.rollouts_table import RolloutsTable

AGGREGATE = "aggregate"  # OUT_aggregate_metrics.json, shipped as aggregate_metrics.json
ACCEPTANCE = "acceptance"  # OUT_acceptance.json, shipped as acceptance.json
SIDECAR = "sidecar"  # NeMo Gym's own sidecar files, under their artifact names
RUNTIME = "runtime"  # OUT_artifacts/<relative name>

# How each kind is masked. NeMo Gym's own output never by key: its keys name counts (``tokens``)
# that a config masker would take for credentials. Its data (aggregate metrics, acceptance) by the
# config's secret values, at any size; its sidecars (failure reasons, inputs: free text) also by
# shape. Runtime artifacts (session configs, manifests) as a config: secret keys and shapes.
_MASKERS: dict[str, Masker] = {
    AGGREGATE: masked_values,
    ACCEPTANCE: masked_values,
    SIDECAR: masked_sidecar,
    RUNTIME: masked_artifact,
}


def artifact_content(kind: str, fpath: Path, secrets: frozenset[str]) -> bytes | Path:
    """What to ship for one run file: its masked bytes when it holds a secret, else the file.

    The one place that decides "mask a small JSON/YAML artifact, or copy/link it as it is".
    """
    masked = _MASKERS[kind](fpath, secrets)
    return fpath if masked is None else masked


@dataclass(frozen=True)
class PayloadArtifact:
    """One run file a backend ships: its name in the backend run and its content.

    ``content`` is the masked bytes (the file held a secret) or the run file's path (ship it as
    it is: a snapshot copy or an upload, never a hard link).
    """

    kind: str
    name: str
    source: Path
    content: bytes | Path

    @property
    def masked(self) -> bool:
        return isinstance(self.content, bytes)

    @property
    def size(self) -> int:
        return len(self.content) if isinstance(self.content, bytes) else self.source.stat().st_size

    @property
    def basename(self) -> str:
        return self.name.rsplit("/", 1)[-1]

    def write_to(self, dst: Path) -> int:
        """Publish the content as ``dst`` atomically (bytes, or a snapshot copy); returns its size."""
        from gym_artifacts.core.atomic import atomic_write_bytes
        from gym_artifacts.core.snapshot import snapshot_copy

        if isinstance(self.content, bytes):
            atomic_write_bytes(dst, self.content)
            return len(self.content)
        return snapshot_copy(self.content, dst)

    @contextlib.contextmanager
    def as_file(self) -> Iterator[Path]:
        """A file named ``basename`` holding exactly the content (the run file itself when it
        already is one; else a temporary snapshot, removed afterwards): for uploads by path."""
        if isinstance(self.content, Path) and self.content.name == self.basename:
            yield self.content
            return
        with tempfile.TemporaryDirectory(prefix="gym-artifacts-payload-") as tmp:
            staged = Path(tmp) / self.basename
            self.write_to(staged)
            yield staged


class RunPayload:
    """What a backend sends from ``run`` under ``plan``; one per export (``RunPayload.of``).

    Cached pieces are read once whichever backend asks first; the streams (``journal``,
    ``nvml_series``, ``rollout_records``) read the file on each call, in constant memory.
    """

    def __init__(self, run: RunArtifacts, plan: ExportPlan) -> None:
        self.run = run
        self.plan = plan

    @classmethod
    def of(cls, run: RunArtifacts, plan: ExportPlan) -> RunPayload:
        """The export's payload: every backend sent ``plan`` for ``run`` shares this one."""
        key = str(run.stem)
        payload = plan.payloads.get(key)
        if payload is None:
            payload = plan.payloads[key] = cls(run, plan)
        return payload

    # -- config and bookkeeping -------------------------------------------------------------------
    @property
    def config(self) -> dict[str, Any] | None:
        """The run's config, resolved where possible and masked (None when it has none)."""
        return self.plan.config

    @property
    def secrets(self) -> frozenset[str]:
        """The secret values the config held: redact them from anything free-form."""
        return self.plan.secrets

    @property
    def coverage(self) -> Coverage | None:
        return self.plan.coverage

    @cached_property
    def acceptance(self) -> Acceptance | None:
        """The accepted-partial record, or None."""
        return self.run.read_acceptance()

    @cached_property
    def omitted_partial_line(self) -> dict[str, int]:
        """``omitted_partial_lines`` / ``_bytes`` when a torn last line is left out (else empty)."""
        return partial_line_record(self.plan)

    # -- aggregate --------------------------------------------------------------------------------
    @cached_property
    def _aggregate(self) -> AggregateRead | None:
        run = self.run
        if run.has_rollouts_file and run.aggregate_metrics_fpath.is_file():
            return run.read_aggregate()
        return None

    @property
    def aggregate_entries(self) -> list[dict[str, Any]] | None:
        """Each agent's aggregate entry without its per-task and per-repeat lists (those are
        ``tables``; the file itself is ``aggregate_file``), None when the run has none: what a
        run of any size holds in memory."""
        read = self._aggregate
        return read.heads if read is not None else None

    @cached_property
    def _values_and_tables(self) -> tuple[dict[str, Scalar], list[LevelTable]]:
        from gym_artifacts.run.aggregate import values_and_tables

        values, _ = values_and_tables(self.aggregate_entries, self.coverage, self.run.omitted_rows())
        tables = self._aggregate.tables if self._aggregate is not None else []
        return _redacted_values(values, self.secrets), [_redacted_table(t, self.secrets) for t in tables]

    @property
    def values(self) -> dict[str, Scalar]:
        """Bounded values: the aggregate under NeMo Gym's names, ``coverage/*``, ``omitted_rows``
        (the config's secret values redacted from text). A fresh dict: the caller may add to it."""
        return dict(self._values_and_tables[0])

    @cached_property
    def rollouts_with_failures_identity(self) -> str | None:
        """The identity of ``OUT.jsonl`` and NeMo Gym's ``OUT_failures.jsonl`` together (None
        without a failures file): read once per export, whichever backend asks first."""
        from gym_artifacts.run.identity import rollouts_with_failures_identity

        return rollouts_with_failures_identity(self.run)

    @cached_property
    def exporter_view_identity(self) -> str | None:
        """The identity of NeMo Gym's exporter view of every result in ``OUT.jsonl`` and
        ``OUT_failures.jsonl`` (``run.exporter_view``; None when no record holds what the view
        leaves out): read once per export, whichever backend asks first."""
        from gym_artifacts.run.exporter_view import exporter_view_identity

        return exporter_view_identity(self.run)

    @property
    def history_values(self) -> dict[str, Scalar]:
        """``values`` a backend with metric history (MLflow, TensorBoard) logs as points: those
        the journal does not hold already. NeMo Gym logs its aggregate and ``coverage/*`` metrics
        live as steps of their own; the journal's point is then the metric's one point (the
        aggregate file's value is the same), not a second one at step 0. A fresh dict."""
        journaled = self.journaled_names
        return {k: v for k, v in self.values.items() if k not in journaled}

    @cached_property
    def journaled_names(self) -> frozenset[str]:
        """Every metric name the journal holds (one read of it; bounded by the names, not the steps)."""
        names: set[str] = set()
        for entry in iter_journal(self.run):
            names.update(entry.metrics)
        return frozenset(names)

    @property
    def tables(self) -> list[LevelTable]:
        """The per-task and per-repeat levels (the config's secret values redacted from text cells)."""
        return self._values_and_tables[1]

    @cached_property
    def experiment_metadata(self) -> dict[str, Any]:
        """What an LLM backend keeps in its experiment's metadata (no metrics of its own there):
        the nested aggregate values and ``coverage/*`` exactly as ``values`` gives them."""
        from gym_artifacts.run.aggregate import aggregate_metrics

        metadata: dict[str, Any] = {}
        if self.aggregate_entries is not None:
            metadata["aggregate_metrics"] = _redacted_values(
                aggregate_metrics(self.aggregate_entries), self.secrets
            )
        metadata["coverage"] = {k: v for k, v in self.values.items() if k.startswith("coverage/")}
        return metadata

    # -- streams ----------------------------------------------------------------------------------
    def journal(self) -> Iterator[JournalEntry]:
        """The live metrics journal with its original steps and times, text values masked, and
        NeMo Gym's own ``coverage/missing`` (expected - scored, as a journal from before the
        drop-in restated it holds) as the run's one definition: no result at all
        (``gym_artifacts.run.coverage``), with the run's failures sidecar."""
        from dataclasses import replace

        from gym_artifacts.core.secrets import mask_text_metrics
        from gym_artifacts.run.coverage import nemo_gym_coverage

        failed = self.coverage.failed if self.coverage is not None else None
        for entry in iter_journal(self.run):
            metrics = mask_text_metrics(entry.metrics, self.secrets)
            figures = nemo_gym_coverage(metrics, failed)
            if figures is not None and metrics.get("coverage/missing") != figures["coverage/missing"]:
                metrics = {**metrics, "coverage/missing": figures["coverage/missing"]}
            yield entry if metrics is entry.metrics else replace(entry, metrics=dict(metrics))

    @cached_property
    def nvml_summary(self) -> tuple[dict[str, float], str | None]:
        """The NVML summary's figures, or ``({}, reason)`` when NVML never sampled."""
        return nvml_summary(self.run)

    def nvml_series(self) -> Iterator[NvmlSample]:
        """The NVML series in file order."""
        return iter_nvml_series(self.run)

    # -- rollouts ---------------------------------------------------------------------------------
    @property
    def sends_rollouts(self) -> bool:
        """Rollouts are to be sent (``upload_rollouts``) and the run has a rollouts file."""
        fpath = self.run.rollouts_fpath
        return self.plan.upload_rollouts and fpath is not None and fpath.is_file()

    @cached_property
    def rollout_rows(self) -> int:
        """Rollouts sent (0 when none are): the identity pass's count, else counted once."""
        if not self.sends_rollouts:
            return 0
        if self.plan.rollout_rows is not None:
            return self.plan.rollout_rows
        assert self.run.rollouts_fpath is not None
        return count_lines(self.run.rollouts_fpath)

    def rollout_records(self) -> Iterator[Any]:
        """Every complete rollout record in file order, streamed (nothing when none are sent), with
        the config's secret values masked in its decoded strings (tables, traces, request bodies
        are encodings of these records; only the rollouts file itself ships as written)."""
        if not self.sends_rollouts:
            return
        from gym_artifacts.core.jsonio import iter_jsonl
        from gym_artifacts.core.secrets import mask_values

        assert self.run.rollouts_fpath is not None
        torn = self.plan.partial_line
        end = torn.complete_bytes if torn is not None else None
        secrets = self.secrets if self._rollouts_hold_a_secret else frozenset()
        for _, record in iter_jsonl(self.run.rollouts_fpath, "rollouts JSONL", end=end):
            yield mask_values(record, secrets, shapes=False) if secrets else record

    @cached_property
    def _rollouts_hold_a_secret(self) -> bool:
        """Whether the rollouts file holds a known secret in any encoding: one scan in C over the
        bytes, so that records are walked one by one only when there is something to mask."""
        from gym_artifacts.core.secrets import file_holds_any, secret_forms_as_bytes

        if not self.secrets or self.run.rollouts_fpath is None:
            return False
        forms = secret_forms_as_bytes(self.secrets, known=False)
        return forms is None or file_holds_any(self.run.rollouts_fpath, forms)

    @contextlib.contextmanager
    def rollouts_file(self) -> Iterator[Path | None]:
        """The rollouts file to upload by path (complete lines only), or None when none are sent."""
        if not self.sends_rollouts:
            yield None
            return
        assert self.run.rollouts_fpath is not None
        with complete_rollouts(self.run.rollouts_fpath, self.plan) as complete:
            yield complete

    def rollouts_table(self) -> RolloutsTable | None:
        """NeMo Gym's rollouts table (``rollouts.json``) as the export's one read of the rollouts
        wrote it (its ``path`` and ``rows``; for a backend with ``ships_rollouts_table``: the
        rollouts are not read again),
        or None: make it from ``rollouts_file()`` (no such read, rollouts not sent, or secrets to
        mask: the read writes each line as it is)."""
        if not self.sends_rollouts or self.secrets:
            return None
        from gym_artifacts.run.rollouts_facts import rollouts_table

        return rollouts_table(self.run)

    # -- files to ship ----------------------------------------------------------------------------
    def _artifact(self, kind: str, name: str, fpath: Path) -> PayloadArtifact:
        return PayloadArtifact(kind, name, fpath, artifact_content(kind, fpath, self.secrets))

    @cached_property
    def aggregate_file(self) -> PayloadArtifact | None:
        """``aggregate_metrics.json`` (masked when it holds a secret), or None."""
        if self.aggregate_entries is None:
            return None
        return self._artifact(AGGREGATE, "aggregate_metrics.json", self.run.aggregate_metrics_fpath)

    @cached_property
    def acceptance_file(self) -> PayloadArtifact | None:
        """``acceptance.json`` (masked when it holds a secret), or None."""
        if not (self.run.has_rollouts_file and self.run.acceptance_fpath.is_file()):
            return None
        return self._artifact(ACCEPTANCE, "acceptance.json", self.run.acceptance_fpath)

    @cached_property
    def sidecars(self) -> list[PayloadArtifact]:
        """NeMo Gym's sidecar files under their artifact names, each masked by value if needed."""
        return [self._artifact(SIDECAR, name, f) for name, f in self.run.sidecar_files().items()]

    @cached_property
    def runtime_artifacts(self) -> list[PayloadArtifact]:
        """``OUT_artifacts/`` files by relative name; a small JSON/YAML one holding a secret masked."""
        return [self._artifact(RUNTIME, rel, f) for rel, f in self.run.runtime_artifact_files().items()]


def _redacted_values(values: dict[str, Any], secrets: frozenset[str]) -> dict[str, Any]:
    from gym_artifacts.core.secrets import redact_secret_values

    return {k: redact_secret_values(v, secrets) if isinstance(v, str) else v for k, v in values.items()}


def _redacted_table(table: LevelTable, secrets: frozenset[str]) -> LevelTable:
    """The table with the config's secret values redacted from its text cells (the table itself
    when no cell holds one: one scan of the joined cells decides, not a search per cell)."""
    from dataclasses import replace

    from gym_artifacts.core.secrets import redact_secret_values
    from gym_artifacts.run.aggregate_read import SpooledRows

    # No shortcut for empty ``secrets``: the process's known secrets are redacted too.
    if isinstance(table.rows, SpooledRows):  # on disk: redacted as each row is read back
        return replace(table, rows=table.rows.redacted(secrets))
    joined = "\n".join(c for row in table.rows for c in row if isinstance(c, str))
    if redact_secret_values(joined, secrets) == joined:
        return table
    rows = [[redact_secret_values(c, secrets) if isinstance(c, str) else c for c in r] for r in table.rows]
    return replace(table, rows=rows)


@contextlib.contextmanager
def complete_rollouts(rollouts: Path, plan: ExportPlan) -> Iterator[Path]:
    """The rollouts file to send: itself, or a temporary copy of its complete lines when the
    user chose to leave a torn last line out."""
    torn = plan.partial_line
    if torn is None:
        yield rollouts
        return
    with tempfile.TemporaryDirectory(prefix="gym-artifacts-complete-") as tmp:
        dest = Path(tmp) / rollouts.name
        with open(rollouts, "rb") as src, open(dest, "wb") as out:
            remaining = torn.complete_bytes
            while remaining > 0:
                block = src.read(min(remaining, 1 << 20))
                if not block:
                    break
                out.write(block)
                remaining -= len(block)
        yield dest


def partial_line_record(plan: ExportPlan) -> dict[str, int]:
    """What a backend run records about a left-out torn last line (empty when none was)."""
    if plan.partial_line is None:
        return {}
    return {"omitted_partial_lines": 1, "omitted_partial_line_bytes": plan.partial_line.partial_bytes}
