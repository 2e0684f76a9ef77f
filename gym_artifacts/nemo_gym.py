"""NeMo Gym's exporter call API as module functions, on top of :func:`live_exporters`.

A NeMo Gym call site switches by its import line alone::

    from gym_artifacts.nemo_gym import (
        setup_exporters, get_exporters, export_metrics, export_rollouts, teardown_exporters,
    )

    setup_exporters(global_config_dict)      # output path: global_config_dict["output_jsonl_fpath"]
    export_metrics({"progress/done": 3}, step=3)
    export_rollouts(rollouts)
    teardown_exporters()                      # also run at interpreter exit

The calls make the same backend runs and the same metrics journal as ``live_exporters``; like
it, they never raise into the eval once set up, and other ranks get no-ops.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
from collections.abc import Mapping
from typing import Any

from gym_artifacts.errors import ConfigError
from gym_artifacts.live import LiveExporter, LiveRun, NoOpLiveRun, at_interpreter_exit, live_exporters

OUTPUT_KEY = "output_jsonl_fpath"  # the key NeMo Gym names its rollouts file by

_lock = threading.Lock()
_context: contextlib.AbstractContextManager[LiveRun | NoOpLiveRun] | None = None
_live: LiveRun | NoOpLiveRun | None = None


def _output_path(global_config_dict: Any) -> Any:
    try:
        value = global_config_dict[OUTPUT_KEY]
    except Exception:  # absent, not a mapping, or an interpolation that cannot be resolved
        value = None
    if value in (None, ""):
        raise ConfigError(f"setup_exporters: the config has no {OUTPUT_KEY!r} (the rollouts file OUT.jsonl)")
    return value


def setup_exporters(global_config_dict: Mapping[str, Any] | Any) -> list[LiveExporter]:
    """Open every enabled backend for the eval writing ``global_config_dict["output_jsonl_fpath"]``.

    Tears down exporters an earlier call set up. Raises ConfigError only for a config that
    cannot be used at all (no output path); returns the live exporters.
    """
    global _context, _live
    output = _output_path(global_config_dict)
    teardown_exporters()
    with _lock:
        context = live_exporters(global_config_dict, output)
        _live = context.__enter__()
        _context = context
    at_interpreter_exit(teardown_exporters)  # before the shutdown, so that it still delivers
    return get_exporters()


def get_exporters() -> list[LiveExporter]:
    """The live exporters set up now (empty before setup, after teardown and on other ranks)."""
    live = _live
    return list(live.exporters) if live is not None else []


def export_metrics(metrics: Mapping[str, Any], step: int | None = None) -> None:
    """Journal and log one step's metrics (no-op before setup); never raises."""
    live = _live
    if live is not None:
        live.export_metrics(metrics, step=step)


def export_rollouts(rollouts: list[Any]) -> None:
    """Log finished rollouts (no-op before setup); never raises."""
    live = _live
    if live is not None:
        live.export_rollouts(rollouts)


def teardown_exporters() -> None:
    """End every backend run (FINISHED) and close the journal; safe to call again."""
    global _context, _live
    with _lock:
        context, _context, _live = _context, None, None
    if context is not None:
        with contextlib.suppress(Exception):
            context.__exit__(None, None, None)
        atexit.unregister(teardown_exporters)
