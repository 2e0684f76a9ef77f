"""Runtime producers never break the eval: no torch, no NVML, a failing profiler; reactor's NVML figures."""

from __future__ import annotations

import json
import logging
import sys
import textwrap
from pathlib import Path

import pytest

from gym_artifacts.runtime.nvml import NVMLSampler
from gym_artifacts.runtime.profiler import TRACE_NAME, ChunkRangeProfiler
from tests.conftest import FIXTURES
from tests.fake_pynvml import FakeGpu, FakeNvml
from tests.processes import run_bounded

REPO = Path(__file__).resolve().parent.parent


def test_readme_profiler_snippet_without_torch_never_raises(tmp_path: Path) -> None:
    # torch made unimportable, as on an install without the torch extra
    script = textwrap.dedent(
        f"""
        import contextlib, logging, os, sys
        sys.modules["torch"] = None
        os.environ["EXPERIMENT_PROFILE_RANGE"] = "1,2"
        logging.basicConfig(level=logging.WARNING)
        from gym_artifacts.runtime import ChunkRangeProfiler
        profiler = ChunkRangeProfiler({str(tmp_path)!r})
        done = []
        for i in range(4):
            with profiler.chunk(i) if profiler else contextlib.nullcontext():
                done.append(i)
        profiler.close()
        print(done, profiler.error)
        """
    )
    proc = run_bounded([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("[0, 1, 2, 3] profiling disabled: ")
    assert proc.stderr.count("profiling disabled") == 1  # warned once, not per chunk
    assert not (tmp_path / TRACE_NAME).exists()


def test_profiler_that_cannot_start_is_a_noop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import torch

    def refuse(*_a: object, **_k: object) -> object:
        raise RuntimeError("Can't disable Kineto profiler when it's not running")

    monkeypatch.setattr(torch.profiler, "profile", refuse)
    profiler = ChunkRangeProfiler(tmp_path, "0,3")
    with caplog.at_level(logging.WARNING):
        for i in range(5):
            with profiler.chunk(i):
                pass
        profiler.close()
    assert [r.getMessage() for r in caplog.records if "profiling disabled" in r.getMessage()] != []
    assert len([r for r in caplog.records if "profiling disabled" in r.getMessage()]) == 1
    assert profiler.error is not None and not profiler.running


def test_nvml_without_library_never_raises_and_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    sampler = NVMLSampler(interval=0.1, nvml=FakeNvml(library_missing=True), publish_otel=False)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            sampler.start()
            sampler.sample_once()
            sampler.stop()
        summary = sampler.summary()
        sampler.shutdown()
    assert summary["samples"] == 0 and "NVML Shared Library Not Found" in summary["reason"]
    assert len([r for r in caplog.records if "no GPU metrics" in r.getMessage()]) == 1


def test_nvml_figures_equal_reactor_runtimes_for_the_same_readings() -> None:
    """reactor-runtime 2.7.6's fixture was written from a stand-in NVML reading 40 then 42 GB
    (``used`` bytes) at 75 then 85 % utilisation; the same readings give the same figures here."""
    fixture = FIXTURES / "with-gpu-samples" / "metrics_summary.json"
    if not fixture.is_file():
        pytest.skip(f"{fixture} is not present")
    reactor = json.loads(fixture.read_text())
    gpu = FakeGpu("GPU-0", memory_gb=lambda n: (40.0, 42.0)[n], util=lambda n: (75.0, 85.0)[n])
    sampler = NVMLSampler(interval=0.1, nvml=FakeNvml([gpu]), cuda_uuid=lambda _: None, publish_otel=False)
    sampler._init_nvml()
    sampler.sample_once(when=1.0)
    sampler.sample_once(when=2.0)
    ours = sampler.summary()
    for key in ("samples", "avg_vram_gb", "peak_vram_gb", "avg_gpu_util_pct"):
        assert ours[key] == pytest.approx(reactor[key]), key
    assert set(ours["headline_basis"]) >= {"avg_vram_gb", "peak_vram_gb", "avg_gpu_util_pct"}


def test_headline_average_never_exceeds_peak_across_devices() -> None:
    gpus = [FakeGpu("GPU-a", memory_gb=lambda n: 30.0 + n), FakeGpu("GPU-b", memory_gb=lambda n: 50.0 - n)]
    sampler = NVMLSampler(interval=0.1, nvml=FakeNvml(gpus), cuda_uuid=lambda _: None, publish_otel=False)
    sampler._init_nvml()
    for i in range(4):
        sampler.sample_once(when=float(i))
    s = sampler.summary()
    assert s["avg_vram_gb"] <= s["peak_vram_gb"]
    assert s["avg_vram_gb"] == pytest.approx(80.0) and s["peak_vram_gb"] == pytest.approx(80.0)
    assert s["avg_gpu_util_pct"] <= s["peak_gpu_util_pct"]
    assert "summed over the devices" in s["headline_basis"]["avg_vram_gb"]
