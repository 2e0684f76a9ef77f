"""The NVML sampler at 10 Hz over 8 (fake) devices: CPU time as a share of one core."""

from __future__ import annotations

import resource
import time

from benchmarks.common import Row


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run(tiny: bool) -> list[Row]:
    from gym_artifacts.runtime.nvml import NVMLSampler
    from tests.fake_pynvml import FakeGpu, FakeNvml

    seconds = 2.0 if tiny else 10.0
    idle_start = _cpu()
    time.sleep(seconds)
    idle = (_cpu() - idle_start) / seconds
    sampler = NVMLSampler(
        interval=0.1,
        nvml=FakeNvml([FakeGpu(f"GPU-{i}") for i in range(8)]),
        cuda_uuid=lambda i: None,
        publish_otel=False,
    )
    import os

    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    start = _cpu()
    sampler.start()
    time.sleep(seconds)
    sampler.stop()
    used = (_cpu() - start) / seconds
    samples = sampler.summary()["samples"]
    share = max(0.0, used - idle) * 100
    return [
        Row(
            f"nvml: 10 Hz x 8 devices ({samples} samples)",
            f"{share:.2f}% of a core",
            f"idle {idle * 100:.2f}%",
            None,
            "< 1% of a core",
            share < 1.0,
        )
    ]
