"""Runtime artifact producers: experiment session, NVML sampler, chunk-range profiler, recording.

Active only when ``EXPERIMENT_ID`` is set, on rank 0; otherwise ``maybe_build_session`` returns
None and nothing here costs anything. No submodule imports torch or pynvml at import time.
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "ExperimentSession": "gym_artifacts.runtime.session",
    "maybe_build_session": "gym_artifacts.runtime.session",
    "NVMLSampler": "gym_artifacts.runtime.nvml",
    "ChunkRangeProfiler": "gym_artifacts.runtime.profiler",
    "assemble_recording": "gym_artifacts.runtime.recording",
}
__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'gym_artifacts.runtime' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
