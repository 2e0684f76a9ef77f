"""The drop-in's exit hook runs only in the process that set the exporters up.

NeMo Gym forks its health-check workers after ``setup_exporters``; a forked worker inherits the
exit hooks but none of the threads that deliver the calls, so a teardown there can only report
losses that did not happen ("journal lost 1 metric call", "teardown did not finish in time")
and touch the run's files from a second process. Here a real ``os.fork`` after setup, the child
leaving through the interpreter's normal exit (its exit hooks run), as such a worker does.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from gym_artifacts.run.artifacts import RunArtifacts
from gym_artifacts.run.journal import iter_journal
from tests.processes import run_bounded

SCRIPT = textwrap.dedent("""
    import logging, os, sys
    logging.basicConfig(format="[pid %(process)d] %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    from gym_artifacts import nemo_gym
    config = {{"output_jsonl_fpath": {out!r},
              "exporters": {{"local": {{"enabled": True, "root": {root!r}}}}}}}
    opened = nemo_gym.setup_exporters(config)
    assert [e.name for e in opened] == ["local"], opened
    nemo_gym.export_metrics({{"progress/done": 1}}, step=1)
    pid = os.fork()
    if pid == 0:
        print("CHILD", os.getpid(), len(nemo_gym.get_exporters()), flush=True)
        {child_action}
        sys.exit(0)
    _, status = os.waitpid(pid, 0)
    print("CHILD-EXIT", os.waitstatus_to_exitcode(status), flush=True)
    # the one-live-writer lock is still the parent's (a child's release would have dropped it)
    from gym_artifacts.core.locking import try_lock
    from gym_artifacts.run.artifacts import RunArtifacts
    second, holder = try_lock(RunArtifacts.from_path({out!r}).live_writer_lock_fpath())
    print("LOCK-STILL-HELD", second is None, flush=True)
    nemo_gym.export_metrics({{"progress/done": 2}}, step=2)
    open({out!r}, "w").close()
    print("PARENT", os.getpid(), len(nemo_gym.get_exporters()), flush=True)
""")


@pytest.mark.parametrize(
    "child_action",
    ["pass", "nemo_gym.export_metrics({'progress/done': 9}, step=9); nemo_gym.teardown_exporters()"],
    ids=["exits", "logs-and-tears-down"],
)
def test_a_forked_worker_reports_nothing_and_touches_nothing(tmp_path: Path, child_action: str) -> None:
    out = tmp_path / "results" / "rollouts.jsonl"
    out.parent.mkdir()
    script = SCRIPT.format(out=str(out), root=str(tmp_path / "runs"), child_action=child_action)
    proc = run_bounded([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    [child] = [line.split()[1] for line in lines if line.startswith("CHILD ")]
    [parent] = [line.split()[1] for line in lines if line.startswith("PARENT ")]
    assert "CHILD-EXIT 0" in lines
    assert "LOCK-STILL-HELD True" in lines
    # the forked worker has no exporters of its own, and says nothing at exit
    assert f"CHILD {child} 0" in lines
    child_says = [line for line in proc.stderr.splitlines() if line.startswith(f"[pid {child}]")]
    assert child_says == [], "\n".join(child_says)
    # the parent's run is whole: both steps journaled, no loss reported anywhere, run finished
    assert "lost" not in proc.stderr and "did not finish" not in proc.stderr, proc.stderr
    assert f"PARENT {parent} 1" in lines
    assert [entry.step for entry in iter_journal(RunArtifacts.from_path(out))] == [1, 2]
