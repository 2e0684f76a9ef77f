"""A stand-in for nvidia-ml-py's ``pynvml`` (same function names and error classes).

Used only where no GPU exists: tests configure devices, their readings and what they lack.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1


class NVMLError(Exception):
    pass


class NVMLError_LibraryNotFound(NVMLError):
    def __str__(self) -> str:
        return "NVML Shared Library Not Found"


class NVMLError_NotSupported(NVMLError):
    def __str__(self) -> str:
        return "Not Supported"


class NVMLError_Uninitialized(NVMLError):
    pass


@dataclass
class FakeGpu:
    """One device; each reading is a function of the sample count so series are known."""

    uuid: str
    name: str = "NVIDIA Fake H200"
    memory_gb: Callable[[int], float] = lambda n: 40.0 + n
    util: Callable[[int], float] = lambda n: 50.0 + n
    power_w: Callable[[int], float] | None = lambda n: 300.0
    energy_mj: Callable[[int], float] | None = lambda n: 1000.0 * n
    reads: int = 0
    lacks: set[str] = field(default_factory=set)


class FakeNvml:
    """A module-like object; ``install(monkeypatch)`` or pass it as ``nvml=``."""

    NVML_TEMPERATURE_GPU = NVML_TEMPERATURE_GPU
    NVML_CLOCK_SM = NVML_CLOCK_SM
    NVMLError = NVMLError
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_Uninitialized = NVMLError_Uninitialized

    def __init__(self, gpus: list[FakeGpu] | None = None, library_missing: bool = False) -> None:
        self.gpus = gpus or []
        self.library_missing = library_missing
        self.initialised = False

    def nvmlInit(self) -> None:
        if self.library_missing:
            raise NVMLError_LibraryNotFound()
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False

    def _check(self) -> None:
        if not self.initialised:
            raise NVMLError_Uninitialized()

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    def nvmlDeviceGetCount(self) -> int:
        self._check()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        self._check()
        return self.gpus[index]

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> FakeGpu:
        self._check()
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                return gpu
        raise NVMLError("Not Found")

    def nvmlDeviceGetIndex(self, handle: FakeGpu) -> int:
        return self.gpus.index(handle)

    def nvmlDeviceGetUUID(self, handle: FakeGpu) -> str:
        return handle.uuid

    def nvmlDeviceGetName(self, handle: FakeGpu) -> str:
        return handle.name

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu) -> Any:
        handle.reads += 1  # one sample reads memory first
        used = round(handle.memory_gb(handle.reads - 1) * 1e9)  # decimal GB, as NVML users read it
        return SimpleNamespace(used=used, total=141 * 10**9, free=141 * 10**9 - used)

    def nvmlDeviceGetUtilizationRates(self, handle: FakeGpu) -> Any:
        return SimpleNamespace(gpu=handle.util(handle.reads - 1), memory=20)

    def nvmlDeviceGetPowerUsage(self, handle: FakeGpu) -> int:
        if handle.power_w is None:
            raise NVMLError_NotSupported()
        return int(handle.power_w(handle.reads - 1) * 1000)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: FakeGpu) -> int:
        if handle.energy_mj is None:
            raise NVMLError_NotSupported()
        return int(handle.energy_mj(max(handle.reads - 1, 0)))

    def nvmlDeviceGetTemperature(self, handle: FakeGpu, sensor: int) -> int:
        return 60

    def nvmlDeviceGetClockInfo(self, handle: FakeGpu, clock: int) -> int:
        return 1980

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeGpu) -> int:
        return 0
