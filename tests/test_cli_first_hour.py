"""A newcomer's first hour with the command: typos get a "did you mean", a bad option shows the
usage of the command it was given to, any failure (from a dependency or the system) is one line
without a traceback (``-v`` shows it), and no SDK prints its INFO lines unless ``-v`` asks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gym_artifacts.cli import build_parser, main
from tests.processes import run_bounded

SUBCOMMANDS = ("export", "status", "report", "exporters")


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The command in a fresh interpreter, with no logging setting of the user's."""
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_LOGGING_LEVEL", "WANDB_SILENT")}
    return run_bounded(
        [sys.executable, "-m", "gym_artifacts", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=180,
        env=env,
    )


@pytest.mark.parametrize(
    ("typo", "meant"),
    [("exprot", "export"), ("stauts", "status"), ("reprot", "report"), ("exporter", "exporters")],
)
def test_an_unknown_command_gets_did_you_mean(
    typo: str, meant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main([typo, "run.jsonl"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"did you mean '{meant}'?" in err, err


def _subcommand_options() -> list[tuple[str, str]]:
    """(command, long option) for every long option of every command."""
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    out = []
    for command in SUBCOMMANDS:
        for action in sub.choices[command]._actions:
            out += [
                (command, opt) for opt in action.option_strings if opt.startswith("--") and opt != "--help"
            ]
    return out


def _typo(option: str) -> str:
    """The option with one inner letter dropped (a prefix would be a valid abbreviation)."""
    body = option[2:]
    i = len(body) // 2
    return "--" + body[:i] + body[i + 1 :]


@pytest.mark.parametrize(("command", "option"), _subcommand_options())
def test_a_mistyped_option_gets_did_you_mean_and_its_commands_usage(
    command: str, option: str, quickstart_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    typo = _typo(option)
    args = [command] + ([] if command == "exporters" else [str(quickstart_run)]) + [typo]
    with pytest.raises(SystemExit) as exited:
        main(args)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: gym-artifacts {command} "), err  # the command's own usage
    assert f"unrecognized arguments: {typo}" in err
    assert f"did you mean '{option}'?" in err, err


def test_an_option_with_nothing_close_names_no_guess(
    quickstart_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(["export", str(quickstart_run), "--zzzzzzzz"])
    err = capsys.readouterr().err
    assert "unrecognized arguments: --zzzzzzzz" in err and "did you mean" not in err


def test_an_invalid_choice_gets_did_you_mean(
    quickstart_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(["export", str(quickstart_run), "--executor", "rey"])
    err = capsys.readouterr().err
    assert err.startswith("usage: gym-artifacts export ") and "did you mean 'ray'?" in err, err


@pytest.mark.parametrize(
    ("typo", "meant"),
    [("mlfow", "mlflow"), ("wandbb", "wandb"), ("locl", "local"), ("tensorbord", "tensorboard")],
)
def test_an_unknown_exporter_gets_did_you_mean(
    typo: str, meant: str, quickstart_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["export", str(quickstart_run), "-e", typo]) == 2
    err = capsys.readouterr().err
    assert f"unknown exporter {typo!r}; did you mean {meant!r}?" in err, err
    assert not list(quickstart_run.parent.glob("*_export_done.json"))


@pytest.mark.slow
def test_a_failure_from_below_is_one_line_without_a_traceback(quickstart_run: Path, tmp_path: Path) -> None:
    """The operating system refuses the report's destination (a folder): one line, exit 1; -v
    adds the traceback; the refused write leaves no temporary file behind."""
    folder = tmp_path / "a-folder"
    folder.mkdir()
    proc = _cli("report", str(quickstart_run), "-o", str(folder), cwd=tmp_path)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith("gym-artifacts: error: ") and "Is a directory" in line and "-v" in line, line
    verbose = _cli("report", str(quickstart_run), "-o", str(folder), "-v", cwd=tmp_path)
    assert verbose.returncode == 1 and "Traceback" in verbose.stderr
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".gymart-tmp")) == []


@pytest.mark.slow
def test_no_sdk_prints_info_without_verbose(quickstart_run: Path, tmp_path: Path) -> None:
    """A fresh MLflow SQLite store (MLflow logs "Creating initial MLflow database tables" at
    INFO), W&B offline and TensorBoard: a successful export prints nothing to stderr; -v shows
    the backends' own log lines."""
    config = tmp_path / "c.yaml"
    config.write_text(
        "exporters:\n"
        f"  mlflow: {{enabled: true, tracking_uri: 'sqlite:///{tmp_path}/m.db', experiment_name: x}}\n"
        f"  wandb: {{enabled: true, mode: offline, dir: '{tmp_path}/wb', project: p}}\n"
        f"  tensorboard: {{enabled: true, logdir: '{tmp_path}/tb'}}\n"
    )
    proc = _cli("export", str(quickstart_run), "-c", str(config), "-q", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "", proc.stderr
    fresh = tmp_path / "again"
    fresh.mkdir()
    config.write_text(config.read_text().replace(f"{tmp_path}/m.db", f"{fresh}/m.db"))
    verbose = _cli("export", str(quickstart_run), "-c", str(config), "-q", "-v", "--no-complete-live-run", cwd=tmp_path)
    assert verbose.returncode == 0, verbose.stderr
    assert "Creating initial MLflow database tables" in verbose.stderr
