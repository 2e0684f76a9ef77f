"""NVML readings as OpenTelemetry observable gauges, registered once per process.

Registering gauges per session (as the reference runtime did) leaves later sessions exporting
the first session's frozen readings: here the gauges are created once and always read the
sampler most recently published. Labels stay bounded: the device index only.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

_lock = threading.Lock()
_registered = False
_current: weakref.ReferenceType[Any] | None = None
METRICS = ("memory_used_gb", "gpu_util_pct", "memory_util_pct", "power_w", "temperature_c", "sm_clock_mhz")


def _meter_provider_is_set() -> bool:
    try:
        from opentelemetry import metrics
    except ImportError:
        return False
    provider = metrics.get_meter_provider()
    return type(provider).__name__ not in ("ProxyMeterProvider", "NoOpMeterProvider", "_ProxyMeterProvider")


def publish(sampler: Any) -> bool:
    """Make ``sampler`` the source of the process's NVML gauges; True when gauges exist."""
    global _registered, _current
    with _lock:
        _current = weakref.ref(sampler)
        if _registered:
            return True
        if not _meter_provider_is_set():
            return False
        from opentelemetry import metrics

        meter = metrics.get_meter("gym_artifacts.nvml")
        for name in METRICS:
            meter.create_observable_gauge(f"gpu.{name}", callbacks=[_callback(name)])
        _registered = True
        return True


def _callback(name: str) -> Any:
    from opentelemetry.metrics import Observation

    def observe(_options: Any) -> list[Any]:
        sampler = _current() if _current is not None else None
        if sampler is None:
            return []
        return [
            Observation(values[name], {"gpu": str(index)})
            for index, values in list(sampler.latest.items())
            if name in values
        ]

    return observe
