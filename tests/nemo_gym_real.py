"""A real NeMo Gym 0.7.0 for the tests: its servers started once, `gym eval run` run many times.

``scripts/nemo_gym_env.sh`` installs NeMo Gym in a venv of its own (Python 3.13, with gym-artifacts
installed into it as a user would); ``scripts/test.sh`` runs it and exports the venv's path as
``GYM_ARTIFACTS_NEMO_GYM_VENV``. Here:

* ``NemoGymServers``: ``gym env start`` with NeMo Gym's own ``example_single_tool_call`` configs
  and its ``vllm_model`` server pointed at the stub model (``tests/chat_stub.py``), from a working
  folder of its own where each server's ``.venv`` is a link to the venv (offline: nothing to
  download; ``+skip_venv_if_present=true`` reuses it). It runs in a session of its own (``setsid``)
  with Ray's files in a short temporary folder of its own; ``stop`` kills every process of that session
  (Ray's workers start process groups of their own inside it) and waits until none is left;
* ``gym_eval``: one ``gym eval run --no-serve`` against those servers, with NeMo Gym's own
  exporters or through ``gym-artifacts instrument --``, into a real ``mlflow server``, W&B
  offline (``WANDB_MODE=offline``) and, through gym-artifacts, a local folder and TensorBoard.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.server_process import free_port

VENV_ENV = "GYM_ARTIFACTS_NEMO_GYM_VENV"  # set by scripts/test.sh (scripts/nemo_gym_env.sh)
REPO = Path(__file__).resolve().parent.parent
AGENT = "example_single_tool_call_simple_agent"
SERVER_FOLDERS = (  # where `gym env start` looks for each server's .venv under its working folder
    "resources_servers/example_single_tool_call",
    "responses_api_agents/simple_agent",
    "responses_api_models/vllm_model",
    "environment_servers/legacy_agent",
)
WANDB_KEY = "k" * 40  # NeMo Gym's W&B config wants a key; offline, nothing checks it
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled", "RAY_DISABLE_DOCKER_CPU_WARNING": "1"}


def nemo_gym_venv() -> Path | None:
    """The NeMo Gym venv: ``$GYM_ARTIFACTS_NEMO_GYM_VENV``, else the checkout's ``.venv-nemo-gym``."""
    named = os.environ.get(VENV_ENV)
    venv = Path(named) if named else REPO / ".venv-nemo-gym"
    return venv if (venv / "bin" / "gym").is_file() else None


def site_packages(venv: Path) -> Path:
    [found] = sorted(venv.glob("lib/python3.*/site-packages"))
    return found


def session_processes(sid: int) -> list[int]:
    """Every live process of session ``sid`` (zombies left out: they are only waiting to be reaped)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.getsid(int(entry)) != sid:
                continue
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            found.append(int(entry))
    return found


def kill_session(proc: subprocess.Popen[bytes], deadline_s: float = 30.0) -> list[int]:
    """SIGKILL every process of ``proc``'s session, reap ``proc``; returns those still alive after
    ``deadline_s`` (none, unless the kernel could not kill them)."""
    deadline = time.monotonic() + deadline_s
    left = session_processes(proc.pid)
    while left and time.monotonic() < deadline:
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(0.2)
        left = session_processes(proc.pid)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(max(0.0, deadline - time.monotonic()))
    return left


@dataclass
class NemoGymServers:
    """NeMo Gym's servers for the example environment, run by ``gym env start``."""

    venv: Path
    root: Path
    model_url: str
    head_port: int = field(default_factory=free_port)
    extra: tuple[str, ...] = ()  # more config overrides (e.g. +observability_enabled=true)
    proc: subprocess.Popen[bytes] | None = None
    # Ray's files: a short path of its own (its socket paths must fit AF_UNIX's 107 bytes)
    ray_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="ngr-", dir="/tmp")))

    @property
    def log(self) -> Path:
        return self.root / "env-start.log"

    @property
    def env(self) -> dict[str, str]:
        """Ray's files under ``root`` (not /tmp/ray), no usage stats, no token file in ~/.ray."""
        return {**os.environ, **RAY_ENV, "RAY_TMPDIR": str(self.ray_dir)}

    def start(self, timeout: float = 300.0) -> NemoGymServers:
        work = self.root / "work"
        for folder in SERVER_FOLDERS:
            (work / folder).mkdir(parents=True, exist_ok=True)
            link = work / folder / ".venv"
            if not link.exists():
                link.symlink_to(self.venv)
        sp = site_packages(self.venv)
        cmd = [
            str(self.venv / "bin" / "gym"), "env", "start",
            "--config", str(sp / "resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml"),
            "--config", str(sp / "responses_api_models/vllm_model/configs/vllm_model.yaml"),
            f"+policy_base_url={self.model_url}", "+policy_api_key=stub-key", "+policy_model_name=stub-model",
            f"+head_server.port={self.head_port}", "+skip_venv_if_present=true", *self.extra,
        ]  # fmt: skip
        with open(self.log, "ab") as fh:
            self.proc = subprocess.Popen(
                cmd, cwd=work, stdout=fh, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log.read_text(errors="replace")
            if "servers ready!" in text:
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.5)
        tail = self.log.read_text(errors="replace")[-3000:]
        exited = self.proc.poll()
        self.stop()
        why = f"exited ({exited})" if exited is not None else f"not ready in {timeout:.0f}s"
        raise RuntimeError(f"gym env start {why}: {tail}")

    def stop(self) -> None:
        """Kill every process of the servers' session, remove Ray's files; raise if any survived."""
        if self.proc is None:
            return
        left = kill_session(self.proc)
        self.proc = None
        shutil.rmtree(self.ray_dir, ignore_errors=True)
        if left:
            raise RuntimeError(f"NeMo Gym processes survived a SIGKILL: {left}")


@dataclass
class EvalResult:
    """One ``gym eval run``: its output, exit code, wall time and output (stdout + stderr)."""

    folder: Path
    returncode: int
    wall_s: float
    log: str
    left_running: list[int]  # processes of the eval's session alive after it exited (then killed)

    @property
    def out(self) -> Path:
        return self.folder / "OUT.jsonl"


def gym_eval(
    servers: NemoGymServers,
    folder: Path,
    *,
    instrument: bool,
    mlflow_uri: str,
    experiment: str,
    extra: Sequence[str] = (),
    timeout: float = 240.0,
    while_running: Callable[[subprocess.Popen[bytes]], None] | None = None,
) -> EvalResult:
    """``gym eval run`` of the example's 5 tasks x 2 repeats, one rollout at a time (a
    deterministic order, so that step metrics compare), with NeMo Gym's MLflow and W&B keys; the
    same ``exporters.*`` keys for both kinds (NeMo Gym's own exporters ignore them; they log them
    as params). ``while_running`` is called once with the process, while it runs."""
    folder.mkdir(parents=True)
    sp = site_packages(servers.venv)
    cmd = [
        *([str(servers.venv / "bin" / "gym-artifacts"), "instrument", "--"] if instrument else []),
        str(servers.venv / "bin" / "gym"), "eval", "run", "--no-serve", "--agent", AGENT,
        "--input", str(sp / "resources_servers/example_single_tool_call/data/example.jsonl"),
        "--output", str(folder / "OUT.jsonl"), "--num-repeats", "2",
        f"+head_server.port={servers.head_port}", "+num_samples_in_parallel=1",
        f"+mlflow_tracking_uri={mlflow_uri}", f"+mlflow_experiment_name={experiment}",
        f"+mlflow_run_name={experiment}-run",
        "+wandb_project=ng-real", f"+wandb_name={experiment}-run", f"+wandb_api_key={WANDB_KEY}",
        "+exporters.local.enabled=true", f"+exporters.local.root={folder / 'local'}",
        "+exporters.tensorboard.enabled=true", f"+exporters.tensorboard.logdir={folder / 'tensorboard'}",
        *extra,
    ]  # fmt: skip
    env = {**servers.env, "WANDB_MODE": "offline"}
    log = folder / "eval.log"
    started = time.monotonic()
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, cwd=folder, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    left: list[int] = []
    try:
        if while_running is not None:
            while_running(proc)
        returncode = proc.wait(timeout)
        left = session_processes(proc.pid)
    except subprocess.TimeoutExpired:
        returncode = -9
    finally:
        wall = time.monotonic() - started
        kill_session(proc)  # whatever the eval left behind
    return EvalResult(folder, returncode, wall, log.read_text(errors="replace"), left)
