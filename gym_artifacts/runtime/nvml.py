"""NVMLSampler: GPU readings of every device the process uses, on a fixed-rate schedule.

Devices are the CUDA devices the process sees (``CUDA_VISIBLE_DEVICES`` honoured), mapped to
NVML by UUID, never by assuming NVML's order equals CUDA's. Per device: memory used,
utilisation (gpu and memory), power, energy (counter delta since start), temperature, SM clock
and throttle reasons; a reading a device does not support is dropped for that device alone.
The series streams to a JSONL file as it is sampled; the summary has avg, peak, p50 and p95 per
metric and device. When NVML cannot start, the summary says ``samples: 0`` with the reason,
never zeros posing as data. Sampling never raises into the caller.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from gym_artifacts.core.atomic import open_regular
from gym_artifacts.core.jsonio import canonical_json
from gym_artifacts.runtime.stats import SeriesStats

logger = logging.getLogger(__name__)

MIN_INTERVAL_S = 0.1
# Decimal gigabytes, as reactor-runtime writes its ``*_gb`` keys (``used / 1e9``).
GB = 1e9
# What each headline figure aggregates (written beside them, so no reader has to guess).
HEADLINE_BASIS = {
    "avg_vram_gb": "mean over samples of the memory used (decimal GB) summed over the devices",
    "peak_vram_gb": "maximum over samples of the memory used (decimal GB) summed over the devices",
    "avg_gpu_util_pct": "mean over samples of the GPU utilisation averaged over the devices",
    "peak_gpu_util_pct": "maximum over samples of the GPU utilisation averaged over the devices",
}


@dataclass
class Device:
    """One GPU as the process sees it (CUDA index) and as NVML names it."""

    cuda_index: int
    handle: Any
    uuid: str
    name: str
    nvml_index: int | None
    energy_start_mj: float | None = None
    unsupported: set[str] = field(default_factory=set)
    stats: dict[str, SeriesStats] = field(default_factory=dict)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _visible_entries(nvml: Any) -> list[str]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [str(i) for i in range(nvml.nvmlDeviceGetCount())]
    entries = []
    for raw in visible.split(","):
        entry = raw.strip()
        if not entry or entry == "-1":
            break  # CUDA stops at the first invalid entry
        entries.append(entry)
    return entries


def _torch_cuda_uuid(cuda_index: int) -> str | None:
    """The UUID torch reports for a CUDA device, only if torch already initialised CUDA."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    uuid = getattr(torch.cuda.get_device_properties(cuda_index), "uuid", None)
    if uuid is None:
        return None
    text = str(uuid)
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"


def resolve_devices(
    nvml: Any, cuda_devices: Sequence[int] | None, cuda_uuid: Callable[[int], str | None] = _torch_cuda_uuid
) -> list[Device]:
    """NVML handles of the CUDA devices the process uses, matched by UUID."""
    entries = _visible_entries(nvml)
    ordinals = list(range(len(entries))) if cuda_devices is None else list(cuda_devices)
    devices = []
    for ordinal in ordinals:
        if ordinal < 0 or ordinal >= len(entries):
            raise ValueError(f"CUDA device {ordinal} is not visible (CUDA_VISIBLE_DEVICES={entries})")
        uuid = cuda_uuid(ordinal)
        entry = entries[ordinal]
        if uuid is not None:
            handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
        elif entry.startswith(("GPU-", "MIG-")):
            handle = nvml.nvmlDeviceGetHandleByUUID(entry)
        else:
            # Without a CUDA context, an index names the device in PCI order, which is NVML's.
            handle = nvml.nvmlDeviceGetHandleByIndex(int(entry))
        try:
            nvml_index: int | None = int(nvml.nvmlDeviceGetIndex(handle))
        except Exception:
            nvml_index = None
        devices.append(
            Device(
                cuda_index=ordinal,
                handle=handle,
                uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                name=_text(nvml.nvmlDeviceGetName(handle)),
                nvml_index=nvml_index,
            )
        )
    return devices


def _readers(nvml: Any) -> dict[str, Callable[[Any], float]]:
    """Each metric and how to read it from a device handle."""
    throttle = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
    )
    readers: dict[str, Callable[[Any], float]] = {
        "memory_used_gb": lambda h: nvml.nvmlDeviceGetMemoryInfo(h).used / GB,
        "gpu_util_pct": lambda h: float(nvml.nvmlDeviceGetUtilizationRates(h).gpu),
        "memory_util_pct": lambda h: float(nvml.nvmlDeviceGetUtilizationRates(h).memory),
        "power_w": lambda h: nvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
        "temperature_c": lambda h: float(nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)),
        "sm_clock_mhz": lambda h: float(nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM)),
    }
    if throttle is not None:
        readers["throttle_reasons"] = lambda h: float(throttle(h))
    return readers


class NVMLSampler:
    """Samples NVML on a daemon thread at a fixed rate; ``start``/``stop`` may repeat."""

    def __init__(
        self,
        interval: float = 1.0,
        devices: Sequence[int] | None = None,
        series_fpath: Path | None = None,
        nvml: Any = None,
        cuda_uuid: Callable[[int], str | None] = _torch_cuda_uuid,
        publish_otel: bool = True,
    ) -> None:
        if not interval >= MIN_INTERVAL_S:
            raise ValueError(f"NVML sampling interval must be at least {MIN_INTERVAL_S} s, not {interval}")
        self.interval = float(interval)
        self.cuda_devices = None if devices is None else list(devices)
        self.series_fpath = series_fpath
        self._nvml = nvml
        self._cuda_uuid = cuda_uuid
        self._publish_otel = publish_otel
        self._devices: list[Device] | None = None
        self._readers: dict[str, Callable[[Any], float]] = {}
        self._reason: str | None = None
        self._driver: str | None = None
        self._samples = 0
        self._first: float | None = None
        self._last: float | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._series: IO[bytes] | None = None
        self._vram_total = SeriesStats()
        self._util_mean = SeriesStats()
        self.latest: dict[int, dict[str, float]] = {}

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        """Begin (or resume) sampling; never raises."""
        if self._thread is not None and self._thread.is_alive():
            return
        if self._devices is None and self._reason is None:
            self._init_nvml()
        if not self._devices:
            return
        if self.series_fpath is not None and self._series is None:
            try:
                self.series_fpath.parent.mkdir(parents=True, exist_ok=True)
                self._series = open_regular(self.series_fpath, "ab")  # closed in stop()
            except OSError as exc:
                logger.warning("NVML series not written: %s", exc)
        if self._publish_otel:
            try:
                from gym_artifacts.runtime import nvml_otel

                nvml_otel.publish(self)
            except Exception as exc:  # a broken OpenTelemetry install never stops sampling
                logger.warning("NVML gauges not published to OpenTelemetry: %s", exc)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gym-artifacts-nvml", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop sampling (the summary and series keep what was taken); ``start`` may follow."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        if self._series is not None:
            with contextlib.suppress(OSError):
                self._series.close()
            self._series = None

    def shutdown(self) -> None:
        """Stop and release NVML (``nvmlShutdown``); the summary stays readable, sampling is over."""
        self.stop()
        if self._devices and self._nvml is not None:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()

    def _init_nvml(self) -> None:
        try:
            if self._nvml is None:
                import pynvml

                self._nvml = pynvml
            nvml = self._nvml
            nvml.nvmlInit()
            self._driver = _text(nvml.nvmlSystemGetDriverVersion())
            self._devices = resolve_devices(nvml, self.cuda_devices, self._cuda_uuid)
            self._readers = _readers(nvml)
            for device in self._devices:
                try:
                    device.energy_start_mj = float(nvml.nvmlDeviceGetTotalEnergyConsumption(device.handle))
                except Exception:
                    device.unsupported.add("energy_j")
            if not self._devices:
                self._reason = "no GPU is visible to this process"
        except Exception as exc:  # NVMLError_LibraryNotFound on a machine without a driver, and the like
            self._devices = []
            self._reason = f"NVML unavailable: {type(exc).__name__}: {exc}"
            logger.warning("no GPU metrics: %s", self._reason)  # once: a failed start is not retried

    # -- sampling -----------------------------------------------------------------------------
    def _run(self) -> None:
        start = time.monotonic()
        tick = 0
        while not self._stop.is_set():
            self.sample_once()
            tick += 1
            next_at = start + tick * self.interval
            now = time.monotonic()
            if now > next_at:  # fell behind: skip the missed ticks, keep the grid
                tick = int((now - start) / self.interval) + 1
                next_at = start + tick * self.interval
            self._stop.wait(next_at - now if next_at > now else 0)

    def sample_once(self, when: float | None = None) -> None:
        """Read every device once (used by the thread; callable directly in tests)."""
        if not self._devices:
            return
        when = time.time() if when is None else when
        lines = []
        with self._lock:
            vram: list[float] = []
            util: list[float] = []
            for device in self._devices:
                values = self._read(device)
                if not values:
                    continue
                if "memory_used_gb" in values:
                    vram.append(values["memory_used_gb"])
                if "gpu_util_pct" in values:
                    util.append(values["gpu_util_pct"])
                for name, value in values.items():
                    device.stats.setdefault(name, SeriesStats()).add(value)
                self.latest[device.cuda_index] = values
                lines.append(
                    canonical_json(
                        {"time": when, "gpu": device.cuda_index, "uuid": device.uuid, "metrics": values}
                    )
                )
            if vram:
                self._vram_total.add(sum(vram))
            if util:
                self._util_mean.add(sum(util) / len(util))
            self._samples += 1
            self._first = when if self._first is None else self._first
            self._last = when
        if self._series is not None and lines:
            try:
                self._series.write(b"\n".join(lines) + b"\n")
                self._series.flush()
            except (OSError, ValueError) as exc:
                logger.warning("NVML series write failed: %s", exc)
                self._series = None

    def _read(self, device: Device) -> dict[str, float]:
        nvml = self._nvml
        values: dict[str, float] = {}
        for name, read in self._readers.items():
            if name in device.unsupported:
                continue
            try:
                values[name] = float(read(device.handle))
            except Exception as exc:
                not_supported = getattr(nvml, "NVMLError_NotSupported", ())
                if isinstance(exc, not_supported) or "Not Supported" in str(exc):
                    device.unsupported.add(name)
                # another transient error: this reading is skipped, the metric stays
        if "energy_j" not in device.unsupported and device.energy_start_mj is not None:
            try:
                total = float(nvml.nvmlDeviceGetTotalEnergyConsumption(device.handle))
                values["energy_j"] = (total - device.energy_start_mj) / 1000.0
            except Exception:
                device.unsupported.add("energy_j")
        return values

    # -- results ------------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """What was sampled: per device and metric avg/peak/p50/p95, or samples 0 with the reason."""
        with self._lock:
            if not self._samples:
                reason = self._reason or (
                    "sampler never started" if self._devices is None else "no sample was taken"
                )
                return {"samples": 0, "reason": reason, "interval_s": self.interval}
            devices: dict[str, Any] = {}
            for device in self._devices or []:
                devices[str(device.cuda_index)] = {
                    "name": device.name,
                    "uuid": device.uuid,
                    "nvml_index": device.nvml_index,
                    "metrics": {k: v.summary() for k, v in sorted(device.stats.items())},
                    "unsupported": sorted(device.unsupported),
                }
            summary: dict[str, Any] = {
                "samples": self._samples,
                "interval_s": self.interval,
                "driver": self._driver,
                "window": {
                    "start": _iso(self._first),
                    "end": _iso(self._last),
                    "seconds": (self._last or 0) - (self._first or 0),
                },
                "devices": devices,
            }
            summary.update(self._headline())
            return summary

    def _headline(self) -> dict[str, Any]:
        """reactor-runtime's figures, each over all devices on one basis (so avg <= peak)."""
        out: dict[str, Any] = {}
        if self._vram_total.count:
            out["avg_vram_gb"] = self._vram_total.total / self._vram_total.count
            out["peak_vram_gb"] = self._vram_total.peak
        if self._util_mean.count:
            out["avg_gpu_util_pct"] = self._util_mean.total / self._util_mean.count
            out["peak_gpu_util_pct"] = self._util_mean.peak
        if out:
            out["headline_basis"] = {k: v for k, v in HEADLINE_BASIS.items() if k in out}
        return out


def _iso(epoch: float | None) -> str | None:
    return None if epoch is None else dt.datetime.fromtimestamp(epoch, dt.timezone.utc).isoformat()

