"""Run arguments, config resolution errors, lone surrogates, long stems
and interpolation chains: each a clear message or a per-backend result, never a traceback, a
write outside the run, or a hang."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.processes import run_bounded

REPO = Path(__file__).resolve().parents[2]


def cli(*args: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    env["PYTHONPATH"] = str(REPO)
    return run_bounded([sys.executable, "-m", "gym_artifacts.cli", *args], capture_output=True, text=True,
                          cwd=cwd or REPO, env=env, timeout=timeout)  # fmt: skip


def tree(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in folder.rglob("*")}


@pytest.mark.parametrize("argument", ["", " ", ".", "./", "..", "runs/.", "runs"])
@pytest.mark.parametrize("command", ["export", "status", "report"])
def test_run_arguments_that_name_no_run_exit_2(
    quickstart_run: Path, tmp_path: Path, argument: str, command: str
) -> None:
    work = quickstart_run.parent  # the working folder is a folder of runs; its parent gets nothing either
    (work / "runs").mkdir()
    shutil.copy(quickstart_run, work / "runs" / "x.jsonl")
    (work / "runs" / "x_aggregate_metrics.json").write_text("[]")
    before, before_parent = tree(work), tree(work.parent)
    extra = ["-e", "local", f"exporters.local.root={tmp_path / 'store'}"] if command == "export" else []
    proc = cli(command, argument, *extra, cwd=work)
    assert proc.returncode == 2, (proc.stdout, proc.stderr[-2000:])
    assert "no run at" in proc.stderr and "Traceback" not in proc.stderr
    assert tree(work) == before and tree(work.parent) == before_parent
    assert not (tmp_path / "store").exists()


def chain(links: int, root: str) -> str:
    return "\n".join([f"a0: {root}", *(f"a{i}: ${{a{i - 1}}}" for i in range(1, links))]) + "\n"


@pytest.mark.parametrize("root", ["x", "${oc.env:GYMART_GONE_VARIABLE}"])
def test_an_interpolation_chain_resolves_in_linear_time(root: str) -> None:
    """2,000 links, ending in a value or in a variable that is gone: one resolution per link (the
    key-by-key retry walked the whole chain for every key). Counted, not timed: the number of
    node resolutions must stay within a small multiple of the chain's length."""
    from omegaconf import OmegaConf
    from omegaconf.basecontainer import BaseContainer

    from gym_artifacts.core.config import resolve_tolerant

    cfg = OmegaConf.create(chain(2000, root))
    calls = 0
    original = BaseContainer._resolve_interpolation_from_parse_tree

    def counting(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        return original(self, *args, **kwargs)

    BaseContainer._resolve_interpolation_from_parse_tree = counting  # type: ignore[method-assign]
    try:
        resolved = resolve_tolerant(cfg)
    finally:
        BaseContainer._resolve_interpolation_from_parse_tree = original  # type: ignore[method-assign]
    assert calls < 10 * 2000, calls
    if root == "x":
        assert resolved["a1999"] == "x"
    else:  # kept as written, each link
        assert resolved["a0"] == root and resolved["a1999"] == "${a1998}"


@pytest.mark.slow
def test_export_status_and_report_of_a_run_with_a_2000_link_chain_finish(
    quickstart_run: Path, tmp_path: Path
) -> None:
    config = quickstart_run.with_name("eval_config.yaml")
    config.write_text(config.read_text() + chain(2000, "${oc.env:GYMART_GONE_VARIABLE}"))
    for args in (["status", str(quickstart_run)], ["report", str(quickstart_run)],
                 ["export", str(quickstart_run), "-e", "local", f"exporters.local.root={tmp_path / 's'}", "--json"]):  # fmt: skip
        proc = cli(*args, timeout=240)  # generous: the quadratic retry took over 120 s here
        assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)[0]["status"] == "EXPORTED"


UNRESOLVABLE = {
    "gone variable": {"root": "${oc.env:GYMART_GONE_ROOT}"},
    "cycle": {"root": "${exporters.local.experiment}", "experiment": "${exporters.local.root}"},
    "gone flag": {"enabled": "${oc.env:GYMART_GONE_FLAG}"},
}


@pytest.mark.parametrize("case", UNRESOLVABLE)
def test_an_unresolvable_setting_is_that_backends_failed(
    quickstart_run: Path, tmp_path: Path, case: str
) -> None:
    import yaml

    config = quickstart_run.with_name("eval_config.yaml")
    saved = yaml.safe_load(config.read_text())
    saved["exporters"] = {
        "local": {"enabled": True, "root": str(tmp_path / "store"), **UNRESOLVABLE[case]},
        "tensorboard": {"enabled": True, "logdir": str(tmp_path / "tb")},
    }
    config.write_text(yaml.safe_dump(saved))
    proc = cli("export", str(quickstart_run), "--json")
    assert proc.returncode == 1, proc.stderr[-2000:]
    results = {r["exporter"]: r for r in json.loads(proc.stdout)}
    assert results["tensorboard"]["status"] == "EXPORTED"
    assert results["local"]["status"] == "FAILED"
    assert "exporters.local" in results["local"]["reason"] and "cannot resolve" in results["local"]["reason"]
    assert "internal error" not in proc.stdout + proc.stderr and "Traceback" not in proc.stderr
    for command in ("status", "report"):
        proc = cli(command, str(quickstart_run))
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]


@pytest.mark.parametrize(
    "config",
    [*({"exporters": {"local": {"enabled": True, **v}}} for v in UNRESOLVABLE.values()),
     ["a", "list"], {"exporters": ["local"]}, {"resume": "${oc.env:GYMART_GONE}", "exporters": {}}],
)  # fmt: skip
def test_live_logging_never_raises_a_config_error_into_the_eval(
    tmp_path: Path, config: object, caplog: pytest.LogCaptureFixture
) -> None:
    from gym_artifacts import nemo_gym
    from gym_artifacts.live import live_run

    out = tmp_path / "run" / "eval.jsonl"
    with live_run(config, out, teardown_timeout=5) as live:
        live.export_metrics({"x": 1.0}, step=0)
        assert not getattr(live, "exporters", ())
    assert "cannot" in caplog.text or "must be" in caplog.text
    if isinstance(config, dict):
        nemo_gym.setup_exporters({**config, "output_jsonl_fpath": str(tmp_path / "nemo" / "eval.jsonl")})
        assert nemo_gym.get_exporters() == []
        nemo_gym.teardown_exporters()


def plant_lone_surrogates(run: Path) -> None:
    """A truncated emoji (a lone surrogate escape) in a rollout, the aggregate metrics and the journal."""
    rows = run.read_text().splitlines()
    first = json.loads(rows[0])
    first["note"] = "cut \ud800 here"
    rows[0] = json.dumps(first)  # json.dumps writes the escape "\ud800": valid JSON text
    run.write_text("\n".join(rows) + "\n")
    aggregate = run.with_name("eval_aggregate_metrics.json")
    entries = json.loads(aggregate.read_text())
    entries[0]["note\udbff"] = "x\udc00"
    aggregate.write_text(json.dumps(entries))
    with run.with_name("eval_metrics.jsonl").open("a") as fh:
        fh.write(
            json.dumps({"step": 10_000, "time": 1.0, "metrics": {"t\ud800": "v\ud800", "r": 1.0}}) + "\n"
        )


@pytest.mark.slow
def test_lone_surrogates_never_crash_a_reader_or_a_backend(quickstart_run: Path, tmp_path: Path) -> None:
    plant_lone_surrogates(quickstart_run)
    for command in (["status"], ["status", "--json"], ["report"]):
        proc = cli(command[0], str(quickstart_run), *command[1:])
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert quickstart_run.with_name("eval_report.html").read_text(encoding="utf-8").endswith("</html>\n")
    proc = cli("export", str(quickstart_run), "--json", "-e", "local", "-e", "mlflow", "-e", "wandb", "-e", "tensorboard",
               f"exporters.local.root={tmp_path / 'store'}", f"exporters.mlflow.tracking_uri=sqlite:///{tmp_path / 'm.db'}",
               f"exporters.wandb.dir={tmp_path / 'wb'}", "exporters.wandb.mode=offline",
               f"exporters.tensorboard.logdir={tmp_path / 'tb'}", cwd=tmp_path, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert [r["status"] for r in json.loads(proc.stdout)] == ["EXPORTED"] * 4


def test_a_lone_surrogate_escape_reads_as_its_escape() -> None:
    from gym_artifacts.core.jsonio import canonical_json, loads_lenient

    value = loads_lenient(b'{"a\\ud800": ["x\\udfff", "\\ud83d\\ude00"]}')
    assert value == {"a\\ud800": ["x\\udfff", "\U0001f600"]}
    canonical_json(value).decode("utf-8")


@pytest.mark.parametrize("command", ["status", "report", "export"])
def test_a_stem_too_long_for_a_receipt_is_refused_up_front(make_run, tmp_path: Path, command: str) -> None:
    """229 bytes: the run's own files fit, ``_tensorboard_export_done.json`` does not."""
    run = make_run("r" * 229)
    before = tree(run.parent)
    extra = [f"exporters.local.root={tmp_path / 'store'}", f"exporters.tensorboard.logdir={tmp_path / 'tb'}",
             "-e", "local", "-e", "tensorboard", "--json"] if command == "export" else []  # fmt: skip
    proc = cli(command, str(run), *extra)
    assert proc.returncode == 2, (proc.stdout, proc.stderr[-2000:])
    assert "the run's name is too long" in proc.stderr and "Traceback" not in proc.stderr
    assert "_tensorboard_export_done.json" in proc.stderr
    assert tree(run.parent) == before and not (tmp_path / "store").exists()


def test_a_long_stem_that_holds_every_name_exports(make_run, tmp_path: Path) -> None:
    run = make_run("r" * 200)
    proc = cli("export", str(run), "-e", "local", "-e", "tensorboard", "--json",
               f"exporters.local.root={tmp_path / 'store'}", f"exporters.tensorboard.logdir={tmp_path / 'tb'}")  # fmt: skip
    assert [r["status"] for r in json.loads(proc.stdout)] == ["EXPORTED"] * 2, proc.stderr[-2000:]
    assert cli("status", str(run)).returncode == 0


def test_live_logging_to_a_stem_too_long_is_refused_not_raised(tmp_path: Path) -> None:
    from gym_artifacts.live import live_run

    out = tmp_path / "live" / ("r" * 215 + ".jsonl")
    out.parent.mkdir()
    with live_run({"exporters": {}}, out) as live:
        live.export_metrics({"x": 1.0}, step=0)
    assert live.writer_refused is not None and "too long" in live.writer_refused
    assert list(out.parent.iterdir()) == []
