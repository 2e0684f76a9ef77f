"""NeMo Gym's own exporter behaviours, stated from its code, held by ``gym_artifacts.nemo_gym``.

Each ``ng_*`` function below restates one rule of NeMo Gym main (``nemo_gym/exporters/`` and
``nemo_gym/config_types.py``; the cases its ``tests/unit_tests/test_exporters.py`` asserts) in
the plainest form, independent of this project's code. The tests run NeMo Gym's calls against
``gym_artifacts.nemo_gym`` on real stores (MLflow SQLite read back with ``MlflowClient``, W&B
offline files, the local folder) and compare with the stated rule.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import re
import socket
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gym_artifacts import nemo_gym
from gym_artifacts._builtin_exporters._mlflow_mapping import config_params, flatten_config, sanitize_key
from gym_artifacts.core.config import enabled_exporters, normalize
from tests.mlflow_store import mlflow_sqlite
from tests.processes import run_bounded

MAX_ENTITY_KEY_LENGTH = 250  # mlflow.utils.validation
MAX_PARAM_VAL_LENGTH = 6000

# -- NeMo Gym's rules, stated ---------------------------------------------------------------------


def ng_available(config: Mapping[str, Any], backend: str) -> bool:
    """config_types: WANDBConfig / MLFlowConfig / LangSmithConfig ``is_available``."""
    c = config.get
    if backend == "wandb":
        return bool(
            c("wandb_project") and c("wandb_name") and c("wandb_api_key") and c("wandb_api_key") != "****"
        )
    if backend == "mlflow":  # the token is optional, but a masked one means "not configured"
        return bool(
            c("mlflow_tracking_uri") and c("mlflow_experiment_name") and c("mlflow_run_name")
            and c("mlflow_tracking_token") != "****"
        )  # fmt: skip
    assert backend == "langsmith"
    return bool(
        c("langsmith_api_key") and c("langsmith_dataset_name") and c("langsmith_experiment_name")
        and c("langsmith_api_key") != "****"
    )  # fmt: skip


def ng_sanitize(key: str) -> str | None:
    """exporters/mlflow.py ``_sanitize_key``: ``@`` -> ``_at_``, characters outside
    ``[/\\w.\\- :]`` -> ``_``, empty path segments dropped, all-dot segments and leading dots ->
    as many ``_``; then a name over 250 characters keeps its head (the larger half) and tail
    around ``___`` and is normalised again; nothing left -> dropped (None)."""

    def normalize_path(name: str) -> str:
        segments = [s for s in name.split("/") if s != ""]
        segments = [("_" * len(s)) if s.strip(".") == "" else s for s in segments]
        joined = "/".join(segments)
        stripped = joined.lstrip(".")
        return "_" * (len(joined) - len(stripped)) + stripped

    name = normalize_path(re.sub(r"[^/\w.\- :]", "_", key.replace("@", "_at_")))
    if len(name) > MAX_ENTITY_KEY_LENGTH:
        kept = MAX_ENTITY_KEY_LENGTH - 3
        tail = kept // 2
        name = name[: kept - tail] + "___" + (name[len(name) - tail :] if tail else "")
    name = normalize_path(name)
    return name or None


def ng_flatten(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """exporters/mlflow.py ``_flatten_config``: ``a.b``, list items ``a[0]``, empty containers
    yield nothing."""
    if isinstance(value, dict):
        return [kv for k, v in value.items() for kv in ng_flatten(v, f"{prefix}.{k}" if prefix else str(k))]
    if isinstance(value, list):
        return [kv for i, v in enumerate(value) for kv in ng_flatten(v, f"{prefix}[{i}]")]
    return [(prefix, value)] if prefix else []


def ng_rollout_cells(rollouts: list[dict[str, Any]]) -> list[Any]:
    """What NeMo Gym's W&B table ``Rollouts`` / MLflow table ``rollouts.json`` hold per row:
    one JSON document of the rollout in column ``Rollout``."""
    return [json.loads(json.dumps(r)) for r in rollouts]


# NeMo Gym's own sanitiser cases (test_exporters.py::TestSanitizeKey).
NG_SANITIZE_CASES = {
    "simple_agent/mean/reward": "simple_agent/mean/reward",
    "a b:c-d.e/f": "a b:c-d.e/f",
    "gpqa_simple_agent/pass@1/accuracy": "gpqa_simple_agent/pass_at_1/accuracy",
    "weird[0]": "weird_0_",
    "/leading": "leading",
    "trailing/": "trailing",
    "a//b": "a/b",
    "a/../b": "a/__/b",
    "...x": "___x",
    "": None,
    "/": None,
    "//": None,
}
LONG_NAME = "gpqa/" + "z" * (MAX_ENTITY_KEY_LENGTH + 10) + "/mean/reward"


# -- fixtures and readers ---------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _fresh_module() -> Iterator[None]:
    nemo_gym.teardown_exporters()
    yield
    nemo_gym.teardown_exporters()


def mlflow_runs(uri: str, experiment: str) -> list[Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    return [] if found is None else client.search_runs([found.experiment_id])


def mlflow_table(uri: str, run_id: str, artifact: str) -> dict[str, Any]:
    from mlflow.tracking import MlflowClient

    local = MlflowClient(uri).download_artifacts(run_id, artifact)
    return json.loads(Path(local).read_text())


def wandb_runs(root: Path) -> list[Any]:
    from tests.wandb_records import offline_runs

    return offline_runs(root)


def wandb_history_tables(run: Any, key: str) -> list[dict[str, Any]]:
    """The tables logged under ``key`` in the run's history, read from the run's files."""
    return [
        json.loads(run.file(item[f"{key}.path"]).read_text())
        for item in run.history
        if item.get(f"{key}._type") == "table-file"
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def full_config(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    """A NeMo Gym global config with W&B and MLflow fully configured (W&B offline here)."""
    return {
        "output_jsonl_fpath": str(tmp_path / "results" / "rollouts.jsonl"),
        "results_dir": str(tmp_path / "results"),
        "policy_api_key": "sk-policy-secret-0123456789",
        "wandb_project": "ng",
        "wandb_name": "ng-run",
        "wandb_api_key": "wandb-secret-key-0123456789",
        "mlflow_tracking_uri": mlflow_sqlite(tmp_path / 'mlflow.db'),
        "mlflow_experiment_name": "ng-real",
        "mlflow_run_name": "ng-run",
        "exporters": {"wandb": {"mode": "offline"}},  # this project's own key: no network here
        **extra,
    }


# -- availability: which backends open --------------------------------------------------------------

FLAT_VALUES = st.sampled_from([None, "", "****", "set"])
NG_KEYS = [
    "wandb_project", "wandb_name", "wandb_api_key",
    "mlflow_tracking_uri", "mlflow_experiment_name", "mlflow_run_name", "mlflow_tracking_token",
    "langsmith_api_key", "langsmith_dataset_name", "langsmith_experiment_name",
]  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(NG_KEYS), FLAT_VALUES))
def test_the_backends_nemo_gym_would_open_are_the_ones_enabled(config: dict[str, Any]) -> None:
    """For every mix of NeMo Gym's flat keys (set, empty, masked, absent): the drop-in enables
    exactly the backends NeMo Gym's ``is_available`` opens, and never edits the caller's dict."""
    before = copy.deepcopy(config)
    enabled = set(enabled_exporters(normalize(nemo_gym.drop_in_config(config))))
    assert enabled == {b for b in ("wandb", "mlflow", "langsmith") if ng_available(config, b)}
    assert config == before


@pytest.mark.parametrize(
    "flat",
    [
        {"mlflow_tracking_uri": "URI", "mlflow_tracking_token": "t"},  # GitLab registry keys only
        {"mlflow_tracking_uri": "URI", "mlflow_experiment_name": "e"},
        {"mlflow_tracking_uri": "URI", "mlflow_experiment_name": "e", "mlflow_run_name": "r",
         "mlflow_tracking_token": "****"},
        {"wandb_project": "p"},
        {"wandb_project": "p", "wandb_name": "n", "wandb_api_key": "****"},
    ],
)  # fmt: skip
def test_a_backend_nemo_gym_would_not_open_opens_nothing_anywhere(
    tmp_path: Path, flat: dict[str, Any]
) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config = {
        "output_jsonl_fpath": str(tmp_path / "o.jsonl"),
        "results_dir": str(tmp_path / "results"),
        **{k: (uri if v == "URI" else v) for k, v in flat.items()},
        "exporters": {"wandb": {"mode": "offline"}},
    }
    assert nemo_gym.setup_exporters(config) == []
    nemo_gym.export_metrics({"reward": 1.0}, step=0)
    nemo_gym.teardown_exporters()
    assert not (tmp_path / "mlflow.db").exists()
    assert not (tmp_path / "results").exists()


# -- the full sequence on real stores ----------------------------------------------------------------

NESTED_CONFIG = {
    "policy": {"model_name": "qwen"},
    "seed": 7,
    "servers": [1, {"host": "h"}],
    "empty_map": {},
    "empty_list": [],
    "prompt_at_limit": "p" * MAX_PARAM_VAL_LENGTH,
    "prompt_over_limit": "q" * (MAX_PARAM_VAL_LENGTH + 100),
}
ROLLOUTS = [{"reward": 1.0, "_ng_task_index": 0}, {"reward": 0.0, "_ng_task_index": 1, "note": "é"}]


@pytest.mark.slow
def test_nemo_gym_sequence_on_real_stores(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """setup -> metrics (NeMo Gym's sanitiser cases) -> rollouts -> teardown, read back."""
    config = full_config(tmp_path, **NESTED_CONFIG)
    before = copy.deepcopy(config)
    opened = nemo_gym.setup_exporters(config)
    assert sorted(e.name for e in opened) == ["mlflow", "wandb"]
    assert nemo_gym.get_exporters() == opened
    assert config == before  # masking never touched the caller's config (NeMo Gym masks a copy)
    names = [*NG_SANITIZE_CASES, LONG_NAME]
    nemo_gym.export_metrics({name: float(i) for i, name in enumerate(names)}, step=3)
    # NeMo Gym's MLflow exporter: bools are numbers, strings become tags, None is dropped,
    # non-finite values are logged
    nemo_gym.export_metrics(
        {"passed": True, "agent": "openhands", "missing": None, "std": math.nan, "drift": math.inf}, step=4
    )
    nemo_gym.export_rollouts(ROLLOUTS)
    nemo_gym.teardown_exporters()
    nemo_gym.teardown_exporters()  # idempotent
    assert nemo_gym.get_exporters() == []

    from mlflow.tracking import MlflowClient

    uri = config["mlflow_tracking_uri"]
    [run] = mlflow_runs(uri, "ng-real")
    assert run.info.status == "FINISHED" and run.info.run_name == "ng-run"
    # metric names: exactly NeMo Gym's; names with nothing left are dropped
    expected = {ng_sanitize(n): float(i) for i, n in enumerate(names) if ng_sanitize(n) is not None}
    metrics = dict(run.data.metrics)
    assert (
        metrics.pop("passed") == 1.0
        and math.isnan(metrics.pop("std"))
        and metrics.pop("drift") >= 1.7976931348623157e308  # SQL stores inf as max float
    )
    assert metrics == expected
    assert run.data.tags["agent"] == "openhands" and "missing" not in run.data.tags
    long_name = ng_sanitize(LONG_NAME)
    assert long_name is not None and long_name.startswith("gpqa/") and long_name.endswith("/mean/reward")
    assert MlflowClient(uri).get_metric_history(run.info.run_id, "weird_0_")[0].step == 3
    # params: flattened and cut as NeMo Gym does; a value at MLflow's limit is kept whole
    params = run.data.params
    flat = dict(ng_flatten(NESTED_CONFIG))
    for key, value in flat.items():
        assert params[ng_sanitize(key)] == str(value)[:MAX_PARAM_VAL_LENGTH]
    assert params["prompt_at_limit"] == "p" * MAX_PARAM_VAL_LENGTH
    assert not any(k.startswith(("empty_map", "empty_list")) for k in params)
    # secrets: never in clear in the store
    db = (tmp_path / "mlflow.db").read_bytes()
    for secret in (before["policy_api_key"], before["wandb_api_key"]):
        assert secret.encode() not in db
    # rollouts in NeMo Gym's shape: table artifact rollouts.json, column Rollout, one JSON per row
    table = mlflow_table(uri, run.info.run_id, "rollouts.json")
    assert table["columns"] == ["Rollout"]
    assert [json.loads(cell) for [cell] in table["data"]] == ng_rollout_cells(ROLLOUTS)
    import mlflow

    mlflow.set_tracking_uri(uri)
    loaded = MlflowClient(uri).load_table(
        run.info.experiment_id, "rollouts.json", run_ids=[run.info.run_id]
    )  # MLflow's own reader
    assert [json.loads(x) for x in loaded["Rollout"]] == ng_rollout_cells(ROLLOUTS)
    assert {"path": "rollouts.json", "type": "table"} in json.loads(run.data.tags["mlflow.loggedArtifacts"])
    # ... and this project's richer form beside it
    assert "rollouts" in {a.path for a in MlflowClient(uri).list_artifacts(run.info.run_id)}
    # W&B: NeMo Gym's folder <results_dir>/wandb, its table Rollouts
    [wb] = wandb_runs(tmp_path / "results" / "wandb")
    assert wb.folder.is_relative_to(tmp_path / "results" / "wandb")
    [wb_table] = wandb_history_tables(wb, "Rollouts")
    assert wb_table["columns"] == ["Rollout"]
    assert [json.loads(cell) for [cell] in wb_table["data"]] == ng_rollout_cells(ROLLOUTS)
    assert before["wandb_api_key"] not in json.dumps(wb.config)


# -- never raises, fans out without an output path, drops a failed setup ------------------------


@pytest.mark.parametrize(
    "config",
    [None, [], "x", 5, {}, {"output_jsonl_fpath": None}, {"exporters": "bad"},
     {"exporters": {"local": "bad"}}, {"output_jsonl_fpath": 7, "exporters": {"local": {"enabled": "maybe"}}},
     {"mlflow_tracking_uri": "${oc.env:NO_SUCH_VARIABLE_HERE}", "mlflow_experiment_name": "e",
      "mlflow_run_name": "r"}],
)  # fmt: skip
def test_no_config_nemo_gym_passes_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config: Any
) -> None:
    monkeypatch.chdir(tmp_path)
    from omegaconf import OmegaConf

    as_given = OmegaConf.create(config) if isinstance(config, dict) and config else config
    opened = nemo_gym.setup_exporters(as_given)
    assert isinstance(opened, list)
    nemo_gym.export_metrics({"reward": 1.0}, step=0)
    nemo_gym.export_rollouts([{"reward": 1.0}])
    nemo_gym.teardown_exporters()
    assert nemo_gym.get_exporters() == []


@pytest.mark.slow
def test_a_server_config_without_output_still_fans_out_without_a_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    uri = mlflow_sqlite(tmp_path / 'mlflow.db')
    config = {"mlflow_tracking_uri": uri, "mlflow_experiment_name": "srv", "mlflow_run_name": "server"}
    with caplog.at_level(logging.WARNING, logger="gym_artifacts.nemo_gym"):
        assert [e.name for e in nemo_gym.setup_exporters(config)] == ["mlflow"]
        nemo_gym.export_metrics({"reward": 0.5}, step=1)
        nemo_gym.teardown_exporters()
        nemo_gym.setup_exporters(config)  # a second server config: no second warning
        nemo_gym.teardown_exporters()
    warned = [r for r in caplog.records if "output_jsonl_fpath" in r.getMessage()]
    assert len(warned) <= 1  # once per process (an earlier test may have taken it)
    runs = mlflow_runs(uri, "srv")
    assert len(runs) == 2 and {r.info.status for r in runs} == {"FINISHED"}
    assert any(r.data.metrics == {"reward": 0.5} for r in runs)
    assert not list(tmp_path.rglob("*_metrics.jsonl"))  # no journal left anywhere


@pytest.mark.slow
def test_a_backend_whose_setup_failed_leaves_the_list_and_blocks_no_other(tmp_path: Path) -> None:
    """NeMo Gym: a backend that fails to start is skipped; the others keep logging."""
    out = tmp_path / "o.jsonl"
    config = {
        "output_jsonl_fpath": str(out),
        "mlflow_tracking_uri": f"http://127.0.0.1:{free_port()}",  # nothing listens: refused
        "mlflow_experiment_name": "e",
        "mlflow_run_name": "r",
        "exporters": {"local": {"enabled": True, "root": str(tmp_path / "store")}},
    }
    nemo_gym.setup_exporters(config)
    deadline = time.monotonic() + 60
    while [e.name for e in nemo_gym.get_exporters()] != ["local"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [e.name for e in nemo_gym.get_exporters()] == ["local"]
    for step in range(3):
        nemo_gym.export_metrics({"reward": step}, step=step)
    nemo_gym.teardown_exporters()
    [run_dir] = (tmp_path / "store" / "default").iterdir()
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 3


@pytest.mark.slow
def test_a_second_setup_replaces_the_first(tmp_path: Path) -> None:
    uri = mlflow_sqlite(tmp_path / 'mlflow.db')

    def config(name: str) -> dict[str, Any]:
        return {
            "output_jsonl_fpath": str(tmp_path / name / "o.jsonl"),
            "mlflow_tracking_uri": uri, "mlflow_experiment_name": "e", "mlflow_run_name": name,
        }  # fmt: skip

    first = nemo_gym.setup_exporters(config("first"))
    second = nemo_gym.setup_exporters(config("second"))
    assert len(first) == len(second) == 1 and first[0] is not second[0]
    assert nemo_gym.get_exporters() == second
    status = {r.info.run_name: r.info.status for r in mlflow_runs(uri, "e")}
    assert status == {"first": "FINISHED", "second": "RUNNING"}
    nemo_gym.teardown_exporters()
    assert {r.info.status for r in mlflow_runs(uri, "e")} == {"FINISHED"}


# -- names: the sanitiser and the flatten, for every generated input ----------------------------------

NAME_ALPHABET = st.sampled_from([*"ab/._-@[] :%é0Z", "..", "//", "€", "\t"])
NAMES = st.one_of(
    st.lists(NAME_ALPHABET, max_size=40).map("".join),
    st.text(max_size=30),
    st.builds(
        lambda a, n, b: a + "z" * n + b, st.text(max_size=20), st.integers(200, 320), st.text(max_size=20)
    ),
    st.sampled_from([*NG_SANITIZE_CASES, LONG_NAME, "a" * (MAX_ENTITY_KEY_LENGTH - 2) + "@1"]),
)


@settings(max_examples=1000, deadline=None)
@given(NAMES)
def test_metric_names_are_nemo_gyms_and_mlflow_accepts_every_one(name: str) -> None:
    from mlflow.utils.validation import _validate_metric_name, _validate_param_name

    ours = sanitize_key(name)
    assert ours == ng_sanitize(name)
    if ours is not None:
        assert len(ours) <= MAX_ENTITY_KEY_LENGTH
        _validate_metric_name(ours)
        _validate_param_name(ours)


@pytest.mark.parametrize(("raw", "expected"), list(NG_SANITIZE_CASES.items()))
def test_nemo_gyms_own_sanitiser_cases(raw: str, expected: str | None) -> None:
    assert sanitize_key(raw) == expected


JSON_LEAF = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=8)
)
CONFIGS = st.recursive(
    JSON_LEAF,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text("abc.@[]", max_size=4), children, max_size=3)
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text("abcxyz_", min_size=1, max_size=4), CONFIGS, max_size=4))
def test_config_params_are_flattened_as_nemo_gym_flattens(config: dict[str, Any]) -> None:
    assert list(flatten_config(config)) == ng_flatten(config)
    expected = {ng_sanitize(k): str(v)[:MAX_PARAM_VAL_LENGTH] for k, v in ng_flatten(config)}
    expected.pop(None, None)
    ours = config_params(config)
    if len(expected) == len([k for k, _ in ng_flatten(config) if ng_sanitize(k) is not None]):
        assert ours == expected  # no two keys share a name: exactly NeMo Gym's params
    else:  # NeMo Gym would log two keys under one name; ours keeps both (numbered suffix)
        assert set(ours.values()) >= set(expected.values())


# -- LangSmith: opened live from NeMo Gym's langsmith_* keys ------------------------------------------


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.*deprecated and will be removed after")  # list_runs: see test_langsmith
def test_langsmith_opens_live_from_nemo_gyms_keys(tmp_path: Path) -> None:
    """NeMo Gym main: dataset found or created, experiment upserted with it as reference, each
    rollout a run with its reward as feedback, the experiment ended at teardown; then the export
    completes that experiment (no second one)."""
    from langsmith import Client
    from omegaconf import OmegaConf

    from gym_artifacts import export_run
    from gym_artifacts.contract.hooks import ExportStatus
    from tests.fixture_paths import NEMO_GYM_FIXTURES
    from tests.langsmith_api import LangsmithApi

    rows = [
        json.loads(x) for x in (NEMO_GYM_FIXTURES / "clean" / "rollouts.jsonl").read_text().splitlines()[:4]
    ]
    out = tmp_path / "rollouts.jsonl"
    api = LangsmithApi().start()
    try:
        config = {
            "output_jsonl_fpath": str(out),
            "langsmith_api_key": "lsv2_pt_live_0123456789",
            "langsmith_endpoint": api.url,
            "langsmith_dataset_name": "ng-tasks",
            "langsmith_experiment_name": "ng-experiment",
        }
        assert [e.name for e in nemo_gym.setup_exporters(config)] == ["langsmith"]
        nemo_gym.export_rollouts(rows)
        out.write_text("".join(json.dumps(r) + "\n" for r in rows))
        nemo_gym.teardown_exporters()
        client = Client(api_url=api.url, api_key="lsv2_pt_live_0123456789", auto_batch_tracing=False)
        [project] = list(client.list_projects())
        assert project.name == "ng-experiment" and project.end_time is not None
        dataset = client.read_dataset(dataset_name="ng-tasks")
        assert project.reference_dataset_id == dataset.id
        # one trace per rollout (the span model): a root run per rollout, its llm/tool runs below
        all_runs = list(client.list_runs(project_id=project.id))
        runs = [r for r in all_runs if r.parent_run_id is None]
        assert len(runs) == len(rows) and all(r.reference_example_id is not None for r in runs)
        rewards = sorted(
            f.score for f in client.list_feedback(run_ids=[r.id for r in runs]) if f.key == "reward"
        )
        assert rewards == sorted(float(r["reward"]) for r in rows)
        # the aggregate written after teardown, then the export: the same experiment, completed
        agg = [
            {
                "agent_ref": rows[0]["agent_ref"],
                "agent_metrics": {"mean/reward": sum(r["reward"] for r in rows) / 4},
            }
        ]
        out.with_name("rollouts_aggregate_metrics.json").write_text(json.dumps(agg))
        [result] = export_run(out, OmegaConf.load(out.with_name("rollouts_config.yaml")))
        assert result.status is ExportStatus.EXPORTED, result.reason
        assert result.backend_run_id == str(project.id)
        assert [p.id for p in client.list_projects()] == [project.id]
        # the export sent what the live run lacked, with the same ids: no run twice
        assert sorted(str(r.id) for r in client.list_runs(project_id=project.id)) == sorted(str(r.id) for r in all_runs)
        assert client.read_project(project_id=project.id).metadata.get("certified") is True
    finally:
        api.stop()


# -- params of a NeMo Gym run exported after the fact --------------------------------------------


def nemo_gym_logged_params() -> dict[str, str]:
    """The params NeMo Gym's own MLflow exporter logged for the real run (fixture listing)."""
    from tests.fixture_paths import NEMO_GYM_FIXTURES

    text = (NEMO_GYM_FIXTURES / "nemo-gym-own-mlflow-export.txt").read_text()
    return dict(re.findall(r"^   P (\S+) = (.*)$", text, flags=re.MULTILINE))


def unflatten(params: dict[str, str]) -> dict[str, Any]:
    """The global config those params were flattened from (``a.b`` nests, ``x_0_`` is x[0])."""

    def typed(text: str) -> Any:
        return {"False": False, "True": True}.get(text, int(text) if text.isdigit() else text)

    config: dict[str, Any] = {}
    for name, value in params.items():
        if m := re.fullmatch(r"(.+)_(\d+)_", name):
            config.setdefault(m.group(1), []).insert(int(m.group(2)), typed(value))
        elif "." in name:
            outer, inner = name.split(".", 1)
            config.setdefault(outer, {})[inner] = typed(value)
        else:
            config[name] = typed(value)
    return config


@pytest.mark.slow
def test_run_config_gives_the_params_nemo_gyms_own_export_logged(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    from gym_artifacts.cli import main
    from tests.test_nemo_gym import copy_fixture

    logged = nemo_gym_logged_params()
    assert len(logged) == 26
    run_config = tmp_path / "global_config.json"
    run_config.write_text(json.dumps({**unflatten(logged), "policy_api_key": "sk-live-policy-0123456789"}))
    out = copy_fixture("clean", tmp_path)
    uri = mlflow_sqlite(tmp_path / 'mlflow.db')
    rc = main(["export", str(out), "-e", "mlflow", f"exporters.mlflow.tracking_uri={uri}",
               "exporters.mlflow.experiment_name=ng", "--run-config", str(run_config), "-q"])  # fmt: skip
    assert rc == 0
    [run] = mlflow_runs(uri, "ng")
    params = dict(run.data.params)
    masked = params.pop("policy_api_key")
    assert "sk-live" not in masked and masked.strip("*") == ""
    assert params == logged  # name for name, value for value: what NeMo Gym itself logged
    assert "sk-live-policy" not in (tmp_path / "mlflow.db").read_bytes().decode("latin-1")
    assert MlflowClient(uri).get_run(run.info.run_id).info.status == "FINISHED"


def test_a_run_config_that_cannot_be_read_is_refused_up_front(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gym_artifacts.cli import main
    from tests.test_nemo_gym import copy_fixture

    out = copy_fixture("clean", tmp_path)
    assert main(["export", str(out), "-e", "local", "--run-config", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml" in capsys.readouterr().err


@pytest.mark.slow
def test_without_a_config_the_export_logs_what_the_files_tell(tmp_path: Path) -> None:
    from omegaconf import OmegaConf

    from gym_artifacts import export_run
    from tests.test_nemo_gym import copy_fixture

    out = copy_fixture("clean", tmp_path)
    uri = mlflow_sqlite(tmp_path / 'mlflow.db')
    cfg = OmegaConf.create(
        {"exporters": {"mlflow": {"enabled": True, "tracking_uri": uri, "experiment_name": "ng"}}}
    )
    export_run(out, cfg)
    [run] = mlflow_runs(uri, "ng")
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    repeats = max(
        sum(1 for r in rows if r["_ng_task_index"] == t) for t in {r["_ng_task_index"] for r in rows}
    )
    assert run.data.params == {
        "agent_name": rows[0]["agent_ref"]["name"],
        "environment_server": rows[0]["_ng_environment_server"],
        "policy_model_name": rows[0]["response"]["model"],
        "num_repeats": str(repeats),
    }
    assert run.data.params["num_repeats"] == nemo_gym_logged_params()["num_repeats"]


@pytest.mark.slow
def test_a_backend_failing_to_log_neither_raises_nor_blocks_the_others(tmp_path: Path) -> None:
    """NeMo Gym's guard: a backend that raises while logging is warned about, stays listed, and
    every other backend still gets the call."""
    from mlflow.tracking import MlflowClient

    uri = mlflow_sqlite(tmp_path / 'mlflow.db')
    config = {
        "output_jsonl_fpath": str(tmp_path / "o.jsonl"),
        "mlflow_tracking_uri": uri, "mlflow_experiment_name": "e", "mlflow_run_name": "r",
        "exporters": {"local": {"enabled": True, "root": str(tmp_path / "store")}},
    }  # fmt: skip
    opened = nemo_gym.setup_exporters(config)
    assert sorted(e.name for e in opened) == ["local", "mlflow"]
    [run] = mlflow_runs(uri, "e")
    MlflowClient(uri).delete_run(run.info.run_id)  # every later MLflow call now raises
    for step in range(3):
        nemo_gym.export_metrics({"reward": float(step)}, step=step)
    nemo_gym.export_rollouts([{"reward": 1.0}])
    assert nemo_gym.get_exporters() == opened  # a logging failure does not drop the backend
    nemo_gym.teardown_exporters()
    [run_dir] = (tmp_path / "store" / "default").iterdir()
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 3
    assert MlflowClient(uri).get_metric_history(run.info.run_id, "reward") == []


def test_an_unconfigured_backend_imports_no_sdk(tmp_path: Path) -> None:
    """NeMo Gym's registry reads availability from config models, so an unconfigured backend's
    module (and its tracking SDK) is never imported."""
    import sys

    script = (
        "import sys, json\n"
        "from gym_artifacts.nemo_gym import setup_exporters, export_metrics, teardown_exporters\n"
        "setup_exporters({'output_jsonl_fpath': 'o.jsonl', 'wandb_project': 'p', 'mlflow_tracking_uri': 'x',"
        " 'langsmith_api_key': 'k', 'policy_model_name': 'm'})\n"
        "export_metrics({'a': 1}, step=0)\n"
        "teardown_exporters()\n"
        "print(json.dumps(sorted(m for m in ('wandb', 'mlflow', 'langsmith') if m in sys.modules)))\n"
    )
    proc = run_bounded(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == []


@pytest.mark.slow
def test_a_post_run_export_has_nemo_gyms_rollout_tables(tmp_path: Path) -> None:
    """A NeMo Gym run exported after the fact: W&B table ``Rollouts`` and MLflow table
    ``rollouts.json``, one JSON document per line of ``rollouts.jsonl``, as NeMo Gym logs them."""
    from omegaconf import OmegaConf

    from gym_artifacts import export_run
    from tests.test_nemo_gym import copy_fixture

    out = copy_fixture("clean", tmp_path)
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    uri = mlflow_sqlite(tmp_path / 'mlflow.db')
    cfg = OmegaConf.create(
        {
            "exporters": {
                "mlflow": {"enabled": True, "tracking_uri": uri, "experiment_name": "ng"},
                "wandb": {"enabled": True, "mode": "offline", "project": "ng", "dir": str(tmp_path / "wb")},
            }
        }
    )
    assert {r.status.value for r in export_run(out, cfg)} == {"EXPORTED"}
    [run] = mlflow_runs(uri, "ng")
    table = mlflow_table(uri, run.info.run_id, "rollouts.json")
    assert table["columns"] == ["Rollout"] and [json.loads(c) for [c] in table["data"]] == rows
    [wb] = wandb_runs(tmp_path / "wb")
    [wb_table] = wandb_history_tables(wb, "Rollouts")
    assert wb_table["columns"] == ["Rollout"] and [json.loads(c) for [c] in wb_table["data"]] == rows


def test_a_dictconfig_is_masked_on_a_copy(tmp_path: Path) -> None:
    """NeMo Gym passes a DictConfig and masks a deep copy: the caller's object keeps its live
    secrets, the logged config holds none of them."""
    from omegaconf import OmegaConf

    secret = "sk-policy-secret-abcdef0123456789"
    config = OmegaConf.create(
        {
            "output_jsonl_fpath": str(tmp_path / "o.jsonl"),
            "policy": {"api_key": secret, "model_name": "m"},
            "servers": [{"token": secret}],
            "exporters": {"local": {"enabled": True, "root": str(tmp_path / "store")}},
        }
    )
    before = OmegaConf.to_container(config)
    assert [e.name for e in nemo_gym.setup_exporters(config)] == ["local"]
    nemo_gym.teardown_exporters()
    assert OmegaConf.to_container(config) == before
    [run_dir] = (tmp_path / "store" / "default").iterdir()
    logged = (run_dir / "config.json").read_text()
    assert secret not in logged and json.loads(logged)["policy"]["model_name"] == "m"
