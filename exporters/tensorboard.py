"""The TensorBoard backend: event files TensorBoard reads, live and post-run.

Mapping: step metrics as scalars at their original steps and wall times; aggregate metrics as
scalars under NeMo Gym's own exporter's names with ``coverage/*`` (``gym_artifacts.run.aggregate``;
text leaves as text), the per-task and per-repeat levels as Markdown texts ``tables/<level>`` of
a chosen few readable columns (index, counts, reward and token means), every column in
``tables/<level>.jsonl`` beside the event files; the NVML summary and series as ``system/...``
scalars; the masked config as the ``config`` text; the rollouts' numeric verdicts (``reward``
first) and token counts (``input_tokens``, ``output_tokens``, ``total_tokens`` from each
Response's ``usage``) as histograms ``rollouts/<name>`` (TensorBoard's Histograms and
Distributions tabs), one per step where the step is the number of rollouts covered so far (a
post-run export: one, over the whole run); the first ``table_rows`` rollouts as a Markdown
text table (``rollouts/table``, 50 rows a step). Runtime artifacts (recording, profiler trace)
have no TensorBoard form and are not sent.

Exactly once: a post-run export writes ``<logdir>/<run name>-<identity>/`` into a hidden
partial folder renamed into place at the end, so the folder exists whole or not at all; an export
that finds its folder (it died before the receipt) writes nothing new. A live run writes
``<logdir>/<run name>-live-<id>/``; a resumed run appends a new event file to the same folder.
The SDK (``tensorboard``'s protos and record writer) is imported only when writing.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import socket
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pydantic import Field

from gym_artifacts.plugin import (
    CannotCertify,
    ExporterConfig,
    ExportPlan,
    GymArtifactsError,
    LevelTable,
    LiveExporter,
    RunArtifacts,
    RunPayload,
    RunStatus,
    Sent,
    Trajectory,
    canonical_json,
    eval_end_s,
    failed_trajectory,
    flatten,
    json_safe,
    metric_value,
    open_regular,
    read_json,
    redact_text,
    resolved_path,
    rollout_numbers,
    rollout_row_values,
    rollout_window,
    saved_config_run_name,
    token_counts,
    trajectory_of,
    write_table_jsonl,
)

from ._histogram import Histogram
from ._rollouts import (
    READABLE_COLUMNS,
    Rollout,
    failed_rollouts,
    is_responses_record,
    readable_row,
    request_text,
    response_text,
    rollout_from_record,
)
from ._tfrecord import tfrecord

TABLE_CHUNK = 50
CELL_CHARS = 200
PARTIAL_PREFIX = ".partial-"
# In each complete run folder: the run's identity, so that a copy of the run finds its folder.
IDENTITY_FILE = ".gym-artifacts-run.json"
EVENT_FILE_PREFIX = "events.out.tfevents."
_UNSAFE = re.compile(r"[^\w.\-]+")


class TensorboardSettings(ExporterConfig):
    """Settings of ``exporters.tensorboard``."""

    logdir: str = "./tensorboard-runs"
    run_name: str | None = None
    # Rollouts shown in the text table (every rollout's verdicts are scalars regardless).
    table_rows: int = Field(default=1000, ge=0, le=100_000)


def folder_name(text: str) -> str:
    """A safe single path component for a run folder."""
    name = _UNSAFE.sub("_", text).strip("._") or "run"
    return name[:100]


class EventWriter:
    """One TensorBoard event file, written synchronously (flushed on demand)."""

    def __init__(self, dpath: Path) -> None:
        from tensorboard.compat.proto import event_pb2

        dpath.mkdir(parents=True, exist_ok=True)
        self._event_pb2 = event_pb2
        # TensorBoard reads a folder's event files in name order: nanoseconds keep appends in order.
        unique = f"{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
        self.fpath = dpath / f"{EVENT_FILE_PREFIX}{time.time_ns():020d}.{unique}"
        self._fh = open_regular(self.fpath, "wb")  # closed by close()
        self.bytes = 0
        self._write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))

    def _write(self, event: Any) -> None:
        """One event as a TFRecord (``_tfrecord``: TensorBoard's framing, without importing its
        writer and the TensorFlow stub behind it)."""
        data = event.SerializeToString()
        self._fh.write(tfrecord(data))
        self.bytes += len(data) + 16

    def scalars(self, values: dict[str, float], step: int, wall_time: float) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary

        if not values:
            return
        summary = Summary(value=[Summary.Value(tag=k, simple_value=v) for k, v in values.items()])
        self._write(self._event_pb2.Event(wall_time=wall_time, step=step, summary=summary))

    def histograms(self, histograms: dict[str, Histogram], step: int, wall_time: float) -> None:
        """One event holding a histogram per tag (the empty ones left out)."""
        from tensorboard.compat.proto.summary_pb2 import HistogramProto, Summary

        values = []
        for tag, h in histograms.items():
            if not h.num:
                continue
            limits, counts = h.buckets()
            proto = HistogramProto(min=h.min, max=h.max, num=h.num, sum=h.sum,
                                   sum_squares=h.sum_squares, bucket_limit=limits, bucket=counts)  # fmt: skip
            values.append(Summary.Value(tag=tag, histo=proto))
        if values:
            self._write(self._event_pb2.Event(wall_time=wall_time, step=step, summary=Summary(value=values)))

    def text(self, tag: str, text: str, step: int, wall_time: float) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
        from tensorboard.compat.proto.tensor_pb2 import TensorProto
        from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
        from tensorboard.plugins.text.plugin_data_pb2 import TextPluginData

        metadata = SummaryMetadata(
            plugin_data=SummaryMetadata.PluginData(
                plugin_name="text", content=TextPluginData(version=0).SerializeToString()
            )
        )
        tensor = TensorProto(
            dtype="DT_STRING",
            string_val=[text.encode("utf-8")],
            tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=1)]),
        )
        summary = Summary(value=[Summary.Value(tag=tag, metadata=metadata, tensor=tensor)])
        self._write(self._event_pb2.Event(wall_time=wall_time, step=step, summary=summary))

    def flush(self) -> None:
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


def split_values(values: dict[str, Any], prefix: str = "") -> tuple[dict[str, float], dict[str, str]]:
    """Numeric leaves as scalars and text leaves as texts, keyed by their flattened path."""
    numbers: dict[str, float] = {}
    texts: dict[str, str] = {}
    for key, value in flatten(values, prefix).items():
        number = metric_value(value)
        if number is not None:
            numbers[key] = number
        elif isinstance(value, str):
            texts[key] = value
    return numbers, texts


def _cell(value: Any) -> str:
    text = value if isinstance(value, str) else ("" if value is None else str(value))
    text = " ".join(text.split()).replace("|", "\\|")
    return text if len(text) <= CELL_CHARS else text[: CELL_CHARS - 1] + "…"


TABLE_HEADER = (
    "| row | task | repeat | agent | request | response | verdicts |\n|---|---|---|---|---|---|---|\n"
)


# The columns a per-task or per-repeat table shows, in this order, when the level has them; the
# rest (min/max/median/std of every figure, samples, rollout details) is in the attached file.
LEVEL_COLUMNS = (
    "num_rollouts", "sample_count", "expected_num_rollouts", "missing_num_rollouts", "missing_count",
    "mean/reward", "std/reward", "ci_low_95/reward", "ci_high_95/reward", "mean/input_tokens",
    "mean/output_tokens",
)  # fmt: skip


def level_columns(table: LevelTable) -> list[str]:
    """The index, the agent when the level has more than one, then ``LEVEL_COLUMNS`` present."""
    agents = {row[table.columns.index("agent")] for row in table.rows} if "agent" in table.columns else set()
    shown = [table.index] + (["agent"] if len(agents) > 1 else [])
    return shown + [c for c in LEVEL_COLUMNS if c in table.columns]


def _redacted_line(line: bytes, secrets: frozenset[str]) -> bytes:
    """One JSON line through ``redact_text`` (a line never holds a raw line break): ``secrets``,
    the known secrets and credential shapes (a URL's ``user:password@``), with or without
    ``secrets``."""
    return redact_text(line.decode(), secrets).encode()


def level_markdown(table: LevelTable, limit: int, attached: str) -> str:
    """A per-task or per-repeat level as a Markdown table of a few readable columns and its first
    ``limit`` rows; ``attached`` names the file that holds every column and row."""

    def cell(value: Any) -> str:
        text = f"{value:.4g}" if isinstance(value, float) else ("" if value is None else str(value))
        return " ".join(text.split()).replace("|", "\\|")[:200]  # every line break (\r, U+2028...) too

    shown = level_columns(table)
    where = [table.columns.index(c) for c in shown]
    head = "| " + " | ".join(cell(c) for c in shown) + " |\n|" + "---|" * len(shown) + "\n"
    body = "".join("| " + " | ".join(cell(row[i]) for i in where) + " |\n" for row in table.rows[:limit])
    more = len(table.rows) - limit
    note = f"\n{more} more rows. " if more > 0 else "\n"
    return (
        head
        + body
        + note
        + f"Every column ({len(table.columns)}) and row: `{attached}` beside the event files.\n"
    )


READABLE_HEADER = (
    "| row | " + " | ".join(READABLE_COLUMNS) + " |\n|" + "---|" * (len(READABLE_COLUMNS) + 1) + "\n"
)
DISTRIBUTION_STEPS = 10  # histogram snapshots of a post-run export: TensorBoard draws one step blank


def readable_table_row(label: str, trajectory: Trajectory) -> str:
    """One NeMo Gym rollout as a row of ``READABLE_COLUMNS`` (``label``: its line or failure row)."""
    cells = (label, *readable_row(trajectory))
    return "| " + " | ".join(_cell(c) for c in cells) + " |\n"


def rollout_scalars(numbers: list[tuple[str, float]]) -> dict[str, float]:
    """A rollout's own values as scalars ``rollout/<name>`` (its verdicts and token counts)."""
    return {f"rollout/{name}": value for name, value in numbers}


def table_row(r: Rollout) -> str:
    verdicts = ", ".join(f"{k}={v:g}" for k, v in r.verdicts.items())
    cells = (r.row, r.task, r.repeat, r.agent, request_text(r.request), response_text(r.response), verdicts)
    return "| " + " | ".join(_cell(c) for c in cells) + " |\n"


class TensorboardExporter(LiveExporter):
    """TensorBoard event files in ``logdir``, one folder per run."""

    name = "tensorboard"
    config_model = TensorboardSettings
    sdk_module = "tensorboard"
    reads_row_values = True  # every row's numbers and end come from the export's one read
    settings: TensorboardSettings

    @classmethod
    def contract_settings(cls, folder: Path) -> dict[str, Any]:
        return {"logdir": str(folder / "tensorboard")}

    def __init__(self, settings: TensorboardSettings) -> None:
        super().__init__(settings)
        self._writer: EventWriter | None = None
        self._rollout_row = 0
        self._table: list[str] = []

    @property
    def logdir(self) -> Path:
        return Path(resolved_path(self.settings.logdir))

    @classmethod
    def destination_for(cls, settings: TensorboardSettings) -> dict[str, Any]:
        """The resolved log folder: a relative one means another folder in another working
        folder. ``run_name`` and ``table_rows`` only shape the run, not where it goes."""
        return {"logdir": resolved_path(settings.logdir)}

    def backend_run_exists(self, backend_run_id: str) -> bool | None:
        """The run folder is still in the log folder with an event file (``--verify``): a run
        folder deleted after its export is exported anew, never trusted into nothing."""
        folder = self.logdir / backend_run_id
        if folder.parent != self.logdir or not folder.is_dir():
            return False
        return any(entry.name.startswith(EVENT_FILE_PREFIX) for entry in folder.iterdir())

    # -- live ----------------------------------------------------------------------------------
    def _setup(self) -> str:
        assert self.run is not None
        run_id = self.resume_run_id
        if run_id is None or not (self.logdir / run_id).is_dir():
            base = folder_name(self.settings.run_name or saved_config_run_name(self.run, self.name))
            run_id = f"{base}-live-{uuid.uuid4().hex[:12]}"
            self._rollout_row = 0
        else:  # reopened: rows continue after the ones the file already holds
            from gym_artifacts.plugin import count_lines

            fpath = self.run.rollouts_fpath
            self._rollout_row = count_lines(fpath) if fpath is not None and fpath.is_file() else 0
        self._writer = EventWriter(self.logdir / run_id)
        self._writer.flush()
        return run_id

    def _log_config(self, config: dict[str, Any]) -> None:
        assert self._writer is not None
        self._writer.text("config", config_markdown(config), 0, time.time())
        self._writer.flush()

    def _log_metrics(self, metrics: dict[str, Any], step: int, timestamp: float) -> None:
        self._log_metrics_batch([(metrics, step, timestamp)])

    def _log_metrics_batch(self, entries: list[tuple[dict[str, Any], int, float]]) -> None:
        assert self._writer is not None
        for metrics, step, timestamp in entries:
            numbers, texts = split_values(metrics)
            self._writer.scalars(numbers, step, timestamp)
            for tag, text in texts.items():
                self._writer.text(tag, redact_text(text, self.secrets), step, timestamp)
        self._writer.flush()

    def _log_rollouts(self, rollouts: list[Any]) -> None:
        assert self._writer is not None
        histograms = RolloutHistograms()
        now = time.time()
        for record in rollouts:
            numbers = rollout_numbers(record)
            histograms.add_numbers(numbers)
            end = rollout_window(record)[1]
            self._writer.scalars(rollout_scalars(numbers), self._rollout_row, end if end is not None else now)
            self._rollout_row += 1
        self._writer.histograms(histograms.by_tag, self._rollout_row, now)
        self._writer.flush()

    def _teardown(self, status: RunStatus) -> None:
        if self._writer is not None:
            self._writer.text("status", status.value, 0, time.time())
            self._writer.close()
            self._writer = None

    # -- post-run --------------------------------------------------------------------------------
    def _export(self, run: RunArtifacts, plan: ExportPlan) -> Sent:
        base = folder_name(self.settings.run_name or saved_config_run_name(run, self.name))
        name = f"{base}-{plan.run_identity.split(':')[-1][:16]}"
        final = self.logdir / name
        if final.is_dir():  # an earlier export finished writing but died before its receipt
            return Sent(backend_run_id=name, note="run folder already complete; nothing new written")
        holder = self._folder_of(plan.run_identity)
        if holder is not None:  # a copy of this run, or its certified live run, is here already
            return Sent(backend_run_id=holder, note=f"already in {holder} (it holds this run's identity)")
        partial, writer, rows = self._write_partial(name, run, plan)
        os.replace(partial, final)
        return Sent(backend_run_id=name, rows=rows, bytes=writer.bytes)

    def _write_partial(self, name: str, run: RunArtifacts, plan: ExportPlan) -> tuple[Path, EventWriter, int]:
        """The whole run written into a hidden partial folder for ``name`` (an earlier attempt's
        removed first), its identity recorded in it (``IDENTITY_FILE``)."""
        self.logdir.mkdir(parents=True, exist_ok=True)
        for stale in self.logdir.glob(f"{PARTIAL_PREFIX}{name}-*"):
            shutil.rmtree(stale, ignore_errors=True)
        partial = self.logdir / f"{PARTIAL_PREFIX}{name}-{os.getpid()}"
        writer = EventWriter(partial)
        try:
            rows = self._write_run(writer, run, plan)
        finally:
            writer.close()
        (partial / IDENTITY_FILE).write_bytes(canonical_json({"run_identity": plan.run_identity}))
        return partial, writer, rows

    def _folder_of(self, run_identity: str) -> str | None:
        """The run folder in ``logdir`` that holds ``run_identity`` complete, if any."""
        if not self.logdir.is_dir():
            return None
        for folder in sorted(self.logdir.iterdir()):
            if folder.name.startswith("."):
                continue
            try:  # read without blocking: any entry may be anything (a FIFO, a folder)
                recorded = read_json(folder / IDENTITY_FILE, "run identity")
            except GymArtifactsError:  # missing, unreadable or not JSON: not a run of this identity
                continue
            if isinstance(recorded, dict) and recorded.get("run_identity") == run_identity:
                return folder.name
        return None

    def _certify(self, run: RunArtifacts, plan: ExportPlan, live_run_id: str) -> Sent:
        """The live run's folder made the whole run: the run written anew (every journal step,
        aggregates, tables, rollouts), its event files then put in place of the live ones, so
        each point is there once whatever the live run lost. A kill between the two leaves both
        (a retry replaces them again)."""
        live = self.logdir / live_run_id
        if not live.is_dir() or live.is_symlink():
            raise CannotCertify(f"live run folder {live} is gone")
        partial, writer, rows = self._write_partial(live_run_id, run, plan)
        old = {entry.name for entry in live.iterdir()}
        written = sorted(partial.iterdir(), key=lambda p: not p.name.startswith(EVENT_FILE_PREFIX))
        for entry in written:  # the new event file first, then what goes beside it
            target = live / entry.name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            os.replace(entry, target)
        self._remove_entries(live, old - {entry.name for entry in written})
        shutil.rmtree(partial, ignore_errors=True)
        return Sent(backend_run_id=live_run_id, rows=rows, bytes=writer.bytes)

    @staticmethod
    def _remove_entries(folder: Path, names: set[str]) -> None:
        """The live run's own files, once the whole run's are in place beside them."""
        for name in names:
            entry = folder / name
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)

    def _write_run(self, w: EventWriter, run: RunArtifacts, plan: ExportPlan) -> int:
        payload = RunPayload.of(run, plan)
        finished = eval_end_s(run)
        if payload.config is not None:
            w.text("config", config_markdown(payload.config), 0, finished)
        for entry in payload.journal():
            numbers, texts = split_values(entry.metrics)
            step = entry.step if entry.step is not None else 0
            w.scalars(numbers, step, entry.time)
            for tag, text in texts.items():
                w.text(tag, redact_text(text, payload.secrets), step, entry.time)
        numbers, texts = split_values(payload.history_values)
        w.scalars(numbers, 0, finished)
        if payload.coverage is not None:
            texts["coverage/text"] = payload.coverage.text()
        for table in payload.tables:  # TensorBoard has no table artifacts: a Markdown text per level
            attached = f"tables/{table.name}.jsonl"
            (w.fpath.parent / "tables").mkdir(exist_ok=True)
            with open(w.fpath.parent / attached, "wb") as fh:  # a line at a time: any size
                write_table_jsonl(table, lambda line: fh.write(_redacted_line(line, payload.secrets)))
            texts[f"tables/{table.name}"] = level_markdown(table, self.settings.table_rows, attached)
        for tag, text in texts.items():
            w.text(tag, redact_text(text, payload.secrets), 0, finished)
        self._write_system(w, payload, finished)
        if not payload.sends_rollouts:
            return 0
        records = payload.rollout_records()
        values = rollout_row_values(run)  # from the export's one read of the rollouts, when given
        rows = self._write_rollouts(w, records, payload.secrets, finished, payload.rollout_rows, values)
        self._write_failures(w, payload, min(rows, self.settings.table_rows), finished)
        return rows

    def _write_failures(self, w: EventWriter, payload: RunPayload, step: int, finished: float) -> None:
        """The failed rollouts (failures sidecar, with their planned input) as rows of the table,
        after the scored ones (the table's limit applies to the scored rows only)."""
        rows = [readable_table_row(f"failed/{t.row}", t)
                for t in (failed_trajectory(i, r, p) for i, r, p in failed_rollouts(payload))]  # fmt: skip
        for start in range(0, len(rows), TABLE_CHUNK):
            chunk = rows[start : start + TABLE_CHUNK]
            w.text("rollouts/table", redact_text(READABLE_HEADER + "".join(chunk), payload.secrets),
                   step + start, finished)  # fmt: skip

    @staticmethod
    def _write_system(w: EventWriter, payload: RunPayload, finished: float) -> None:
        figures, reason = payload.nvml_summary
        if reason is not None:
            w.text("system/nvml", reason, 0, finished)
        w.scalars({f"system/{k}": v for k, v in figures.items()}, 0, finished)
        steps: dict[int, int] = {}
        for sample in payload.nvml_series():
            step = steps.get(sample.gpu, 0)
            steps[sample.gpu] = step + 1
            values = {f"system/gpu{sample.gpu}/{k}": v for k, v in sample.metrics.items()}
            w.scalars(values, step, sample.time)

    def _write_rollouts(
        self,
        w: EventWriter,
        records: Iterator[Any],
        secrets: frozenset[str],
        finished: float,
        total: int = 0,
        values: Iterable[tuple[list[tuple[str, float]], float | None]] | None = None,
    ) -> int:
        """Each rollout's values as scalars ``rollout/<name>`` at its index in completion order
        (``OUT.jsonl``'s line order; wall time: its end when known), the histograms of every
        rollout so far at ``DISTRIBUTION_STEPS`` steps (the step: rollouts so far; ``total``: how
        many there are), and the bounded table: a NeMo Gym rollout as ``READABLE_COLUMNS`` (its
        trajectory), another writer's as its request, response and verdicts. Only a row the table
        shows is turned into a view; every row gives the same values (``rollout_numbers``).
        ``values``: each row's numbers and end, given by the export's one read of the rollouts:
        then only the table's rows are read from ``records``."""
        limit = self.settings.table_rows
        every = max(1, -(-total // DISTRIBUTION_STEPS))
        rows = 0
        chunk: list[str] = []
        header = TABLE_HEADER

        def write_chunk() -> None:
            table = redact_text(header + "".join(chunk), secrets)
            w.text("rollouts/table", table, min(rows, limit) - len(chunk), finished)
            chunk.clear()

        histograms = RolloutHistograms()
        if values is None:
            rows_in = ((r, rollout_numbers(r), rollout_window(r)[1]) for r in records)
        else:  # only the rows the table shows are read
            head = itertools.islice(records, limit)
            rows_in = ((next(head, None) if i < limit else None, *v) for i, v in enumerate(values))
        for record, numbers, end in rows_in:
            histograms.add_numbers(numbers)
            w.scalars(rollout_scalars(numbers), rows, end if end is not None else finished)
            if rows < limit:
                if is_responses_record(record):
                    header = READABLE_HEADER
                    chunk.append(readable_table_row(str(rows), trajectory_of(rows, record)))
                else:
                    chunk.append(table_row(rollout_from_record(rows, record)))
            rows += 1
            if len(chunk) == TABLE_CHUNK:
                write_chunk()
            if rows % every == 0 and rows < total:
                w.histograms(histograms.by_tag, rows, finished)
        close = getattr(records, "close", None)
        if close is not None:
            close()  # a stream stopped after the table's rows lets go of the file
        if chunk:
            write_chunk()
        w.histograms(histograms.by_tag, rows, finished)
        if rows > limit:
            w.text("rollouts/table_note", f"table shows the first {limit} of {rows} rollouts", 0, finished)
        return rows


class RolloutHistograms:
    """One histogram per verdict (``reward`` first) and per token count, over the rollouts added.

    Values wait in a bounded buffer per name and go into their histogram a batch at a time
    (``Histogram.extend``: the per-value work in C); memory stays constant in rollouts."""

    BATCH = 4096

    def __init__(self) -> None:
        self._histograms: dict[str, Histogram] = {}
        self._pending: dict[str, list[float]] = {}

    def add(self, r: Rollout) -> None:
        self.add_numbers((*r.verdicts.items(), *token_counts(r.response).items()))

    def add_numbers(self, numbers: Iterable[tuple[str, float]]) -> None:
        """One rollout's ``(name, value)`` pairs (``rollout_numbers``)."""
        for name, value in numbers:
            pending = self._pending.get(name)
            if pending is None:
                pending = self._pending[name] = []
                self._histograms[name] = Histogram()
            pending.append(value)
            if len(pending) >= self.BATCH:
                self._histograms[name].extend(pending)
                pending.clear()

    @property
    def by_tag(self) -> dict[str, Histogram]:
        """Every histogram under its tag ``rollouts/<name>``, with all values added so far."""
        for name, pending in self._pending.items():
            self._histograms[name].extend(pending)
            pending.clear()
        return {f"rollouts/{name}": h for name, h in self._histograms.items()}


def config_markdown(config: dict[str, Any]) -> str:
    """The masked config as a fenced JSON block (TensorBoard renders text as Markdown)."""
    return "```json\n" + canonical_json(json_safe(config)).decode() + "\n```"
