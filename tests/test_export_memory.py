"""An export's memory does not grow with the run's rollouts.

NeMo Gym's aggregate metrics file holds every rollout's infos (about 50 MB at 100,000 rollouts);
read whole by the checks, the coverage, the identity, the payload and the shipping's secret scan,
an export held several times it at once. Measured here end to end: the same NeMo Gym-shaped run
at 4,000 and at 40,000 rollouts, exported to the local backend in a fresh process each, the peak
resident set above the imports compared (the run is written before the measurement starts).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.processes import run_bounded

REPO = Path(__file__).resolve().parents[1]

MEASURE = """
import json, sys
sys.path.insert(0, {repo!r})
from pathlib import Path
from omegaconf import OmegaConf
from gym_artifacts import export_run
from tests.nemo_gym_runs import write_run
def hwm():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")) / 1024
tasks = {rows} // 4
out = write_run(Path({tmp!r}) / "run.jsonl", tasks=tasks, repeats=4, failing_tasks=range(0, tasks, 50))
import gc; gc.collect()
open("/proc/self/clear_refs", "w").write("5")
base = hwm()
cfg = OmegaConf.create({{"exporters": {{"local": {{"enabled": True, "root": {store!r}, "report": "off"}},
                                         "tensorboard": {{"enabled": True, "logdir": {tb!r}}}}}}})
results = export_run(out, cfg)
assert all(r.status.value == "EXPORTED" for r in results), [r.reason for r in results]
aggregate = out.with_name("run_aggregate_metrics.json").stat().st_size / 2**20
print(json.dumps({{"above_mb": hwm() - base, "aggregate_mb": aggregate}}))
"""


def _export_peak(tmp: Path, rows: int) -> dict[str, float]:
    tmp.mkdir()
    code = MEASURE.format(repo=str(REPO), rows=rows, tmp=str(tmp), store=str(tmp / "store"), tb=str(tmp / "tb"))
    proc = run_bounded([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_an_export_s_memory_does_not_grow_with_its_rollouts(tmp_path: Path) -> None:
    small = _export_peak(tmp_path / "small", 4_000)
    large = _export_peak(tmp_path / "large", 40_000)
    grown = large["aggregate_mb"] - small["aggregate_mb"]
    assert grown > 15  # the file the export used to read whole, several times at once
    # 10x the rollouts: the peak rises by less than the aggregate file itself grew (a whole read
    # of it costs ~5x its size; 2 exporters sent one after the other)
    assert large["above_mb"] < small["above_mb"] + 0.5 * grown, (small, large)
