"""Shared fixtures (isolated working folder and environment, quickstart runs copied per test, the
session's real servers) and how pytest-xdist shares the tests out between its workers."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from tests.fixture_paths import REACTOR_FIXTURES
from tests.mlflow_store import mlflow_sqlite
from tests.processes import run_bounded

# Every subprocess a test starts has its pipes closed by the end of that test (tests/leaks.py).
pytest_plugins = ["tests.leaks"]

# Hypothesis explores new examples on every run; CI (`scripts/test.sh` sets HYPOTHESIS_PROFILE=ci) draws the
# same ones each time, so a landing is decided by the change, not by the draw. A case a local run
# finds is added to its test with @example.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

REPO = Path(__file__).resolve().parent.parent
QUICKSTART = REPO / "examples" / "quickstart"
FIXTURES = REACTOR_FIXTURES
QUICKSTART_FILES = (
    "eval.jsonl",
    "eval_config.yaml",
    "eval_metrics.jsonl",
    "eval_artifacts",
    "eval_failures.jsonl",
    "eval_materialized_inputs.jsonl",
    "eval_aggregate_metrics.json",  # last: newer than the rollouts, as an eval writes it
)


# The costly services the whole session shares: the fixture that starts each, and the tests that
# use it, by node id (a test module, or a parametrized id such as the contract suite's
# ``[phoenix]``, whose service fixture is asked for by name at run time).
SESSION_SERVICES = {
    "ray_cluster": ("tests/test_ray.py::", "tests/test_parallel_sqlite_store.py::"),
    # NeMo Gym's servers (`gym env start`, ~70 s), started once for the module that runs evals on them
    "nemo_gym_servers": ("tests/test_nemo_gym_real.py::",),
    "phoenix_server": (
        "tests/test_phoenix.py::",
        "tests/test_live_traces_phoenix.py::",
        "[phoenix]",
        "tests/reliability/test_secrets_generated.py::test_no_generated_secret_reaches_phoenix",
        "tests/test_coverage_everywhere.py::",
    ),
}


def session_service_of(nodeid: str) -> str | None:
    """The session service fixture a test needs, from its node id; None for the rest."""
    for fixture, patterns in SESSION_SERVICES.items():
        if any(nodeid.startswith(p) if p.endswith("::") else nodeid.endswith(p) for p in patterns):
            return fixture
    return None


# What makes a test slow (3 s or more), by what it uses: a real server (MLflow, Phoenix; the
# session's MLflow server is behind ``tracking_uri``'s second case), a Ray cluster, NeMo Gym's
# servers or its virtual environment, a browser, MLflow stores a test exports into several times
# (``empty_mlflow_db``). A test slow for another reason carries ``@pytest.mark.slow`` itself.
SLOW_FIXTURES = frozenset({
    "mlflow_server", "own_mlflow_server", "tracking_uri", "empty_mlflow_db",
    "phoenix_server", "ray_cluster", "nemo_gym_servers", "nemo_gym_venv_path", "browser",
})  # fmt: skip
# The contract suite's cases of the backends whose SDK is heavy (an MLflow store, a W&B run).
SLOW_CONTRACT_BACKENDS = ("[mlflow]", "[wandb]")


def slow_because(nodeid: str, fixturenames: Iterable[str]) -> str | None:
    """Why a test is slow, derived from its node id and the fixtures it uses; None when nothing it
    uses is (its own ``@pytest.mark.slow`` may still say so)."""
    if service := session_service_of(nodeid):
        return f"uses the session's {service}"
    if used := sorted(SLOW_FIXTURES.intersection(fixturenames)):
        return f"uses {', '.join(used)}"
    if nodeid.startswith("tests/test_contract.py::") and nodeid.endswith(SLOW_CONTRACT_BACKENDS):
        return "a contract case of a backend with a heavy SDK"
    return None


@pytest.hookimpl(tryfirst=True)  # before ``-m "not slow"`` deselects by mark
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the slow tests by what they use (``slow_because``); a test that uses a session service
    must be listed in SESSION_SERVICES, or the scheduler below would start that service in a
    second worker."""
    for item in items:
        fixturenames = getattr(item, "fixturenames", ())
        if slow_because(item.nodeid, fixturenames):
            item.add_marker(pytest.mark.slow)
        for fixture in SESSION_SERVICES:
            if fixture in fixturenames and session_service_of(item.nodeid) != fixture:
                raise pytest.UsageError(f"{item.nodeid} uses {fixture}: add it to SESSION_SERVICES")
    # Slow tests first (a stable sort: files keep their order otherwise): the workers share the
    # long ones out early, and the run does not end on one worker finishing a 5-minute test
    # while the other has nothing left.
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Under pytest-xdist (``-n``, the default in pyproject.toml): each test on its own, as
    ``--dist load`` does, except that the tests of one session service run in one worker, so
    the service starts once. (``--dist loadgroup`` would do this with marks, but pytest-xdist
    3.8 renames node ids in a way pytest 9 ignores, so its groups never form.)"""
    from xdist.scheduler import LoadScopeScheduling

    class SessionServiceScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return session_service_of(nodeid) or nodeid

    return SessionServiceScheduling(config, log)


def _checkout_changes() -> set[str] | None:
    """``git status`` lines of the checkout (untracked files listed one by one; ignored paths
    left out); None outside a git checkout."""
    import subprocess

    try:
        proc = run_bounded(
            ["git", "status", "--porcelain", "--untracked-files=all"],
            cwd=REPO, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return set(proc.stdout.splitlines()) if proc.returncode == 0 else None


def pytest_sessionstart(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):  # the controller (or the one process)
        session.config.stash[_CHANGES_BEFORE] = _checkout_changes()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Tests write only under their tmp folders or gitignored paths (test-artifacts/,
    .hypothesis/): a file the session created or changed in the checkout fails the run."""
    before = session.config.stash.get(_CHANGES_BEFORE, None)
    after = _checkout_changes() if before is not None else None
    if before is None or after is None:
        return
    written = sorted(after - before)
    if written:
        session.config.stash[_WRITTEN] = written
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    written = terminalreporter.config.stash.get(_WRITTEN, None)
    if written:
        terminalreporter.write_line(
            "the tests wrote into the checkout (write under tmp_path, or a gitignored path):", red=True
        )
        for line in written:
            terminalreporter.write_line(f"  {line}", red=True)


_CHANGES_BEFORE = pytest.StashKey[set[str] | None]()
_WRITTEN = pytest.StashKey[list[str]]()


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test runs in its own folder; nothing lands in $HOME or phones home."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.setenv("DO_NOT_TRACK", "1")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var in ("WANDB_DIR", "WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR"):
        d = tmp_path / "wandb-home" / var.lower()
        d.mkdir(parents=True)
        monkeypatch.setenv(var, str(d))
    # WANDB_SERVICE: wandb.init saves its service address there; a child process that inherits it
    # would share this process's wandb-core instead of starting its own.
    for var in ("WANDB_API_KEY", "WANDB_SERVICE", "RANK", "LOCAL_RANK", "SLURM_PROCID", "EXPERIMENT_ID",
                "POLICY_API_KEY"):  # fmt: skip
        monkeypatch.delenv(var, raising=False)
    from gym_artifacts.core.secrets import secrets_scope

    with secrets_scope():  # a secret one test's config made known does not mask the next test's output
        yield
    from gym_artifacts.core.ranks import set_rank

    set_rank(None)


def copy_quickstart(dest: Path, stem: str = "eval") -> Path:
    """A copy of the quickstart run under ``dest``; returns its rollouts path."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in QUICKSTART_FILES:
        src = QUICKSTART / name
        target = dest / name.replace("eval", stem, 1)
        if src.is_dir():
            shutil.copytree(src, target)
        else:
            shutil.copy2(src, target)
            target.touch()
    return dest / f"{stem}.jsonl"


@pytest.fixture
def quickstart_run(tmp_path: Path) -> Path:
    """The quickstart run copied into the test's folder."""
    return copy_quickstart(tmp_path / "runs")


@pytest.fixture
def make_run(tmp_path: Path) -> Callable[[str], Path]:
    """Factory for further quickstart copies in their own folders."""
    counter = iter(range(1_000_000))

    def factory(stem: str = "eval") -> Path:
        return copy_quickstart(tmp_path / f"runs{next(counter)}", stem)

    return factory


@pytest.fixture
def local_config(tmp_path: Path) -> Path:
    """A config file enabling only the local backend, rooted in the test's folder."""
    fpath = tmp_path / "local.yaml"
    fpath.write_text(
        f"exporters:\n  local:\n    enabled: true\n    root: {tmp_path / 'store'}\n    experiment: tests\n"
    )
    return fpath


@pytest.fixture
def reactor_fixture(tmp_path: Path) -> Callable[[str], Path]:
    """A writable copy of one of reactor-runtime 2.7.6's artifact folders."""

    def factory(name: str) -> Path:
        src = FIXTURES / name
        dest = tmp_path / "reactor" / f"experiment-{name}"
        shutil.copytree(src, dest)
        for p in dest.rglob("*"):
            p.chmod(0o755 if p.is_dir() else 0o644)
        return dest

    return factory


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """One real mlflow server for the whole session."""
    from tests.mlflow_server import MlflowServer, free_port

    server = MlflowServer(tmp_path_factory.mktemp("mlflow-server"), free_port()).start(timeout=180)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def phoenix_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """One real ``phoenix serve`` for the whole session (tests/test_phoenix.py and the contract
    suite share it: it takes up to ~100 s to start on a loaded 2-core machine)."""
    from tests.phoenix_server import PhoenixServer, phoenix_bin

    binary = phoenix_bin()
    if binary is None:
        pytest.skip(
            "no phoenix server binary: scripts/test.sh builds .venv-phoenix (or set GYM_ARTIFACTS_PHOENIX_BIN)"
        )
    server = PhoenixServer(tmp_path_factory.mktemp("phoenix"), binary).start()
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "server"])
def tracking_uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An MLflow tracking URI: a fresh SQLite store, then the session's real mlflow server."""
    if request.param == "sqlite":
        return mlflow_sqlite(tmp_path / 'mlflow.db')
    return request.getfixturevalue("mlflow_server").uri


@pytest.fixture
def own_mlflow_server(tmp_path: Path) -> Iterator[object]:
    """A real mlflow server this test may kill and restart."""
    from tests.mlflow_server import MlflowServer, free_port

    server = MlflowServer(tmp_path / "mlflow-server", free_port())
    yield server
    server.stop()


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[object]:
    """A real Ray cluster of two nodes on this machine (one CPU each), for the whole session."""
    pytest.importorskip("ray")
    from tests.ray_cluster import RayCluster

    cluster = RayCluster().start(nodes=2)
    yield cluster
    cluster.stop()
