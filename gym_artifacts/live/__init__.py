"""The live path: one eval's calls fanned out to every configured backend, each behind its own
queue and worker thread, with the metrics journal beside the run.

The public entry point is ``live_exporters`` (and the ``LiveRun`` / ``NoOpLiveRun`` it returns).
"""

from gym_artifacts.live.fanout import LiveRun, NoOpLiveRun, live_exporters

__all__ = ["LiveRun", "NoOpLiveRun", "live_exporters"]
