"""``gym-artifacts instrument -- COMMAND``: NeMo Gym's exporter module is gym-artifacts' drop-in in
the command and every Python process it starts, with nothing edited or left installed.

A minimal ``nemo_gym`` package (its ``exporters`` module says ``NEMO GYM'S OWN``) stands in for
NeMo Gym where these tests need one in this environment; ``tests/test_nemo_gym_real.py`` runs the
real NeMo Gym 0.7.0 through the same command.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gym_artifacts.instrument.command import SITE_DIR, instrumented_environment, python_of
from tests.load import scaled
from tests.processes import reaped, run_bounded

GYM_ARTIFACTS = [sys.executable, "-m", "gym_artifacts.cli"]
# What a process reports: which module ``nemo_gym.exporters`` is, and whether it is the drop-in.
PROBE = (
    "import nemo_gym.exporters as e, gym_artifacts.nemo_gym as g, nemo_gym;"
    "from nemo_gym.exporters import setup_exporters;"
    "print('ALIAS', e is g, nemo_gym.exporters is g, setup_exporters is g.setup_exporters)"
)


@pytest.fixture
def fake_nemo_gym(tmp_path: Path) -> Path:
    """A folder holding a ``nemo_gym`` package whose own ``exporters`` module is recognisable."""
    root = tmp_path / "ng"
    (root / "nemo_gym").mkdir(parents=True)
    (root / "nemo_gym" / "__init__.py").write_text("")
    (root / "nemo_gym" / "exporters.py").write_text(
        "print(\"NEMO GYM'S OWN\")\ndef setup_exporters(c):\n    return []\n"
    )
    return root


def instrument(*command: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return run_bounded(
        [*GYM_ARTIFACTS, "instrument", "--", *command],
        capture_output=True, text=True, timeout=timeout, env=env,
    )  # fmt: skip


def env_with(*paths: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in paths)
    env.update(extra)
    return env


def test_the_module_is_the_drop_in_itself(fake_nemo_gym: Path) -> None:
    proc = instrument(sys.executable, "-c", PROBE, env=env_with(fake_nemo_gym))
    assert proc.returncode == 0, proc.stderr
    assert "ALIAS True True True" in proc.stdout
    assert "NEMO GYM'S OWN" not in proc.stdout


def test_without_instrument_nemo_gyms_own_module_loads(fake_nemo_gym: Path) -> None:
    proc = run_bounded(
        [sys.executable, "-c", "import nemo_gym.exporters"], capture_output=True, text=True, timeout=60,
        env=env_with(fake_nemo_gym),
    )  # fmt: skip
    assert proc.stdout.strip() == "NEMO GYM'S OWN"


def test_a_missing_command_is_refused_with_the_shells_code() -> None:
    proc = instrument("gym-artifacts-no-such-command-anywhere")
    assert proc.returncode == 127
    assert "command not found" in proc.stderr


def test_no_command_is_a_usage_error() -> None:
    proc = run_bounded([*GYM_ARTIFACTS, "instrument"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "no command given" in proc.stderr


def test_a_file_that_cannot_be_executed_is_refused(tmp_path: Path) -> None:
    script = tmp_path / "not-executable.sh"
    script.write_text("echo hi\n")
    proc = instrument(str(script))
    assert proc.returncode == 126, proc.stderr


@pytest.mark.parametrize("code", [0, 1, 2, 3, 42, 126, 127, 255])
def test_the_commands_exit_code_is_passed_through(code: int) -> None:
    proc = instrument("sh", "-c", f"exit {code}")
    assert proc.returncode == code


def test_a_command_killed_by_a_signal_ends_by_that_signal() -> None:
    proc = instrument(sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)")
    assert proc.returncode == -signal.SIGTERM


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1])
def test_signals_reach_the_command(tmp_path: Path, sig: signal.Signals) -> None:
    """The command *is* the process started (exec): a signal sent to it is the command's."""
    ready = tmp_path / "ready"
    code = textwrap.dedent(f"""
        import pathlib, signal, sys, time
        signal.signal({int(sig)}, lambda *a: sys.exit(40 + {int(sig)} % 20))
        pathlib.Path({str(ready)!r}).write_text("x")
        time.sleep(60)
    """)
    proc = subprocess.Popen([*GYM_ARTIFACTS, "instrument", "--", sys.executable, "-c", code])
    with reaped(proc):
        deadline = time.monotonic() + scaled(60)
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the command never started"
            time.sleep(0.05)
        proc.send_signal(sig)
        assert proc.wait(scaled(30)) == 40 + int(sig) % 20


def test_an_existing_sitecustomize_still_runs(tmp_path: Path, fake_nemo_gym: Path) -> None:
    user_site = tmp_path / "user-site"
    user_site.mkdir()
    (user_site / "sitecustomize.py").write_text(
        "import builtins\nbuiltins.USER_HOOK_RUNS = getattr(builtins, 'USER_HOOK_RUNS', 0) + 1\n"
    )
    code = PROBE + ";import builtins, sitecustomize; print('HOOK', builtins.USER_HOOK_RUNS, sitecustomize.__file__)"
    proc = instrument(sys.executable, "-c", code, env=env_with(user_site, fake_nemo_gym))
    assert proc.returncode == 0, proc.stderr
    assert "ALIAS True True True" in proc.stdout
    # run once in the command's interpreter, and it is the ``sitecustomize`` module there
    assert f"HOOK 1 {user_site / 'sitecustomize.py'}" in proc.stdout


def test_nested_instrument_puts_the_hook_on_the_path_once(fake_nemo_gym: Path) -> None:
    code = PROBE + ";import os; print('PATH', os.environ['PYTHONPATH'])"
    proc = instrument(
        *GYM_ARTIFACTS, "instrument", "--", *GYM_ARTIFACTS, "instrument", "--", sys.executable, "-c", code,
        env=env_with(fake_nemo_gym),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "ALIAS True True True" in proc.stdout
    [path_line] = [line for line in proc.stdout.splitlines() if line.startswith("PATH ")]
    assert path_line.split(" ", 1)[1].split(os.pathsep) == [str(SITE_DIR), str(fake_nemo_gym)]


def test_python_child_processes_and_non_python_commands_are_instrumented(
    fake_nemo_gym: Path, tmp_path: Path
) -> None:
    """A shell (not Python) starts a Python that starts a Python: the last one is instrumented."""
    (tmp_path / "probe.py").write_text(PROBE.replace(";", "\n"))
    parent = tmp_path / "parent.py"
    parent.write_text(f"import subprocess, sys\nsubprocess.run([sys.executable, {str(tmp_path / 'probe.py')!r}], check=True)\n")
    proc = instrument("sh", "-c", f"{sys.executable} {parent}", env=env_with(fake_nemo_gym))
    assert proc.returncode == 0, proc.stderr
    assert "ALIAS True True True" in proc.stdout
    assert "NEMO GYM'S OWN" not in proc.stdout


def test_the_hook_imports_nothing_of_gym_artifacts_until_nemo_gym_asks(fake_nemo_gym: Path) -> None:
    code = "import sys; print('LOADED', sorted(m for m in sys.modules if m.startswith('gym_artifacts')))"
    proc = instrument(sys.executable, "-c", code, env=env_with(fake_nemo_gym))
    assert proc.returncode == 0, proc.stderr
    assert "LOADED []" in proc.stdout


@pytest.fixture
def bare_python(tmp_path: Path) -> Path:
    """A Python without gym-artifacts (a venv of its own, like a NeMo Gym server's)."""
    venv = tmp_path / "bare"
    run_bounded([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    return venv / "bin" / "python"


def test_a_command_whose_python_lacks_gym_artifacts_is_refused_up_front(bare_python: Path, tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    proc = instrument(str(bare_python), "-c", f"open({str(ran)!r}, 'w')")
    assert proc.returncode == 2
    assert f"gym-artifacts is not installed in {bare_python}" in proc.stderr
    assert "pip install gym-artifacts" in proc.stderr
    assert not ran.exists()
    script = tmp_path / "tool"
    script.write_text(f"#!{bare_python}\nopen({str(ran)!r}, 'w')\n")
    script.chmod(0o755)
    proc = instrument(str(script))
    assert proc.returncode == 2 and not ran.exists(), proc.stderr


def test_a_child_python_without_gym_artifacts_keeps_nemo_gyms_module_and_says_so(
    bare_python: Path, fake_nemo_gym: Path
) -> None:
    child = f"import subprocess; subprocess.run([{str(bare_python)!r}, '-c', 'import nemo_gym.exporters; import nemo_gym.exporters'], check=True)"
    proc = instrument(sys.executable, "-c", child, env=env_with(fake_nemo_gym))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("NEMO GYM'S OWN") == 1
    assert proc.stderr.count("gym-artifacts is not installed in this Python") == 1


def test_nothing_is_left_installed(fake_nemo_gym: Path) -> None:
    """After the command, a plain Python in the same environment gets NeMo Gym's own module."""
    assert instrument(sys.executable, "-c", PROBE, env=env_with(fake_nemo_gym)).returncode == 0
    test_without_instrument_nemo_gyms_own_module_loads(fake_nemo_gym)


@given(st.lists(st.sampled_from(["", "a", "/x/y", str(SITE_DIR), str(SITE_DIR) + "/", "b:c", "~"]), max_size=6))
def test_the_hook_goes_first_on_pythonpath_exactly_once(entries: list[str]) -> None:
    env = instrumented_environment({"PYTHONPATH": os.pathsep.join(entries), "OTHER": "kept"})
    parts = env["PYTHONPATH"].split(os.pathsep)
    assert parts[0] == str(SITE_DIR)
    assert sum(os.path.realpath(p) == str(SITE_DIR) for p in parts) == 1
    kept = [e for part in entries for e in part.split(os.pathsep) if e and os.path.realpath(e) != str(SITE_DIR)]
    assert parts[1:] == kept
    assert env["OTHER"] == "kept"


def test_python_of_reads_scripts_and_interpreters(tmp_path: Path) -> None:
    assert python_of(sys.executable) == sys.executable
    script = tmp_path / "s"
    script.write_text(f"#!{sys.executable} -u\nprint(1)\n")
    assert python_of(str(script)) == sys.executable
    script.write_text("#!/bin/sh\necho\n")
    assert python_of(str(script)) is None
    script.write_bytes(b"\x7fELF\x00\x00")
    assert python_of(str(script)) is None
