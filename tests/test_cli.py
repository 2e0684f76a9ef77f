"""The command line: exit codes, JSON output, errors naming file and line, no SDK on listing."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gym_artifacts.cli import main
from tests.processes import run_bounded

REPO = Path(__file__).resolve().parent.parent


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return run_bounded(
        [sys.executable, "-m", "gym_artifacts.cli", *args],
        capture_output=True, text=True, cwd=cwd, timeout=120,
    )  # fmt: skip


def test_exporters_lists_without_importing_any_sdk() -> None:
    proc = run_bounded(
        [sys.executable, "-X", "importtime", "-m", "gym_artifacts.cli", "exporters"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^local\s+yes\s+yes", proc.stdout, re.M)
    # the LLM-eval backends are listed, with whether their SDK is installed and what they can do
    expected = (
        ("tensorboard", "tensorboard", "live, post-run"),
        ("langsmith", "langsmith", "live, post-run"),
        ("phoenix", "phoenix", "live, post-run"),
    )
    for name, sdk, modes in expected:
        installed = "yes" if importlib.util.find_spec(sdk) is not None else "no"
        assert re.search(rf"^{name}\s+no\s+{installed}\s+{modes}\s", proc.stdout, re.M), proc.stdout
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if "|" in line}
    for sdk in ("wandb", "mlflow", "torch", "av", "tensorboard", "langsmith", "phoenix"):
        assert not any(m == sdk or m.startswith(sdk + ".") for m in imported), sdk


def test_export_json_then_skipped(
    quickstart_run: Path, local_config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["export", str(quickstart_run), "-c", str(local_config), "--json"]) == 0
    [first] = json.loads(capsys.readouterr().out)
    assert first["status"] == "EXPORTED"
    assert first["run"] == str(quickstart_run)
    assert set(first) == {
        "run",
        "exporter",
        "status",
        "backend_run_id",
        "reason",
        "rows",
        "bytes",
        "seconds",
        "certified",
    }
    assert first["certified"] is False  # a boolean: no live run of this output was completed
    assert first["rows"] == 300 and first["bytes"] > 100_000
    assert main(["export", str(quickstart_run), "-c", str(local_config), "--json"]) == 0
    [second] = json.loads(capsys.readouterr().out)
    assert second["status"] == "SKIPPED"
    assert second["backend_run_id"] == first["backend_run_id"]


def test_human_table(quickstart_run: Path, local_config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", str(quickstart_run), "-c", str(local_config)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^exporter\s+status\s+backend run\s+rows\s+bytes\s+seconds\s+reason", out, re.M)
    assert re.search(r"^local\s+EXPORTED\s+runs_eval-[0-9a-f]{16}\s+300\s", out, re.M)


@pytest.mark.parametrize(
    ("flags", "complete", "deprecated"),
    [
        ([], None, None),
        (["--complete-live-run"], True, None),
        (["--no-complete-live-run"], False, None),
        (["--certify"], True, "--certify is deprecated: use --complete-live-run"),
        (["--no-certify"], False, "--no-certify is deprecated: use --no-complete-live-run"),
    ],
)
def test_complete_live_run_flag_and_its_deprecated_name(
    flags: list[str], complete: bool | None, deprecated: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--[no-]complete-live-run`` chooses whether a live run is completed or a new one sent; the
    old ``--[no-]certify`` (a name that said "certify" for this choice) still works, hidden from
    ``--help``, and says it is deprecated."""
    from gym_artifacts.cli import build_parser

    parser = build_parser()
    ns = parser.parse_args(["export", "run.jsonl", *flags])
    assert ns.certify is complete
    err = capsys.readouterr().err
    assert (deprecated in err) if deprecated else ("deprecated" not in err)
    help_text = parser._subparsers._group_actions[0].choices["export"].format_help()  # type: ignore[union-attr]
    assert "--complete-live-run" in help_text and "certify" not in help_text


def test_failed_export_exits_1(
    quickstart_run: Path, local_config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    quickstart_run.with_name("eval_aggregate_metrics.json").unlink()
    assert main(["export", str(quickstart_run), "-c", str(local_config), "--json"]) == 1
    [result] = json.loads(capsys.readouterr().out)
    assert result["status"] == "FAILED" and "missing" in result["reason"]


def test_unknown_exporter_exits_2_listing_known(
    quickstart_run: Path, local_config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["export", str(quickstart_run), "-c", str(local_config), "-e", "nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown exporter 'nope'" in err and "local" in err


def test_malformed_config_exits_2_naming_line(
    quickstart_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("exporters:\n  local: {enabled: true\n")
    assert main(["export", str(quickstart_run), "-c", str(bad)]) == 2
    assert re.search(r"bad\.yaml:\d+:\d+: invalid YAML", capsys.readouterr().err)


def test_invalid_setting_exits_2(
    quickstart_run: Path, local_config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["export", str(quickstart_run), "-c", str(local_config), "exporters.local.enabled=perhaps"])
    assert code == 2
    assert "exporters.local.enabled: 'perhaps' is not a boolean" in capsys.readouterr().err


def test_malformed_rollouts_fail_naming_line(
    quickstart_run: Path, local_config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with open(quickstart_run, "a") as fh:
        fh.write('{"reward": 1.0,\n')
    quickstart_run.with_name("eval_aggregate_metrics.json").touch()
    assert main(["export", str(quickstart_run), "-c", str(local_config), "--json"]) == 1
    [result] = json.loads(capsys.readouterr().out)
    assert re.search(r"eval\.jsonl:301:\d+: invalid JSONL line", result["reason"])


def test_malformed_saved_run_config_fails_naming_line(
    quickstart_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    quickstart_run.with_name("eval_config.yaml").write_text("a: 1\nb: [\n")
    assert main(["export", str(quickstart_run), "--json", "-e", "local"]) == 1
    [result] = json.loads(capsys.readouterr().out)
    assert re.search(r"eval_config\.yaml:\d+:\d+: invalid YAML", result["reason"])


@pytest.mark.slow
def test_upload_rollouts_flag_and_override(
    quickstart_run: Path, local_config: Path, make_run, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(
            [
                "export",
                str(quickstart_run),
                "-c",
                str(local_config),
                "--no-upload-rollouts",
                "--json",
            ]
        )
        == 0
    )
    [result] = json.loads(capsys.readouterr().out)
    assert result["rows"] == 0
    other = make_run()
    assert main(["export", str(other), "-c", str(local_config), "upload_rollouts=false", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["rows"] == 0


@pytest.mark.slow
def test_several_runs_in_parallel_jobs(make_run, local_config: Path) -> None:
    runs = [str(make_run(f"r{i}")) for i in range(3)]
    proc = run_cli("export", *runs, "-c", str(local_config), "--jobs", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout)
    assert [r["run"] for r in results] == runs
    assert {r["status"] for r in results} == {"EXPORTED"}
    # three copies of one run's content (other folders and stems): one local run holds them, as one
    # MLflow run would; two jobs at once meet there (the identity lock orders them)
    [folder] = {r["backend_run_id"] for r in results}
    assert [p.name for p in (local_config.parent / "store" / "tests").iterdir()] == [folder]


@pytest.mark.slow
def test_status_reports_receipts(
    quickstart_run: Path, local_config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["export", str(quickstart_run), "-c", str(local_config)])
    capsys.readouterr()
    assert main(["status", str(quickstart_run), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["missing_for_export"] is None
    assert report["exporters"]["local"]["receipt"] == "matches"
    (quickstart_run.with_name("eval_artifacts") / "recording.mp4").write_bytes(b"changed")
    assert main(["status", str(quickstart_run), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["exporters"]["local"]["receipt"] == "differs"
    assert report["exporters"]["local"]["differences"] == ["artifacts/recording.mp4 changed"]


@pytest.mark.parametrize("folder", ["run folder", "artifacts folder"])
def test_a_local_root_inside_the_exported_run_is_refused(
    folder: str, quickstart_run: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``cd run1/eval_artifacts && gym-artifacts export $PWD -e local``: the default root would copy
    itself into itself; it is a FAILED result naming the cause, and nothing is left half-written.
    ``export .`` and a folder of runs name no run at all (exit 2, issue 27)."""
    inside = quickstart_run.parent if folder == "run folder" else quickstart_run.with_name("eval_artifacts")
    monkeypatch.chdir(inside)
    assert main(["export", ".", "-e", "local", "--json"]) == 2
    assert "no run at ." in capsys.readouterr().err
    if folder == "run folder":
        assert main(["export", str(inside), "-e", "local", "--json"]) == 2
        assert "it is a folder of runs" in capsys.readouterr().err
        assert not (inside / "gym-artifacts-runs").exists()
        return
    assert main(["export", str(inside), "-e", "local", "--json"]) == 1
    [result] = json.loads(capsys.readouterr().out)
    assert result["status"] == "FAILED" and "inside the run" in result["reason"], result
    assert not (inside / "gym-artifacts-runs").exists()
