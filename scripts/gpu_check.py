"""On a machine with an NVIDIA GPU: real NVML sampling under load and a CUDA profiler trace.

    python scripts/gpu_check.py [--seconds 10] [--interval 0.1] [--out /tmp/gpu-check]

Samples NVML for ``--seconds`` while a matrix-multiply load runs on every visible GPU, profiles
5 CUDA chunks with ChunkRangeProfiler, then prints the NVML summary and the trace's event counts
(CPU vs CUDA kernels). Exits 1 when no GPU is sampled or the trace has no CUDA events.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gym_artifacts.runtime.nvml import NVMLSampler
from gym_artifacts.runtime.profiler import ChunkRangeProfiler


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--interval", type=float, default=0.1)
    parser.add_argument("--out", type=Path, default=Path("/tmp/gpu-check"))
    args = parser.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("no CUDA device visible to torch", file=sys.stderr)
        return 1
    devices = list(range(torch.cuda.device_count()))
    for d in devices:
        torch.cuda.init()
        torch.ones(1, device=f"cuda:{d}")  # a context per device, so UUIDs come from torch
    args.out.mkdir(parents=True, exist_ok=True)
    sampler = NVMLSampler(
        interval=args.interval, devices=devices, series_fpath=args.out / "nvml_samples.jsonl"
    )
    mats = [torch.randn(8192, 8192, device=f"cuda:{d}", dtype=torch.bfloat16) for d in devices]
    sampler.start()
    started = time.monotonic()
    while time.monotonic() - started < args.seconds:
        for m in mats:
            m @ m
        torch.cuda.synchronize()
    sampler.stop()
    summary = sampler.summary()
    print(json.dumps(summary, indent=2))

    prof = ChunkRangeProfiler(args.out, "1,5")
    for i in range(7):
        with prof.chunk(i):
            for m in mats:
                (m @ m).relu_()
            torch.cuda.synchronize()
    prof.close()
    trace = json.loads(gzip.decompress((args.out / "profile.pt.trace.json.gz").read_bytes()))
    counts = collections.Counter(e.get("cat", "?") for e in trace.get("traceEvents", []))
    chunks = sorted({e["name"] for e in trace["traceEvents"] if str(e.get("name", "")).startswith("chunk_")})
    print("trace event categories:", dict(counts.most_common()))
    print("chunks in trace:", chunks)
    print((args.out / "profile.summary.txt").read_text()[:3000])
    kernels = counts.get("kernel", 0)
    ok = summary.get("samples", 0) > 0 and kernels > 0
    print("GPU CHECK", "OK" if ok else "FAILED", f"samples={summary.get('samples')} kernels={kernels}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
