"""CLI habits: --version, ``python -m``, -v showing the tool's own steps, closed pipes, typos."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from gym_artifacts.cli import main
from tests.processes import reaped, run_bounded


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return run_bounded(
        [sys.executable, "-m", "gym_artifacts", *args], capture_output=True, text=True, cwd=cwd, timeout=120
    )


def test_version_and_module_entry_point() -> None:
    proc = _cli("--version")
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"gym-artifacts {version('gym-artifacts')}"
    helped = _cli("--help")
    assert helped.returncode == 0
    assert "thin layer" not in helped.stdout
    for command in ("export", "status", "report", "exporters"):
        assert command in helped.stdout


@pytest.mark.slow
@pytest.mark.parametrize("command", ["export", "status", "report", "exporters"])
def test_verbose_shows_the_tools_own_steps_for_every_command(
    command: str, quickstart_run: Path, local_config: Path
) -> None:
    args = {
        "export": ["export", str(quickstart_run), "-c", str(local_config)],
        "status": ["status", str(quickstart_run)],
        "report": ["report", str(quickstart_run), "-o", str(quickstart_run.with_name("r.html"))],
        "exporters": ["exporters"],
    }[command]
    quiet = _cli(*args)
    assert quiet.returncode == 0, quiet.stderr
    assert "INFO" not in quiet.stderr
    for verbose in (["-v", *args], [*args, "-v"]):  # before or after the command
        proc = _cli(*verbose)
        assert proc.returncode == 0, proc.stderr
        ours = [ln for ln in proc.stderr.splitlines() if ln.startswith("gym-artifacts: INFO: gym_artifacts")]
        assert len(ours) >= 2, proc.stderr  # the start line and at least one step of the command


@pytest.mark.slow
def test_closed_pipe_prints_no_traceback(quickstart_run: Path) -> None:
    # `status ... | head -1`: the reader goes away after the first line.
    proc = run_bounded(
        f"{sys.executable} -m gym_artifacts status {quickstart_run} | head -c 1 >/dev/null",
        shell=True, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr
    reader = subprocess.Popen(
        [sys.executable, "-m", "gym_artifacts", "exporters", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    with reaped(reader):
        assert reader.stdout is not None
        reader.stdout.close()  # closed before anything is written
        _, err = reader.communicate(timeout=120)
    assert b"Traceback" not in err, err


CONFIG_TYPOS = {  # a typo in a -c file: (the file after the local section, what the error says)
    "top-level key": ("upload_rollout: true\n", "unknown key 'upload_rollout'; did you mean 'upload_rollouts'?"),
    "unknown key": ("zzz: 1\n", "unknown key 'zzz'; known keys: exporters"),
    # under a backend, even a disabled one: the key is named, not "no exporter is enabled"
    "backend setting": ("  mlflow: {rooot: x}\n", "exporters.mlflow.rooot: unknown setting"),
}


@pytest.mark.parametrize("case", list(CONFIG_TYPOS))
def test_export_config_typo_is_refused_with_did_you_mean(
    case: str, quickstart_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tail, message = CONFIG_TYPOS[case]
    cfg = tmp_path / "typo.yaml"
    cfg.write_text(f"exporters:\n  local: {{enabled: true, root: {tmp_path / 'store'}}}\n{tail}")
    assert main(["export", str(quickstart_run), "-c", str(cfg)]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "store").exists()
    cfg.write_text(f"exporters:\n  local: {{rooot: {tmp_path / 'store'}}}\n")
    assert main(["export", str(quickstart_run), "-c", str(cfg)]) == 2
    assert "exporters.local.rooot: unknown setting" in capsys.readouterr().err


def test_a_runs_own_saved_config_may_hold_anything(
    quickstart_run: Path, local_config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = quickstart_run.with_name("eval_config.yaml")
    saved.write_text(saved.read_text() + "\nmy_eval_specific_key: 3\n")
    assert main(["export", str(quickstart_run), "-c", str(local_config)]) == 0


def test_progress_line_counts_exporters_as_exporters_and_bytes_as_bytes() -> None:
    import io

    from gym_artifacts.core.progress import Progress

    stream = io.StringIO()
    progress = Progress(stream=stream, enabled=True)
    progress.MIN_INTERVAL_S = 0  # draw every update
    progress.update("hashing rollouts.jsonl", 3 << 20, 6 << 20)
    progress.update("exporting to local", 1, 2)
    progress.update("exporting to mlflow", 2, 2)
    progress.close()
    text = stream.getvalue()
    assert "3.00M/6.00M" in text and "B" in text  # bytes, scaled
    assert "1/2" in text and "exporter" in text
    assert "1 B/2 B" not in text and "1B/2B" not in text
    assert Progress(stream=io.StringIO()).enabled is False  # never off a terminal


def test_every_option_of_every_command_says_what_it_does(capsys: pytest.CaptureFixture[str]) -> None:
    """``gym-artifacts COMMAND --help`` has a line of text for each of its options
    (``status --help`` once showed ``--json`` bare)."""
    import argparse

    from gym_artifacts.cli import build_parser, main

    parser = build_parser()
    [commands] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for command, sub in commands.choices.items():
        bare = [a.option_strings for a in sub._actions if a.option_strings and not (a.help or "").strip()]
        assert bare == [], (command, bare)
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        for action in sub._actions:
            if action.option_strings and action.help != argparse.SUPPRESS:
                assert " ".join(action.help.split()[:3]) in text, (command, action.option_strings)
