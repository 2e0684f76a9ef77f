"""One run's rollouts collapsed to one value per task and metric, with its failed and planned tasks.

The task key: NeMo Gym's ``_ng_task_index`` (the input row a rollout came from; every repeat of
a task shares it). Rollouts of other writers are keyed by the first of ``TASK_KEYS`` they hold
(an integer or a non-empty string); a rollout with none is counted as unkeyed, never paired.

A rollout's metrics: its top-level numbers (``reward`` and any a verifier adds; not booleans,
not NeMo Gym's ``_ng_*`` bookkeeping) and the token counts of its Response's ``usage``
(``input_tokens``, ``output_tokens``, ``total_tokens``: what NeMo Gym's aggregate reports as
``mean/<name>``). A task's value of a metric is the mean over its scored rollouts, which is
NeMo Gym's per-task ``mean/<metric>`` in ``group_level_metrics``.

Failed rollouts (NeMo Gym's failures sidecar ``OUT_failures.jsonl``) have no reward: they are
counted per task, and a task whose every rollout failed has no value (it is shown as failed,
never as a zero). Planned tasks come from ``OUT_materialized_inputs.jsonl`` when present.

Task identity: a key says which row a rollout came from, not what was asked. Each task's input
(``responses_create_params``: its ``input`` messages, ``instructions`` and ``tools``; sampling
settings are the run's, not the task's) is hashed per run (``input_digest``), so that two runs
that number different questions alike are caught (``comparison``). The benchmark a run is on is
the set of its environment servers (NeMo Gym's ``_ng_environment_server``).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gym_artifacts.core.errors import RunError
from gym_artifacts.core.jsonio import iter_jsonl
from gym_artifacts.run.artifacts import RunArtifacts, agent_label
from gym_artifacts.run.coverage import Coverage, coverage_of
from gym_artifacts.run.responses_api import last_user_message, response_text, tool_calls
from gym_artifacts.run.torn import PartialLine

TASK_KEYS = ("_ng_task_index", "task_index", "task_id")
USAGE_METRICS = ("input_tokens", "output_tokens", "total_tokens")
PRIMARY_METRIC = "reward"
SAMPLE_CHARS = 4000  # of a prompt or response shown for one rollout
SAMPLES_PER_TASK = 4  # rollouts of one task shown per run

TaskKey = int | str
SCALE = 2.0**-64  # running sums are also kept scaled by this, for values whose plain sum overflows
TASK_INPUT_FIELDS = ("input", "instructions", "tools")


def key_id(key: TaskKey) -> str:
    """A task key as one string, end to end (the page, its script, its select box): integers of
    any size stay exact (JavaScript numbers are not past 2**53) and ``1`` is not ``"1"``."""
    return json.dumps(key, ensure_ascii=False)


def _without_defaults(value: Any) -> Any:
    """``value`` with None fields dropped, and a message item's default ``type`` (NeMo Gym writes
    the request in full in the rollouts and in short in the materialized inputs)."""
    if isinstance(value, dict):
        return {
            k: _without_defaults(v)
            for k, v in value.items()
            if v is not None and not (k == "type" and v == "message")
        }
    if isinstance(value, list):
        return [_without_defaults(v) for v in value]
    return value


def input_digest(record: Any) -> str | None:
    """A digest of the task's input (see the module doc), or None when the record has none."""
    params = record.get("responses_create_params") if isinstance(record, dict) else None
    if not isinstance(params, dict):
        return None
    task_input = {k: _without_defaults(params.get(k)) for k in TASK_INPUT_FIELDS if params.get(k) is not None}
    if not task_input:
        return None
    text = json.dumps(task_input, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()


def task_key(record: Any) -> tuple[str, TaskKey] | None:
    """``(field, value)`` of the first task key ``record`` holds, or None."""
    if not isinstance(record, dict):
        return None
    for name in TASK_KEYS:
        value = record.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return name, value
        if isinstance(value, str) and value:
            return name, value
    return None


def sort_key(key: TaskKey) -> tuple[int, int, str]:
    """Integers in numeric order, then strings."""
    return (0, key, "") if isinstance(key, int) else (1, 0, key)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def rollout_metrics(record: dict[str, Any]) -> dict[str, float]:
    """The numbers a rollout is compared on (see the module doc)."""
    out: dict[str, float] = {}
    for name, value in record.items():
        if name.startswith("_") or name in TASK_KEYS:
            continue
        number = _number(value)
        if number is not None:
            out[name] = number
    response = record.get("response")
    usage = response.get("usage") if isinstance(response, dict) else None
    if isinstance(usage, dict):
        for name in USAGE_METRICS:
            number = _number(usage.get(name))
            if number is not None and name not in out:
                out[name] = number
    return out


@dataclass
class RunTasks:
    """Per-task values of one run (sums and counts while reading; means when asked)."""

    run: RunArtifacts
    coverage: Coverage | None
    key_fields: set[str] = field(default_factory=set)
    sums: dict[TaskKey, dict[str, list[float]]] = field(
        default_factory=dict
    )  # metric -> [sum, count, sum * SCALE]
    scored: dict[TaskKey, int] = field(default_factory=dict)
    failed: dict[TaskKey, int] = field(default_factory=dict)
    planned: set[TaskKey] | None = None
    inputs: dict[TaskKey, str] = field(default_factory=dict)  # the task's input digest (first seen)
    benchmarks: set[str] = field(default_factory=set)  # environment servers of its rollouts
    unkeyed_scored: int = 0
    unkeyed_failed: int = 0
    torn: PartialLine | None = None
    note: str | None = None
    label: str | None = None  # set when two runs of one comparison would share ``name``

    @property
    def name(self) -> str:
        """The run's stem with its folder (``clean/rollouts``): NeMo Gym runs often share a stem."""
        if self.label is not None:
            return self.label
        folder = self.run.stem.parent.name
        return f"{folder}/{self.run.name}" if folder and self.run.has_rollouts_file else self.run.name

    def metrics(self) -> list[str]:
        """Every metric some task has, ``reward`` first, then by name."""
        names = {m for metrics in self.sums.values() for m in metrics}
        return sorted(names, key=lambda m: (m != PRIMARY_METRIC, m))

    def means(self, metric: str) -> dict[TaskKey, float]:
        """``{task: mean over its scored rollouts}`` for the tasks that have ``metric``."""
        out: dict[TaskKey, float] = {}
        for key, metrics in self.sums.items():
            acc = metrics.get(metric)
            if acc is not None and acc[1]:
                mean = acc[0] / acc[1]
                out[key] = mean if math.isfinite(mean) else (acc[2] / acc[1]) / SCALE
        return out

    def scored_task_count(self) -> int:
        """Tasks with a scored rollout (NeMo Gym's number of per-task groups)."""
        return sum(1 for count in self.scored.values() if count)

    def tasks(self) -> set[TaskKey]:
        """Every task this run knows of: scored, failed or planned."""
        return set(self.scored) | set(self.failed) | (self.planned or set())

    def state(self, key: TaskKey) -> str:
        """``scored``, ``failed`` (every rollout failed), ``no result`` (planned only) or ``absent``."""
        if self.scored.get(key):
            return "scored"
        if self.failed.get(key):
            return "failed"
        if self.planned is not None and key in self.planned:
            return "no result"
        return "absent"

    def summary(self) -> dict[str, Any]:
        return {
            "run": self.run.source,
            "name": self.name,
            "task_key": sorted(self.key_fields) or None,
            "tasks_scored": self.scored_task_count(),
            "tasks_failed": sum(1 for k in self.failed if not self.scored.get(k)),
            "tasks_planned": None if self.planned is None else len(self.planned),
            "rollouts_scored": sum(self.scored.values()) + self.unkeyed_scored,
            "rollouts_failed": sum(self.failed.values()) + self.unkeyed_failed,
            "rollouts_unkeyed": self.unkeyed_scored + self.unkeyed_failed,
            "coverage": None if self.coverage is None else self.coverage.to_json(),
            "partial_last_line": self.torn is not None,
            "note": self.note,
        }


def _keyed(tasks: RunTasks, record: Any) -> TaskKey | None:
    found = task_key(record)
    if found is None:
        return None
    tasks.key_fields.add(found[0])
    _identify(tasks, found[1], record)
    return found[1]


def _identify(tasks: RunTasks, key: TaskKey, record: dict[str, Any]) -> None:
    """Record the task's input digest (first seen) and the run's benchmark."""
    if key not in tasks.inputs:
        digest = input_digest(record)
        if digest is not None:
            tasks.inputs[key] = digest
    server = record.get("_ng_environment_server")
    if isinstance(server, str) and server:
        tasks.benchmarks.add(server)


def read_run_tasks(run: RunArtifacts | str | Path) -> RunTasks:
    """Read a run's rollouts, failures sidecar and planned inputs into per-task values.

    A torn last rollouts line (the writer was killed) is left out and recorded. RunError for a
    run that does not exist or a line that is not JSON.
    """
    run = run if isinstance(run, RunArtifacts) else RunArtifacts.from_path(run)
    run.require_present()
    rollouts = run.rollouts_fpath
    if rollouts is None or not rollouts.is_file():
        what = "an artifacts folder" if not run.has_rollouts_file else "its rollouts file is missing"
        return RunTasks(run=run, coverage=None, note=f"no rollouts ({what}): no task to pair")
    tasks = RunTasks(run=run, coverage=coverage_of(run), torn=run.partial_rollouts_line())
    end = tasks.torn.complete_bytes if tasks.torn else None
    for _, record in iter_jsonl(rollouts, "rollouts JSONL", end=end):
        key = _keyed(tasks, record)
        if key is None:
            tasks.unkeyed_scored += 1
            continue
        tasks.scored[key] = tasks.scored.get(key, 0) + 1
        per_task = tasks.sums.setdefault(key, {})
        for metric, value in rollout_metrics(record).items():
            acc = per_task.setdefault(metric, [0.0, 0, 0.0])  # sum, count, sum * SCALE
            acc[0] += value
            acc[1] += 1
            acc[2] += value * SCALE
    if run.failures_fpath.is_file():
        for _, record in iter_jsonl(run.failures_fpath, "failures JSONL"):
            key = _keyed(tasks, record)
            if key is None:
                tasks.unkeyed_failed += 1
            else:
                tasks.failed[key] = tasks.failed.get(key, 0) + 1
    if run.materialized_inputs_fpath.is_file():
        tasks.planned = set()
        for _, record in iter_jsonl(run.materialized_inputs_fpath, "materialized inputs JSONL"):
            found = task_key(record)
            if found is not None:
                tasks.planned.add(found[1])
                _identify(tasks, found[1], record)
    return tasks


def _cut(text: str, limit: int = SAMPLE_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def sample_of(record: Any, failed: bool) -> dict[str, Any]:
    """What a person reads of one rollout: repeat, reward, prompt, response, tool calls, failure."""
    if not isinstance(record, dict):
        return {"failed": failed, "response": _cut(json.dumps(record, default=str))}
    failure = record.get("failure_kind") or record.get("_ng_failure_class") or record.get("_ng_failure_type")
    reason = record.get("failure_reason") or record.get("_ng_failure_message")
    responses_api = "responses_create_params" in record or "response" in record
    text = response_text(record.get("response")) if responses_api else ""
    if not responses_api:
        shown = {k: v for k, v in record.items() if not k.startswith("_")}
        text = json.dumps(shown, ensure_ascii=False, default=str)
    repeat = record.get("_ng_rollout_index", record.get("repeat"))
    return {
        "failed": failed,
        "repeat": repeat if isinstance(repeat, int) and not isinstance(repeat, bool) else None,
        "agent": agent_label(record.get("agent_ref")) if "agent_ref" in record else None,
        "reward": None if failed else _number(record.get("reward")),
        "prompt": _cut(last_user_message(record.get("responses_create_params"))),
        "conversation": _cut(conversation(record.get("responses_create_params"))),
        "response": _cut(text),
        "tool_calls": _cut(tool_calls(record.get("response"))),
        "tool_results": _cut(tool_results(record.get("response"))),
        "failure": None if failure is None else str(failure),
        "reason": None if reason is None else _cut(str(reason), 600),
    }


def tool_results(response: Any) -> str:
    """What each tool call returned (the ``function_call_output`` items of ``output[]``)."""
    output = response.get("output") if isinstance(response, dict) else None
    return "\n".join(
        str(item.get("output"))
        for item in (output if isinstance(output, list) else [])
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    )


def conversation(request: Any) -> str:
    """The request's messages, one ``role: text`` line each (what the model was given)."""
    if not isinstance(request, dict):
        return ""
    items = request.get("input")
    if isinstance(items, str):
        return f"user: {items}"
    lines = []
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict) and "role" in item:
            content = item.get("content")
            text = (
                content if isinstance(content, str) else json.dumps(content, ensure_ascii=False, default=str)
            )
            lines.append(f"{item['role']}: {text}")
    return "\n".join(lines)


def read_samples(tasks: RunTasks, keys: set[TaskKey]) -> dict[TaskKey, list[dict[str, Any]]]:
    """Up to ``SAMPLES_PER_TASK`` rollouts (scored, then failed) of each task in ``keys``.

    A second pass over the files, holding only the tasks asked for: memory stays bounded by the
    page, not by the run.
    """
    out: dict[TaskKey, list[dict[str, Any]]] = {}
    if not keys:
        return out
    run = tasks.run

    def take(source: Iterator[tuple[int, Any]], failed: bool) -> None:
        for _, record in source:
            found = task_key(record)
            if found is None or found[1] not in keys:
                continue
            shown = out.setdefault(found[1], [])
            if len(shown) < SAMPLES_PER_TASK:
                shown.append(sample_of(record, failed))

    try:
        if run.rollouts_fpath is not None and run.rollouts_fpath.is_file():
            end = tasks.torn.complete_bytes if tasks.torn else None
            take(iter_jsonl(run.rollouts_fpath, "rollouts JSONL", end=end), False)
        if run.failures_fpath.is_file():
            take(iter_jsonl(run.failures_fpath, "failures JSONL"), True)
    except (RunError, OSError):  # changed since the first pass: the page shows what was read
        pass
    for shown in out.values():
        shown.sort(key=lambda s: (s["failed"], s.get("repeat") is None, s.get("repeat") or 0))
    return out
