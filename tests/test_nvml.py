"""NVMLSampler with a fake pynvml (no GPU here): devices by UUID, percentiles, failures, schedule."""

from __future__ import annotations

import json
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gym_artifacts.runtime.nvml import NVMLSampler
from gym_artifacts.runtime.stats import SeriesStats, percentile
from tests.fake_pynvml import FakeGpu, FakeNvml
from tests.load import scaled
from tests.processes import run_bounded

REPO = Path(__file__).resolve().parent.parent


def two_gpus() -> FakeNvml:
    return FakeNvml(
        [FakeGpu("GPU-aaaa-0"), FakeGpu("GPU-bbbb-1", power_w=None, energy_mj=None, memory_gb=lambda n: 10.0)]
    )


def no_torch(_: int) -> None:
    return None


def test_two_gpus_one_without_power(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    series = tmp_path / "series.jsonl"
    sampler = NVMLSampler(
        interval=0.5, nvml=two_gpus(), series_fpath=series, cuda_uuid=no_torch, publish_otel=False
    )
    sampler._init_nvml()
    sampler.start()
    sampler.stop()
    for i in range(3):
        sampler.sample_once(when=1000.0 + i)
    summary = sampler.summary()
    assert summary["driver"] == "550.54.15" and summary["interval_s"] == 0.5
    gpu0, gpu1 = summary["devices"]["0"], summary["devices"]["1"]
    assert gpu0["uuid"] == "GPU-aaaa-0" and gpu1["uuid"] == "GPU-bbbb-1"
    assert "power_w" in gpu0["metrics"] and "energy_j" in gpu0["metrics"]
    assert "power_w" not in gpu1["metrics"] and {"power_w", "energy_j"} <= set(gpu1["unsupported"])
    assert gpu1["metrics"]["memory_used_gb"]["avg"] == pytest.approx(10.0)
    assert gpu0["metrics"]["energy_j"]["peak"] > 0
    assert set(gpu0["metrics"]) >= {
        "gpu_util_pct",
        "memory_util_pct",
        "temperature_c",
        "sm_clock_mhz",
        "throttle_reasons",
    }
    lines = [json.loads(x) for x in series.read_text().splitlines()]
    assert {(line["gpu"], line["uuid"]) for line in lines} == {(0, "GPU-aaaa-0"), (1, "GPU-bbbb-1")}
    assert all("power_w" not in line["metrics"] for line in lines if line["gpu"] == 1)


@pytest.mark.parametrize("visible", ["1", "GPU-bbbb-1"])
def test_cuda_visible_devices_maps_to_the_right_nvml_device(
    monkeypatch: pytest.MonkeyPatch, visible: str
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    sampler = NVMLSampler(interval=1, nvml=two_gpus(), cuda_uuid=no_torch, publish_otel=False)
    sampler._init_nvml()
    sampler.sample_once(when=1.0)
    devices = sampler.summary()["devices"]
    assert list(devices) == ["0"]  # CUDA index 0 in this process ...
    assert devices["0"]["uuid"] == "GPU-bbbb-1"  # ... is NVML's device 1
    assert devices["0"]["nvml_index"] == 1


def test_cuda_order_differing_from_nvml_order_is_resolved_by_uuid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    # CUDA (fastest first) enumerates the devices the other way round from NVML (PCI order).
    cuda_uuids = {0: "GPU-bbbb-1", 1: "GPU-aaaa-0"}
    sampler = NVMLSampler(
        interval=1, devices=[0], nvml=two_gpus(), cuda_uuid=cuda_uuids.get, publish_otel=False
    )
    sampler._init_nvml()
    sampler.sample_once(when=1.0)
    assert sampler.summary()["devices"]["0"]["uuid"] == "GPU-bbbb-1"


def test_percentiles_on_known_series(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    sampler = NVMLSampler(
        interval=1, nvml=FakeNvml([FakeGpu("GPU-x")]), cuda_uuid=no_torch, publish_otel=False
    )
    sampler._init_nvml()
    for i in range(100):
        sampler.sample_once(when=float(i))
    stats = sampler.summary()["devices"]["0"]["metrics"]["memory_used_gb"]
    values = [40.0 + n for n in range(100)]
    assert stats["avg"] == pytest.approx(sum(values) / 100)
    assert stats["peak"] == pytest.approx(139.0)
    assert stats["p50"] == pytest.approx(89.5)
    assert stats["p95"] == pytest.approx(40 + 94.05)
    assert sampler.summary()["window"]["seconds"] == 99.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5


def test_series_stats_stay_bounded() -> None:
    stats = SeriesStats(capacity=1000)
    for i in range(100_000):
        stats.add(float(i % 100))
    assert len(stats._values) == 1000 and stats.count == 100_000
    assert stats.summary()["avg"] == pytest.approx(49.5) and stats.summary()["peak"] == 99.0
    assert stats.summary()["p50"] == pytest.approx(49.5, abs=5)


def test_library_not_found_gives_samples_zero_with_reason() -> None:
    sampler = NVMLSampler(interval=1, nvml=FakeNvml(library_missing=True), publish_otel=False)
    sampler.start()
    sampler.stop()
    summary = sampler.summary()
    assert summary["samples"] == 0
    assert "NVMLError_LibraryNotFound" in summary["reason"]
    assert not any(k in summary for k in ("avg_vram_gb", "peak_vram_gb", "avg_gpu_util_pct"))


def test_real_pynvml_without_gpu_degrades() -> None:
    sampler = NVMLSampler(interval=1, publish_otel=False)
    sampler.start()
    sampler.stop()
    summary = sampler.summary()
    if summary["samples"]:
        pytest.skip("this machine has a GPU")
    assert "NVML unavailable" in summary["reason"]


def test_stop_and_start_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    sampler = NVMLSampler(
        interval=0.1, nvml=FakeNvml([FakeGpu("GPU-x")]), cuda_uuid=no_torch, publish_otel=False
    )
    sampler.start()
    sampled(sampler, 2)  # an event, not a sleep: a loaded machine may take a while per sample
    sampler.stop()
    first = sampler.summary()["samples"]
    time.sleep(0.25)
    assert sampler.summary()["samples"] == first  # stopped means stopped
    sampler.start()
    sampled(sampler, first + 2)
    sampler.stop()
    assert first >= 2 and sampler.summary()["samples"] >= first + 2


def sampled(sampler: NVMLSampler, at_least: int) -> None:
    """Wait until ``sampler`` took ``at_least`` samples (bounded, scaled to the machine's load)."""
    bound = time.monotonic() + scaled(10)
    while sampler.summary()["samples"] < at_least and time.monotonic() < bound:
        time.sleep(0.02)


def test_interval_below_minimum_is_refused() -> None:
    with pytest.raises(ValueError, match=r"at least 0\.1"):
        NVMLSampler(interval=0.05)


@pytest.mark.slow
def test_fixed_rate_schedule_does_not_drift(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def slow_util(n: int) -> float:
        time.sleep(0.02)  # each reading costs 20 ms: a sleep(interval) loop would drift 2 s in 100 samples
        return 50.0

    series = tmp_path / "s.jsonl"
    sampler = NVMLSampler(
        interval=0.1,
        nvml=FakeNvml([FakeGpu("GPU-x", util=slow_util)]),
        series_fpath=series,
        cuda_uuid=no_torch,
        publish_otel=False,
    )
    sampler.start()
    while sampler.summary()["samples"] < 100:
        time.sleep(0.05)
    sampler.stop()
    times = [json.loads(x)["time"] for x in series.read_text().splitlines()][:100]
    drift = (times[99] - times[0]) - 99 * 0.1
    assert abs(drift) < 0.1, drift


def test_opentelemetry_gauges_registered_once_and_follow_the_latest_session() -> None:
    script = textwrap.dedent(
        """
        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from gym_artifacts.runtime.nvml import NVMLSampler
        from tests.fake_pynvml import FakeGpu, FakeNvml

        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))

        def read():
            data = reader.get_metrics_data()
            out = {}
            for rm in data.resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        for p in m.data.data_points:
                            out[(m.name, p.attributes["gpu"])] = p.value
            return out

        first = NVMLSampler(interval=1, nvml=FakeNvml([FakeGpu("GPU-a", util=lambda n: 11.0)]), cuda_uuid=lambda i: None)
        first.start(); first.stop(); first.sample_once(1.0)
        assert read()[("gpu.gpu_util_pct", "0")] == 11.0
        second = NVMLSampler(interval=1, nvml=FakeNvml([FakeGpu("GPU-b", util=lambda n: 77.0)]), cuda_uuid=lambda i: None)
        second.start(); second.stop(); second.sample_once(2.0)
        values = read()
        assert values[("gpu.gpu_util_pct", "0")] == 77.0, values
        names = [m.name for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics for m in sm.metrics]
        assert names.count("gpu.gpu_util_pct") == 1, names
        print("ok")
        """
    )
    env = {"CUDA_VISIBLE_DEVICES": "0", "PATH": "/usr/bin:/bin"}
    proc = run_bounded(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60, env=env
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
