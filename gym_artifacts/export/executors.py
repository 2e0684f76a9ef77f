"""Where many runs' exports run: in this process, in a local process pool, or as Ray tasks.

``export_runs`` is the Python API of ``gym-artifacts export RUN...``: each run's export is one
job (:func:`export_job`, self-contained and picklable), and results come back as each run
finishes, whatever the executor. A run that fails, crashes its worker or loses its node becomes
FAILED results for that run alone; the others go on. Exactly once does not depend on which
process or host runs a job: a receipt that matches skips, and each backend's own guard (a
deterministic local folder published atomically, MLflow's identity lookup, W&B's deterministic
ids) makes two exports of one run end in one backend run.

Ray is imported only when the ``ray`` executor is chosen. A Ray task runs in the driver's
working directory and with the driver's ``GYM_ARTIFACTS_*``, ``MLFLOW_*`` and ``WANDB_*``
environment, so relative paths and settings mean what they mean to the local executor; runs and
relative paths must therefore be on storage every node sees at the same path.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gym_artifacts.contract.hooks import ExportResult, ExportStatus
from gym_artifacts.core.errors import ClusterError, ConfigError

logger = logging.getLogger(__name__)

EXECUTORS = ("local", "ray")
# Environment a Ray task gets from the driver: the settings our backends and their SDKs read.
FORWARDED_ENV_PREFIXES = ("GYM_ARTIFACTS_", "MLFLOW_", "WANDB_")
DEFAULT_RAY_RETRIES = 2  # a task whose worker or node dies is run again this many times
# Joining a cluster: Ray itself retries an address that does not answer for about 14 minutes.
DEFAULT_RAY_CONNECT_TIMEOUT_S = 30.0
RAY_CONNECT_TIMEOUT_ENV = "GYM_ARTIFACTS_RAY_CONNECT_TIMEOUT"
RAY_CONNECT_NOTICE_S = 5.0  # a join slower than this is announced on stderr
LOCAL_RAY_OBJECT_STORE_BYTES = 100 * 1024 * 1024  # jobs and results are a few KB each


@dataclass(frozen=True)
class ExportJob:
    """One run's export, as a worker process or a Ray task receives it."""

    run: str
    config_file: str | None = None  # -c FILE; else the run's saved config, else the default
    config_file_content: dict[str, Any] | None = None  # -c FILE as the request check read it (once)
    config: dict[str, Any] | None = None  # a config given as a mapping (the Python API)
    overrides: tuple[str, ...] = ()
    exporters: tuple[str, ...] = ()
    upload_rollouts: bool | None = None
    certify: bool | None = None  # None: certify a live run that may be; False: never
    verify: bool = False  # ask each backend whether the receipted run still exists
    accept_partial_line: bool = False
    accept_stale_aggregates: bool = False
    progress: bool = False  # a byte progress line on this process's terminal
    nemo_gym_config: str | None = None  # --run-config FILE: NeMo Gym's resolved global config


@dataclass(frozen=True)
class RunResults:
    """What exporting one run gave: a result per backend, or a config error (nothing sent)."""

    run: str
    results: tuple[ExportResult, ...] = ()
    config_error: str | None = None

    def to_json(self) -> list[dict[str, Any]]:
        return [r.to_json(self.run) for r in self.results]

    @property
    def failed(self) -> bool:
        """The run was not exported everywhere: a config error or a FAILED backend."""
        return self.config_error is not None or any(r.status is ExportStatus.FAILED for r in self.results)


def failed_run(job: ExportJob, reason: str) -> RunResults:
    """FAILED for each backend the job names (``all`` when its config was to choose them)."""
    from gym_artifacts.core.secrets import redact_text

    names = job.exporters or ("all",)
    reason = redact_text(reason)
    return RunResults(job.run, tuple(ExportResult(n, ExportStatus.FAILED, reason=reason) for n in names))


def _job_config(job: ExportJob, run: Any, *, warn: bool = True) -> tuple[Any, Any]:
    """The job's export config, and the run's config when this read it (else ``UNREAD``: the
    export reads it and reports what is wrong with it). ``warn``: say once (by the job itself)
    that the run's config could not be read."""
    from omegaconf import OmegaConf

    from gym_artifacts.core.config import build_export_config, merge_configs, normalize, parse_overrides
    from gym_artifacts.core.errors import RunError
    from gym_artifacts.export.engine import UNREAD
    from gym_artifacts.run.run_config import load_run_config

    if job.config is not None:
        base = normalize(OmegaConf.create(job.config))
        # A flat key in an override wins over the mapping's sections (one layer each).
        cfg = merge_configs(base, normalize(parse_overrides(job.overrides))) if job.overrides else base
        return cfg, UNREAD
    try:  # read even with -c: its upload_rollouts lies between the default's and -c's
        saved_config = load_run_config(run)
    except RunError as exc:
        if job.config_file is None and not job.exporters:
            raise
        if warn:  # once, by the job itself
            logger.warning("%s", exc)
        saved_config = UNREAD
    content = job.config_file_content
    cfg, _ = build_export_config(
        job.config_file,
        None if saved_config is UNREAD else saved_config,
        job.overrides,
        file_config=OmegaConf.create(content) if content is not None else None,
    )
    return cfg, saved_config


def export_job(job: ExportJob) -> RunResults:
    """Export one run to its backends; never raises (a bug becomes FAILED results)."""
    from gym_artifacts.core.errors import GymArtifactsError, MissingRunError, RunError
    from gym_artifacts.core.progress import Progress
    from gym_artifacts.core.secrets import redact_text
    from gym_artifacts.export.engine import ExportOptions, export_resolved, resolve_export
    from gym_artifacts.run.artifacts import RunArtifacts

    try:
        run = RunArtifacts.from_path(job.run).require_present()
        cfg, saved_config = _job_config(job, run)
        # Config, selection, settings (invalid ones refused here, once) and destinations.
        resolved = resolve_export(run, cfg, job.exporters or None, saved_config=saved_config, strict=True)
        progress = Progress(enabled=None if job.progress else False)
        finished: list[ExportResult] = []  # each backend's result as it finishes
        try:
            options = ExportOptions(
                job.upload_rollouts, job.certify, job.accept_partial_line, job.accept_stale_aggregates,
                job.verify, job.nemo_gym_config,
            )  # fmt: skip
            results = export_resolved(
                run,
                resolved,
                options,
                progress=progress.update if progress.enabled else None,
                on_result=finished.append,
            )
        except KeyboardInterrupt as interrupt:  # Ctrl-C: what finished travels with it, to be printed
            interrupt.finished = RunResults(job.run, tuple(finished))  # type: ignore[attr-defined]
            # every backend had its result (the Ctrl-C cut what runs after, e.g. a report)
            interrupt.whole = len(finished) >= len(resolved.targets)  # type: ignore[attr-defined]
            raise
        finally:
            progress.close()
    except MissingRunError as exc:  # no such run: nothing to export, the CLI exits 2
        return RunResults(job.run, config_error=redact_text(str(exc)))
    except RunError as exc:
        return failed_run(job, str(exc))
    except GymArtifactsError as exc:
        return RunResults(job.run, config_error=redact_text(str(exc)))
    except Exception as exc:  # a bug must cost this run only, never the other runs
        logger.exception("exporting %s crashed", job.run)
        return failed_run(job, f"internal error: {type(exc).__name__}: {exc}".splitlines()[0])
    return RunResults(job.run, tuple(results))


def prepare_destinations(jobs: Sequence[ExportJob]) -> None:
    """Each destination the jobs send to, prepared once in this process before they fan out
    (``Exporter.prepare_destination``): a fresh MLflow SQLite store gets its schema here, not
    in every task at once. A job whose config cannot be read, or a preparation that fails, is
    left to its task, which reports it as that run's result."""
    from gym_artifacts.contract.registry import get_entry
    from gym_artifacts.core.destination import destination_key
    from gym_artifacts.export.engine import select_exporters
    from gym_artifacts.run.artifacts import RunArtifacts

    done: set[tuple[str, str]] = set()
    for job in jobs:
        try:
            cfg, _ = _job_config(job, RunArtifacts.from_path(job.run), warn=False)
            names = select_exporters(cfg, job.exporters or None)
        except Exception as exc:  # the task reports it
            logger.debug("not preparing the destinations of %s: %s", job.run, exc)
            continue
        for name in names:
            try:
                cls = get_entry(name).load()
                settings = cls.settings_from(cfg)
                key = (name, destination_key(cls.destination_for(settings)))
                if key not in done:
                    done.add(key)
                    cls.prepare_destination(settings)
            except Exception as exc:  # the task reports it
                logger.debug("preparing %s for %s failed: %s", name, job.run, exc)


# -- executors: each yields (job index, RunResults) as runs finish ------------------------------------
def _in_this_process(jobs: Sequence[ExportJob]) -> Iterator[tuple[int, RunResults]]:
    for i, job in enumerate(jobs):
        yield i, export_job(job)


def _in_process_pool(jobs: Sequence[ExportJob], workers: int) -> Iterator[tuple[int, RunResults]]:
    import concurrent.futures
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    pool = concurrent.futures.ProcessPoolExecutor(min(workers, len(jobs)), mp_context=ctx)
    interrupted = False
    futures: dict[Any, int] = {}
    try:
        futures.update({pool.submit(export_job, job): i for i, job in enumerate(jobs)})
        for future in concurrent.futures.as_completed(futures):
            i = futures[future]
            try:
                yield i, future.result()
            except Exception as exc:  # the worker process died (killed, out of memory)
                yield i, failed_run(jobs[i], f"the export process died: {type(exc).__name__}: {exc}")
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:  # also when the caller stops early: nothing new starts
        try:
            if interrupted:
                _interrupt_workers(pool, [f for f in futures if not f.done()])
        finally:
            pool.shutdown(wait=not interrupted, cancel_futures=True)


WORKER_GRACE_S = 5.0  # after a Ctrl-C, how long an interrupted worker may take to hand its export back


def _interrupt_workers(pool: Any, running: Sequence[Any]) -> None:
    """Ctrl-C reached this process, perhaps not its workers (a signal to this process alone):
    interrupt each worker as a Ctrl-C would (its export stops, its locks are released, no
    receipt), give the running exports ``WORKER_GRACE_S`` to hand back, then kill every worker
    still there, so that none keeps the command waiting on a server that never answers."""
    import concurrent.futures
    import signal

    processes = list((getattr(pool, "_processes", None) or {}).values())
    try:
        for process in processes:
            with contextlib.suppress(OSError, ValueError):
                if process.is_alive():
                    os.kill(process.pid, signal.SIGINT)
        if running:
            concurrent.futures.wait(running, timeout=WORKER_GRACE_S)
    finally:  # a second Ctrl-C while waiting ends them at once
        for process in processes:
            with contextlib.suppress(OSError, ValueError):
                if process.is_alive():
                    process.kill()


def _forwarded_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV_PREFIXES)}


@contextlib.contextmanager
def _driver_context(cwd: str, env: Mapping[str, str]) -> Iterator[None]:
    """Run in the driver's folder and environment; restore the worker's afterwards (it is reused)."""
    if not os.path.isdir(cwd):
        raise FileNotFoundError(
            f"the driver's working directory {cwd} does not exist on node {socket.gethostname()}: "
            "runs and relative paths must be on storage every node mounts at the same path"
        )
    old_cwd = os.getcwd()
    old_env = {k: os.environ.get(k) for k in env}
    os.chdir(cwd)
    os.environ.update(env)
    try:
        yield
    finally:
        os.chdir(old_cwd)
        for k, v in old_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def ray_export_job(job: ExportJob, cwd: str, env: dict[str, str]) -> RunResults:
    """The Ray task: one run's export in the driver's folder and environment."""
    try:
        with _driver_context(cwd, env):
            return export_job(job)
    except FileNotFoundError as exc:
        return failed_run(job, str(exc))


def ray_connect_timeout(given: float | None = None) -> float:
    """Seconds allowed to join a Ray cluster: ``given``, else $GYM_ARTIFACTS_RAY_CONNECT_TIMEOUT,
    else DEFAULT_RAY_CONNECT_TIMEOUT_S (ConfigError for a value that is not a positive number)."""
    raw: Any = given if given is not None else os.environ.get(RAY_CONNECT_TIMEOUT_ENV)
    if raw is None or raw == "":
        return DEFAULT_RAY_CONNECT_TIMEOUT_S
    try:
        seconds = float(raw)
    except (TypeError, ValueError):
        seconds = float("nan")
    if isinstance(raw, bool) or not (0 < seconds < float("inf")):
        where = RAY_CONNECT_TIMEOUT_ENV if given is None else "ray_connect_timeout (--ray-connect-timeout)"
        shown = f"{seconds:g}" if seconds == seconds else repr(raw)  # 0 and 0.0 alike
        raise ConfigError(f"{where}: {shown} is not a positive number of seconds")
    return seconds


def _refused(address: str, timeout: float) -> str | None:
    """Why nothing accepts a TCP connection at a ``host:port`` address (None: something does, or
    the address is not of that form, e.g. ``auto``): an unreachable cluster fails in a moment."""
    host, sep, port = address.split("://", 1)[-1].rpartition(":")
    if not sep or not port.isdigit() or not host:
        return None
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=min(timeout, 10.0)).close()
    except TimeoutError:
        return None  # a black hole: left to the bounded join below
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def _ray_init(
    ray: Any, address: str | None, *, runtime_env: Any, local_cpus: int | None, timeout: float | None
) -> None:
    """``ray.init``: a local cluster for this export (address None), or join the one at
    ``address`` within the connect timeout; ClusterError with one line when it fails."""
    options: dict[str, Any] = {
        "include_dashboard": False,
        # Ray's own warnings with -v only: a failure is our one line
        "logging_level": logging.WARNING if logger.isEnabledFor(logging.INFO) else logging.ERROR,
        "runtime_env": runtime_env,
    }
    if address is None:  # a cluster of this machine for this export only
        options.update(num_cpus=local_cpus, object_store_memory=LOCAL_RAY_OBJECT_STORE_BYTES)
        try:  # on this thread: Ray ties the processes it starts to the thread that starts them
            ray.init(address="local", **options)
        except Exception as exc:  # Ray raises plain Exception ("node timed out during startup") too
            logger.info("ray.init failed", exc_info=True)  # the traceback with -v
            raise ClusterError(f"cannot start a local Ray cluster: {_first_line(exc)}") from None
        return
    seconds = ray_connect_timeout(timeout)
    refused = _refused(address, seconds)
    if refused is not None:
        raise ClusterError(f"cannot join the Ray cluster at {address}: {refused}")
    outcome: dict[str, BaseException] = {}

    def join() -> None:
        try:
            ray.init(address=address, **options)
        except BaseException as exc:  # handed to the waiting thread
            outcome["error"] = exc

    # Joining starts no process: it may run on a thread that the timeout leaves behind (Ray
    # retries an unanswered address for many minutes).
    joiner = threading.Thread(target=join, name="gym-artifacts-ray-join", daemon=True)
    started = time.monotonic()
    joiner.start()
    told = False
    while joiner.is_alive():
        waited = time.monotonic() - started
        if waited >= seconds:
            raise ClusterError(
                f"cannot join the Ray cluster at {address}: no answer within {seconds:g} s "
                f"(--ray-connect-timeout or ${RAY_CONNECT_TIMEOUT_ENV} allow longer)"
            )
        if not told and waited >= RAY_CONNECT_NOTICE_S:
            told = True
            logger.warning("joining the Ray cluster at %s (giving up after %g s) ...", address, seconds)
        joiner.join(min(0.25, seconds - waited))
    if "error" in outcome:
        exc = outcome["error"]
        logger.info("ray.init failed", exc_info=exc)
        raise ClusterError(f"cannot join the Ray cluster at {address}: {_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _ray_window(ray: Any) -> int:
    """Tasks kept in flight: enough to keep every CPU busy, few enough to cancel fast."""
    cpus = int(ray.cluster_resources().get("CPU", 1))
    return max(4, 2 * cpus)


def _on_ray(
    jobs: Sequence[ExportJob],
    address: str | None,
    *,
    retries: int,
    runtime_env: dict[str, Any] | None,
    local_cpus: int | None,
    connect_timeout: float | None = None,
) -> Iterator[tuple[int, RunResults]]:
    import ray

    started = False
    if not ray.is_initialized():
        _ray_init(ray, address, runtime_env=runtime_env, local_cpus=local_cpus, timeout=connect_timeout)
        started = True
    task = ray.remote(num_cpus=1, max_retries=retries, retry_exceptions=False)(ray_export_job)
    cwd, env = os.getcwd(), _forwarded_env()
    env_ref = ray.put(env)
    window = _ray_window(ray)
    pending: dict[Any, int] = {}
    queued = iter(enumerate(jobs))
    try:
        while True:
            for i, job in queued:  # runs by absolute path: the task's node resolves them alike
                pending[task.remote(replace(job, run=os.path.abspath(job.run)), cwd, env_ref)] = i
                if len(pending) >= window:
                    break
            if not pending:
                return
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=None)
            for ref in ready:
                i = pending.pop(ref)
                try:
                    out = ray.get(ref)
                except ray.exceptions.RayError as exc:  # worker or node died past its retries
                    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                    out = failed_run(jobs[i], f"the Ray task failed: {type(exc).__name__}: {first}")
                yield i, RunResults(jobs[i].run, out.results, out.config_error)
    finally:  # Ctrl-C or an early stop: cancel what still runs (exports are crash-safe)
        for ref in pending:
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)
        if started:
            ray.shutdown()


def run_jobs(
    jobs: Sequence[ExportJob],
    *,
    executor: str = "local",
    jobs_in_parallel: int = 1,
    ray_address: str | None = None,
    ray_retries: int = DEFAULT_RAY_RETRIES,
    ray_runtime_env: dict[str, Any] | None = None,
    ray_connect_timeout: float | None = None,
) -> Iterator[tuple[int, RunResults]]:
    """``(index in jobs, RunResults)`` for each job, as each finishes (the request checked by
    :func:`check_export_request`)."""
    if executor == "ray":
        return _on_ray(
            jobs,
            ray_address,
            retries=ray_retries,
            runtime_env=ray_runtime_env,
            local_cpus=jobs_in_parallel if jobs_in_parallel > 1 else None,
            connect_timeout=ray_connect_timeout,
        )
    if jobs_in_parallel > 1 and len(jobs) > 1:
        return _in_process_pool(jobs, jobs_in_parallel)
    return _in_this_process(jobs)


def require_ray() -> None:
    """ConfigError unless Ray is installed (asked without importing it)."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise ConfigError(
            "the ray executor needs Ray, which is not installed: pip install 'gym-artifacts[ray]'"
        )


def check_export_request(
    config: str | os.PathLike[str] | Mapping[str, Any] | None = None,
    *,
    overrides: Sequence[str] = (),
    exporters: Sequence[str] = (),
    executor: str = "local",
    jobs: int = 1,
    ray_address: str | None = None,
    ray_connect_timeout_s: float | None = None,
) -> Any | None:
    """ConfigError for a request no run could be exported with, before any run is read.

    The one validation of ``export_runs`` and ``gym-artifacts export`` alike: a config file's (or
    mapping's) unknown keys, malformed ``key=value`` overrides, unknown exporter names, the
    executor, ``jobs`` and a Ray address without the Ray executor. Returns the config file it
    read (a DictConfig; None without one), so that nothing reads it again.
    """
    from gym_artifacts.contract.registry import discover, get_entry
    from gym_artifacts.core.config import as_config, check_export_config, load_yaml_config, parse_overrides
    from gym_artifacts.export.engine import check_exporter_setting_names

    if executor not in EXECUTORS:
        raise ConfigError(f"unknown executor {executor!r}: choose one of {', '.join(EXECUTORS)}")
    if isinstance(jobs, bool) or not isinstance(jobs, int):
        raise ConfigError(f"jobs (--jobs): expected an int, not {type(jobs).__name__}")
    if jobs < 1:
        raise ConfigError("jobs (--jobs) must be at least 1")
    if ray_address is not None and not isinstance(ray_address, str):
        raise ConfigError(f"ray_address: expected a str, not {type(ray_address).__name__}")
    if ray_address is not None and executor != "ray":
        raise ConfigError("a Ray address (--ray-address) needs the ray executor (--executor ray)")
    if ray_connect_timeout_s is not None and executor != "ray":
        raise ConfigError("a Ray connect timeout (--ray-connect-timeout) needs --executor ray")
    if executor == "ray":
        ray_connect_timeout(ray_connect_timeout_s)
    layers: list[tuple[Any, str]] = []
    file_cfg = None
    if config is None:
        pass
    elif isinstance(config, (str, os.PathLike)):
        file_cfg = load_yaml_config(config)
        layers.append((file_cfg, str(config)))
    elif isinstance(config, Mapping):
        layers.append((as_config(config), "the config mapping"))
    else:
        raise ConfigError(
            f"config: expected a YAML file path, a mapping or None, not {type(config).__name__}"
        )
    layers.append((parse_overrides(overrides), "override"))
    for cfg, source in layers:
        check_export_config(cfg, source)
        check_exporter_setting_names(cfg, source)
    entries = discover()
    for name in exporters:
        get_entry(name, entries)
    if executor == "ray":
        require_ray()
    return file_cfg


def as_list(value: Any, what: str, *, paths: bool = False) -> list[Any]:
    """A list of names (or of runs, ``paths``): a single str (or PathLike run) is a list of one.

    Iterating a str would take each character as an item; anything but a str (or path) or a
    sequence of them is refused with ConfigError, as the CLI refuses it.
    """
    single = (str, os.PathLike) if paths else (str,)
    if isinstance(value, single):
        return [value]
    if isinstance(value, (bytes, Mapping)) or not isinstance(value, Sequence):
        raise ConfigError(f"{what}: expected {'a path' if paths else 'a str'} or a list of them, "
                          f"not {type(value).__name__}")  # fmt: skip
    for item in value:
        if not isinstance(item, single):
            raise ConfigError(f"{what}: {item!r} is not {'a path' if paths else 'a str'}")
    return list(value)


def check_flags(**flags: Any) -> None:
    """ConfigError for a flag that is not a bool (None: decided by the config, where allowed).

    ``upload_rollouts='no'`` is truthy: taken as given it would upload.
    """
    for name, (value, optional) in flags.items():
        if not (isinstance(value, bool) or (optional and value is None)):
            allowed = "True, False or None" if optional else "True or False"
            raise ConfigError(f"{name}: {value!r} is not a boolean ({allowed})")


def _run_summary(out: RunResults) -> str:
    if out.config_error is not None:
        return f"config error: {out.config_error}"
    return ", ".join(f"{r.exporter} {r.status.value}" for r in out.results)


def export_runs(
    runs: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    config: str | os.PathLike[str] | Mapping[str, Any] | None = None,
    *,
    overrides: str | Sequence[str] = (),
    exporters: str | Sequence[str] = (),
    upload_rollouts: bool | None = None,
    certify: bool | None = None,
    verify: bool = False,
    accept_partial_line: bool = False,
    accept_stale_aggregates: bool = False,
    executor: str = "local",
    jobs: int = 1,
    ray_address: str | None = None,
    ray_retries: int = DEFAULT_RAY_RETRIES,
    ray_runtime_env: dict[str, Any] | None = None,
    ray_connect_timeout: float | None = None,
    progress: bool = False,
    on_result: Callable[[int, RunResults], None] | None = None,
    nemo_gym_config: str | os.PathLike[str] | None = None,
) -> list[RunResults]:
    """Export many runs, each exactly once per backend; one RunResults per run, in ``runs`` order.

    The Python API of ``gym-artifacts export`` (the command only parses its arguments into this
    call and prints what it returns). ``runs``, ``exporters`` and ``overrides``: a list, or a
    single run (str or path) / name / ``key=value`` taken as a list of one. ``config``: a YAML
    file, a mapping, or None (each run's saved config, else the embedded default); the flags
    as in ``export_run``. ``executor``: ``local`` (this process, or ``jobs`` processes) or
    ``ray`` (one task per run on the cluster at ``ray_address``; ``auto`` joins the running one;
    None starts a local cluster for this call and stops it; joining gives up after
    ``ray_connect_timeout`` seconds, default $GYM_ARTIFACTS_RAY_CONNECT_TIMEOUT else 30, with
    ClusterError). ``progress``: progress lines on a
    terminal's stderr. ``on_result(done, results)`` is called as each run finishes.
    ``nemo_gym_config``: NeMo Gym's resolved global config file, logged as each run's params
    (``export_run``); refused up front when it cannot be read.

    Raises ConfigError (nothing read, nothing sent) for an unusable request, see
    :func:`check_export_request`; a run's own problems become its RunResults.
    """
    from gym_artifacts.core.progress import Progress

    runs = as_list(runs, "runs", paths=True)
    if not runs:
        raise ConfigError("no run given (OUT.jsonl or an artifacts folder)")
    exporters = as_list(exporters, "exporters")
    overrides = as_list(overrides, "overrides")
    check_flags(
        upload_rollouts=(upload_rollouts, True), certify=(certify, True), verify=(verify, False),
        accept_partial_line=(accept_partial_line, False), progress=(progress, False),
        accept_stale_aggregates=(accept_stale_aggregates, False),
    )  # fmt: skip
    file_cfg = check_export_request(
        config, overrides=overrides, exporters=exporters, executor=executor, jobs=jobs,
        ray_address=ray_address, ray_connect_timeout_s=ray_connect_timeout,
    )  # fmt: skip
    from gym_artifacts.core.config import raw_container

    content = raw_container(file_cfg) if file_cfg is not None else None  # the file, read once
    if config is None or isinstance(config, (str, os.PathLike)):
        config_file, mapping = (None if config is None else str(config)), None
    else:
        from omegaconf import OmegaConf

        config_file, mapping = None, raw_container(OmegaConf.create(dict(config)))
    if nemo_gym_config is not None:
        from gym_artifacts.run.nemo_gym_params import load_nemo_gym_run_config

        load_nemo_gym_run_config(nemo_gym_config)  # ConfigError now, not a failure per run
        nemo_gym_config = os.fspath(nemo_gym_config)
    parallel = executor == "ray" or (jobs > 1 and len(runs) > 1)
    job_list = [
        ExportJob(
            run=str(run),
            config_file=config_file,
            config_file_content=content,
            config=mapping,
            overrides=tuple(overrides),
            exporters=tuple(exporters),
            upload_rollouts=upload_rollouts,
            certify=certify,
            verify=verify,
            accept_partial_line=accept_partial_line,
            accept_stale_aggregates=accept_stale_aggregates,
            # bytes progress for one run at a time in this process
            progress=progress and not parallel,
            nemo_gym_config=nemo_gym_config,
        )
        for run in runs
    ]
    # runs finished so far, when several runs run at once
    runs_progress = Progress(enabled=None if progress and parallel and len(job_list) > 1 else False)
    out: list[RunResults | None] = [None] * len(job_list)
    failed = 0
    if parallel:
        prepare_destinations(job_list)
    try:
        finished = run_jobs(
            job_list,
            executor=executor,
            jobs_in_parallel=jobs,
            ray_address=ray_address,
            ray_retries=ray_retries,
            ray_runtime_env=ray_runtime_env,
            ray_connect_timeout=ray_connect_timeout,
        )
        for done, (i, results) in enumerate(finished, start=1):
            out[i] = results
            failed += results.failed
            runs_progress.count(f"runs exported ({failed} failed)", done, len(job_list))
            logger.info("%s: %s", results.run, _run_summary(results))
            if on_result is not None:
                on_result(done, results)
    finally:
        runs_progress.close()
    return [r for r in out if r is not None]
