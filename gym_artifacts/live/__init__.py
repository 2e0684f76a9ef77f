"""The live path: one eval's calls fanned out to every configured backend, each behind its own
queue and worker thread, with the metrics journal beside the run.

The public entry point is ``live_run`` (and the ``LiveRun`` / ``NoOpLiveRun`` it yields);
``live_exporters`` is its deprecated old name.
"""

from gym_artifacts.live.fanout import LiveRun, NoOpLiveRun, live_exporters, live_run

__all__ = ["LiveRun", "NoOpLiveRun", "live_exporters", "live_run"]
