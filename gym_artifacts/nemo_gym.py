"""NeMo Gym's exporter module (``nemo_gym.exporters``) as a drop-in, on top of :func:`live_run`.

A NeMo Gym call site switches by its import line alone::

    from gym_artifacts.nemo_gym import (
        setup_exporters, get_exporters, export_metrics, export_rollouts, teardown_exporters,
    )

    setup_exporters(global_config_dict)      # any resolved global config NeMo Gym passes
    export_metrics({"progress/done": 3}, step=3)
    export_rollouts(rollouts)
    teardown_exporters()                      # also run at interpreter exit

It behaves as NeMo Gym's module does (``tests/test_nemo_gym_dropin.py`` states each behaviour):

* a backend opens from NeMo Gym's flat keys under NeMo Gym's own availability rules
  (``NEMO_GYM_BACKENDS``, from its ``config_types``): W&B with project, name and API key, MLflow
  with tracking URI, experiment and run name (token optional), LangSmith with API key, dataset
  and experiment; a masked value (``****``) never counts. An explicit ``exporters.<name>.enabled``
  (this project's own config) wins over the flat keys.
* nothing raises into the caller, whatever the config; a backend whose setup failed is not in
  ``get_exporters()``; a second setup tears the first down; teardown is idempotent.
* with no ``output_jsonl_fpath`` (a NeMo Gym server's config) the calls still fan out to every
  backend that opens, without a journal (nothing is left to export), said once in a warning.

With an output path the calls make the same backend runs and metrics journal as
``live_run``, so ``gym-artifacts export OUT.jsonl`` afterwards completes those runs (one
backend run per destination; see ``live_certify``).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gym_artifacts.contract.live_exporter import LiveExporter
from gym_artifacts.core.errors import ConfigError
from gym_artifacts.live.channel import teardown_limits
from gym_artifacts.live.fanout import LiveRun, NoOpLiveRun, at_interpreter_exit, live_run

logger = logging.getLogger(__name__)

OUTPUT_KEY = "output_jsonl_fpath"  # the key NeMo Gym names its rollouts file by
RESULTS_DIR_KEY = "results_dir"  # NeMo Gym's W&B run folder is <results_dir>/wandb
MASKED = "****"  # what NeMo Gym's recursively_hide_secrets writes over a secret


@dataclass(frozen=True)
class NemoGymBackend:
    """One of NeMo Gym's backends: when it is available and where its flat keys go."""

    required: tuple[str, ...]  # every one set (truthy) for the backend to open
    not_masked: tuple[str, ...]  # a value of "****" here means "not configured"
    settings: dict[str, str] = field(default_factory=dict)  # flat key -> exporters.<name>.<setting>


# NeMo Gym's config_types: WANDBConfig, MLFlowConfig, LangSmithConfig (``is_available``).
NEMO_GYM_BACKENDS: dict[str, NemoGymBackend] = {
    "wandb": NemoGymBackend(
        ("wandb_project", "wandb_name", "wandb_api_key"),
        ("wandb_api_key",),
        {"wandb_project": "project", "wandb_name": "name", "wandb_api_key": "api_key"},
    ),
    "mlflow": NemoGymBackend(
        ("mlflow_tracking_uri", "mlflow_experiment_name", "mlflow_run_name"),
        ("mlflow_tracking_token",),
        {
            "mlflow_tracking_uri": "tracking_uri",
            "mlflow_experiment_name": "experiment_name",
            "mlflow_run_name": "run_name",
            "mlflow_tracking_token": "tracking_token",
        },
    ),
    "langsmith": NemoGymBackend(
        ("langsmith_api_key", "langsmith_dataset_name", "langsmith_experiment_name"),
        ("langsmith_api_key",),
        {
            "langsmith_api_key": "api_key",
            "langsmith_endpoint": "api_url",
            "langsmith_dataset_name": "dataset_name",
            "langsmith_experiment_name": "experiment_name",
            "langsmith_workspace_id": "workspace_id",  # sent as the workspace header, as NeMo Gym
        },
    ),
}

# Every flat key NeMo Gym's own exporters read (the entry-point plugin leaves them to those).
FLAT_KEYS = frozenset(
    key for backend in NEMO_GYM_BACKENDS.values() for key in (*backend.required, *backend.settings)
)

_lock = threading.Lock()
_context: contextlib.AbstractContextManager[LiveRun | NoOpLiveRun] | None = None
_live: LiveRun | NoOpLiveRun | None = None
_scratch: Path | None = None  # the journal-less run's folder, removed at teardown
_warned_no_output = False


def is_available(config: Mapping[str, Any], name: str) -> bool:
    """NeMo Gym's ``is_available`` of backend ``name`` for a plain config mapping."""
    backend = NEMO_GYM_BACKENDS[name]
    if not all(config.get(key) for key in backend.required):
        return False
    return all(config.get(key) != MASKED for key in backend.not_masked)


def plain_config(global_config_dict: Any) -> dict[str, Any]:
    """A plain-container copy of the caller's config (never the caller's object)."""
    from omegaconf import OmegaConf

    if OmegaConf.is_config(global_config_dict):
        try:
            data = OmegaConf.to_container(global_config_dict, resolve=True)
        except Exception:  # an interpolation that cannot resolve here: kept as written
            data = OmegaConf.to_container(global_config_dict, resolve=False)
    elif isinstance(global_config_dict, Mapping):
        import copy

        data = copy.deepcopy(dict(global_config_dict))
    else:
        data = {}
    return data if isinstance(data, dict) else {}


def drop_in_config(global_config_dict: Any) -> dict[str, Any]:
    """The config ``live_run`` gets: NeMo Gym's flat keys turned into ``exporters.<name>``
    sections under NeMo Gym's availability rules (an explicit ``enabled`` wins)."""
    config = plain_config(global_config_dict)
    exporters = config.get("exporters")
    exporters = dict(exporters) if isinstance(exporters, Mapping) else {}
    for name, backend in NEMO_GYM_BACKENDS.items():
        section = exporters.get(name)
        section = dict(section) if isinstance(section, Mapping) else {}
        if "enabled" not in section:
            section["enabled"] = is_available(config, name)
        if _is_on(section["enabled"]):
            for flat_key, setting in backend.settings.items():
                value = config.get(flat_key)
                if value not in (None, "", MASKED):
                    section.setdefault(setting, value)
            if name == "wandb":
                # NeMo Gym's exporter passes no mode: the SDK's (WANDB_MODE, ``wandb offline``)
                section.setdefault("mode", None)
                results_dir = config.get(RESULTS_DIR_KEY)
                if results_dir:
                    section.setdefault("dir", str(Path(str(results_dir)) / "wandb"))
        for flat_key in backend.settings:  # the section decides; flat keys never re-enable it
            config.pop(flat_key, None)
        if section != {"enabled": False} or name in exporters:
            exporters[name] = section
    config["exporters"] = exporters
    return config


def _is_on(flag: Any) -> bool:
    """An ``enabled`` value read as the config reads it (``"true"`` is on); unreadable: off."""
    from gym_artifacts.core.config import parse_flag

    try:
        return parse_flag(flag, "enabled")
    except ConfigError:
        return False


def _output_path(config: Mapping[str, Any]) -> str | None:
    value = config.get(OUTPUT_KEY)
    return None if value in (None, "") else str(value)


def _anything_enabled(config: Mapping[str, Any]) -> bool:
    from gym_artifacts.core.config import enabled_exporters, normalize

    return bool(enabled_exporters(normalize(config)))


def setup_exporters(global_config_dict: Mapping[str, Any] | Any) -> list[LiveExporter]:
    """Open every backend the config makes available, for the eval writing
    ``global_config_dict["output_jsonl_fpath"]``; returns those that opened.

    Tears down exporters an earlier call set up. Never raises: a config that cannot be used is
    warned about and opens nothing. Waits (up to the teardown idle deadline, 10 s by default)
    for the backends' setup, as NeMo Gym's setup does, so a backend that failed is not returned.
    """
    global _context, _live, _scratch, _warned_no_output
    teardown_exporters()
    scratch: Path | None = None
    try:
        config = drop_in_config(global_config_dict)
        output = _output_path(config)
        if output is None:
            if not _anything_enabled(config):
                return []
            if not _warned_no_output:
                _warned_no_output = True
                logger.warning(
                    "setup_exporters: the config has no %r: logging live without a journal "
                    "(nothing of this process can be exported afterwards)", OUTPUT_KEY,
                )  # fmt: skip
            scratch = Path(tempfile.mkdtemp(prefix="gym-artifacts-nemo-gym-"))
            output = str(scratch / "live.jsonl")
        with _lock:
            context = live_run(config, output)
            _live = context.__enter__()
            _context, _scratch = context, scratch
        live = _live
        if live is not None:
            live.flush(teardown_limits()[0])
        # After the backends' setup (as NeMo Gym registers it), before the interpreter's shutdown
        # (so that it still delivers): exit hooks run last-in first, so this FINISHED teardown
        # comes before live logging's own KILLED one.
        at_interpreter_exit(teardown_exporters)
    except Exception as exc:  # telemetry must not take the eval down
        logger.warning("setup_exporters: live logging not set up: %s", exc)
        teardown_exporters()
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
        return []
    return get_exporters()


def get_exporters() -> list[LiveExporter]:
    """The live exporters open now: empty before setup, after teardown, on other ranks, and
    without any backend whose setup failed."""
    live = _live
    if live is None:
        return []
    return [c.backend for c in live.channels if not c.setup_failed]


def export_metrics(metrics: Mapping[str, Any], step: int | None = None) -> None:
    """Journal and log one step's metrics (no-op before setup); never raises. NeMo Gym's own
    end-of-collection ``coverage/*`` figures are logged under this project's one definition
    (``_restated_coverage``)."""
    live = _live
    if live is not None:
        live.export_metrics(_restated_coverage(live, metrics), step=step)


def _restated_coverage(live: Any, metrics: Mapping[str, Any]) -> Mapping[str, Any]:
    """``metrics`` with NeMo Gym's ``coverage/missing`` (expected - scored, its failed rollouts
    included) restated as planned rollouts with no result at all, and ``coverage/failed`` (the
    rows of the failures sidecar as it is now) beside it, so that scored + failed + missing =
    expected in every backend (``gym_artifacts.run.coverage``). Anything else, or anything that
    cannot be read, passes as it came."""
    try:
        if "coverage/missing" not in metrics:
            return metrics
        from gym_artifacts.core.jsonio import count_lines
        from gym_artifacts.run.coverage import nemo_gym_coverage

        failures = live.run.failures_fpath
        failed = count_lines(failures) if failures.is_file() else None
        figures = nemo_gym_coverage(metrics, failed)
        return metrics if figures is None else {**metrics, **figures}
    except Exception:  # telemetry must not take the eval down
        return metrics


def export_rollouts(rollouts: list[Any]) -> None:
    """Log finished rollouts (no-op before setup); never raises."""
    live = _live
    if live is not None:
        live.export_rollouts(rollouts)


def _forget_after_fork() -> None:
    """In a forked child (NeMo Gym forks health-check workers after setup): the exporters are the
    parent's. The child has none (``get_exporters()`` is empty, its calls go nowhere) and its exit
    ends nothing; the parent's run, journal and scratch folder are left to the parent."""
    global _context, _live, _scratch, _lock
    _lock = threading.Lock()  # another thread may have held it at the fork
    _context, _live, _scratch = None, None, None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def teardown_exporters() -> None:
    """End every backend run (FINISHED) and close the journal; safe to call again."""
    global _context, _live, _scratch
    with _lock:
        context, _context, _live = _context, None, None
        scratch, _scratch = _scratch, None
    if context is not None:
        with contextlib.suppress(Exception):
            context.__exit__(None, None, None)
        atexit.unregister(teardown_exporters)
    if scratch is not None:
        shutil.rmtree(scratch, ignore_errors=True)
