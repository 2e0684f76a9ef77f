"""The executor layer without a cluster: the API, the CLI's choices, Ray never imported locally."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gym_artifacts.cli import main
from gym_artifacts.export.executors import export_runs
from tests.processes import run_bounded
from tests.sweep import make_sweep

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_export_runs_api_gives_one_result_set_per_run_in_order(tmp_path: Path) -> None:
    runs = make_sweep(tmp_path / "runs", 3)
    broken = make_sweep(tmp_path / "broken", 1)[0]  # a bad run costs only itself
    broken.with_name("eval_aggregate_metrics.json").unlink()
    runs.insert(1, broken)
    seen: list[int] = []
    config = {"exporters": {"local": {"enabled": True, "root": str(tmp_path / "store")}}}
    out = export_runs(runs, config, on_result=lambda done, _: seen.append(done))
    assert [r.run for r in out] == [str(p) for p in runs]
    assert [[x.status.value for x in r.results] for r in out] == [
        ["EXPORTED"],
        ["FAILED"],
        ["EXPORTED"],
        ["EXPORTED"],
    ]
    assert seen == [1, 2, 3, 4]
    assert len(list((tmp_path / "store" / "default").iterdir())) == 3
    again = export_runs(runs, config, jobs=2)
    assert [[x.status.value for x in r.results] for r in again] == [
        ["SKIPPED"],
        ["FAILED"],
        ["SKIPPED"],
        ["SKIPPED"],
    ]


@pytest.mark.slow
def test_the_local_executor_never_imports_ray(tmp_path: Path) -> None:
    runs = make_sweep(tmp_path / "runs", 2)
    code = (
        "import sys, json; from gym_artifacts.cli import main\n"
        f"rc = main({json.dumps(['export', *map(str, runs), '-e', 'local', '--jobs', '2', '--json', f'exporters.local.root={tmp_path}/s'])})\n"
        "assert rc == 0, rc\nassert 'ray' not in sys.modules, 'ray imported'\n"
    )
    proc = run_bounded([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [r["status"] for r in json.loads(proc.stdout)] == ["EXPORTED", "EXPORTED"]


def test_a_ray_address_without_the_ray_executor_exits_2(
    quickstart_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["export", str(quickstart_run), "-e", "local", "--ray-address", "auto"]) == 2
    assert "a Ray address (--ray-address) needs the ray executor (--executor ray)" in capsys.readouterr().err


def test_an_unknown_executor_exits_2(quickstart_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["export", str(quickstart_run), "--executor", "dask"])
    assert exc.value.code == 2
    assert "invalid choice: 'dask'" in capsys.readouterr().err


@pytest.mark.slow
def test_readme_python_api_block_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """The "Python API" block of docs/cli.md, run in a folder holding the quickstart where it says."""
    import re

    from tests.conftest import copy_quickstart

    section = (REPO / "docs" / "cli.md").read_text().split("\n## Python API", 1)[1].split("\n## ", 1)[0]
    [block] = re.findall(r"```python\n(.*?)```", section, flags=re.S)[:1]
    copy_quickstart(tmp_path / "examples" / "quickstart")
    monkeypatch.chdir(tmp_path)
    exec(compile(block, "docs/cli.md", "exec"), {})
    out = capsys.readouterr().out
    assert re.search(r"eval\.jsonl local EXPORTED \S+ None", out), out
    assert "'local'" in out and "'mlflow'" in out
    assert len(list((tmp_path / "gym-artifacts-runs").rglob("run.json"))) == 1


@pytest.mark.parametrize("as_one", [str, Path], ids=["str", "Path"])
def test_a_single_run_and_a_single_exporter_name_are_a_list_of_one(
    as_one: type, quickstart_run: Path, tmp_path: Path
) -> None:
    """``export_runs("q/eval.jsonl", exporters="local")`` exports that one run (never its characters)."""
    config = {"exporters": {"local": {"enabled": True, "root": str(tmp_path / "store")}}}
    [out] = export_runs(as_one(quickstart_run), config, exporters="local")
    assert out.run == str(quickstart_run) and out.config_error is None
    assert [(r.exporter, r.status.value) for r in out.results] == [("local", "EXPORTED")]
    assert len(list((tmp_path / "store" / "default").iterdir())) == 1


@pytest.mark.parametrize(
    "flag", [{"upload_rollouts": "no"}, {"certify": "maybe"}, {"verify": "yes"}, {"upload_rollouts": 0}],
    ids=["upload_rollouts-str", "certify-str", "verify-str", "upload_rollouts-int"],
)
def test_a_flag_that_is_not_a_bool_is_refused_before_anything_is_sent(
    flag: dict[str, object], quickstart_run: Path, tmp_path: Path
) -> None:
    """``upload_rollouts='no'`` is truthy: taken as given it would upload; it is refused instead."""
    from gym_artifacts.core.errors import ConfigError

    config = {"exporters": {"local": {"enabled": True, "root": str(tmp_path / "store")}}}
    with pytest.raises(ConfigError, match=next(iter(flag))):
        export_runs([quickstart_run], config, **flag)  # type: ignore[arg-type]
    assert not (tmp_path / "store").exists()


WRONG_TYPES = {
    "jobs str": lambda run: export_runs([run], jobs="2"),
    "jobs bool": lambda run: export_runs([run], jobs=True),
    "config int": lambda run: export_runs([run], 5),
    "config list": lambda run: export_runs([run], ["a"]),
    "no run": lambda run: export_runs([]),
    "run None": lambda run: export_runs([None]),
    "executor int": lambda run: export_runs([run], executor=1),
    "run_status None": lambda run: __import__("gym_artifacts").run_status(None),
    "list_exporters int": lambda run: __import__("gym_artifacts").list_exporters(5),
}


@pytest.mark.parametrize("case", list(WRONG_TYPES))
def test_a_wrong_type_through_the_api_is_a_config_error(case: str, quickstart_run: Path) -> None:
    """The CLI's exit-2 error (ConfigError, naming what is wrong), never a raw TypeError."""
    from gym_artifacts.core.errors import ConfigError

    with pytest.raises(ConfigError):
        WRONG_TYPES[case](quickstart_run)
    assert not Path("gym-artifacts-runs").exists()



@pytest.mark.parametrize("root", ["", "  "], ids=["empty", "blank"])
@pytest.mark.parametrize("via", ["mapping", "override", "cli", "live"])
def test_an_empty_local_root_is_refused_by_every_route(
    via: str, root: str, quickstart_run: Path, capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One rule in the local settings model: an empty root never means ``./default/...``."""
    if via == "live":  # a live run never raises into the eval: the backend is left out, said in the log
        from gym_artifacts.live import live_run

        with live_run({"exporters": {"local": {"enabled": True, "root": root}}}, "out/eval.jsonl") as run:
            run.export_metrics({"a": 1}, step=0)
        message = caplog.text
    elif via == "cli":
        assert main(["export", str(quickstart_run), "-e", "local", f"exporters.local.root={root}"]) == 2
        message = capsys.readouterr().err
    else:
        kwargs = ({"config": {"exporters": {"local": {"enabled": True, "root": root}}}} if via == "mapping"
                  else {"overrides": [f"exporters.local.root={root}"], "exporters": ["local"]})
        [out] = export_runs([quickstart_run], **kwargs)  # type: ignore[arg-type]
        message = out.config_error or ""
    assert "exporters.local.root" in message and "empty" in message, message
    assert not Path("default").exists() and not Path("gym-artifacts-runs").exists()  # nothing written
