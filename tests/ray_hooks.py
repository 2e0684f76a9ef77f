"""Ray worker setup hooks for tests (``runtime_env={"worker_process_setup_hook": ...}``).

A hook runs in every worker process the test's driver gets, before any task.
"""

from __future__ import annotations

import os
import signal


def die_once_before_mlflow_terminate() -> None:
    """The first worker (cluster-wide) to end an MLflow run SIGKILLs itself just before: the
    run is created and its data sent, its receipt not written. ``GA_TEST_DIE_FLAG`` names the
    file whose exclusive creation elects that worker."""
    from gym_artifacts._builtin_exporters._mlflow_client import ScopedMlflow

    real = ScopedMlflow.terminate
    flag = os.environ["GA_TEST_DIE_FLAG"]

    def terminate(self: ScopedMlflow, run_id: str, *args: object, **kwargs: object) -> None:
        try:
            fd = os.open(flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return real(self, run_id, *args, **kwargs)
        os.write(fd, f"{os.getpid()} {run_id}\n".encode())
        os.close(fd)
        os.kill(os.getpid(), signal.SIGKILL)

    ScopedMlflow.terminate = terminate  # type: ignore[method-assign]


def no_file_locks() -> None:
    """File locks that do nothing, as on a network filesystem that does not honour them: what
    keeps exports exactly once is then the backends' own guards alone."""
    import contextlib

    import gym_artifacts.export.engine

    @contextlib.contextmanager
    def not_a_lock(*args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        yield

    gym_artifacts.export.engine.exclusive_lock = not_a_lock  # type: ignore[assignment]
