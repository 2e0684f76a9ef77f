"""One schema creation per MLflow SQLite store, whatever runs the exports (processes, Ray tasks).

MLflow creates a missing schema in every process that opens a fresh ``sqlite:///`` store: many
processes opening one new store at once race through the same migrations (``duplicate column``,
``table _alembic_tmp_... already exists``), and SQLite commits each DDL statement on its own, so
a process killed mid-way leaves a half-migrated file that no later export can use.

Here the schema is made once, atomically: under an inter-process lock beside the store (POSIX
``lockf``, which network filesystems honour where they honour any lock), in a scratch file that
is renamed into place only when complete. A process killed while creating leaves at most the
scratch file (removed by the next creator); a concurrent opener either finds no store (and waits
for the lock) or a complete one. The driver of a parallel export calls ``ensure_sqlite_schema``
before fanning out, and every ``ScopedMlflow`` calls it again (a read-only check when the store is
ready). A store left broken by someone else's interrupted migration, or of another MLflow
version, is refused with one line naming the file and what to do.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import logging
import os
import sqlite3
import stat
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

from gym_artifacts.plugin import GymArtifactsError

logger = logging.getLogger(__name__)

LOCK_WAIT_S = 600.0  # creating MLflow's schema takes seconds; a holder is alive (locks die with it)
_SDK_LOGGERS = ("mlflow.store.db.utils", "alembic.runtime.migration", "alembic")


class StoreUnusable(GymArtifactsError):
    """The SQLite store exists but cannot be used as it is (one line: the file and what to do)."""


def sqlite_store_path(tracking_uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (None for another store or an in-memory one)."""
    if not tracking_uri.startswith("sqlite:///"):
        return None
    path = tracking_uri[len("sqlite:///") :].partition("?")[0]
    if not path or path == ":memory:":
        return None
    return Path(os.path.abspath(path))


@functools.lru_cache(maxsize=1)
def _mlflow_revisions() -> tuple[str, frozenset[str]]:
    """(head revision, every revision) of the installed MLflow's migrations."""
    from alembic.script import ScriptDirectory
    from mlflow.store.db.utils import _get_alembic_config

    script = ScriptDirectory.from_config(_get_alembic_config(""))
    return script.get_current_head(), frozenset(r.revision for r in script.walk_revisions())


def _tables(path: Path) -> tuple[set[str], str | None]:
    """The store's tables and its schema revision (``mode=rw``: never creates the file; a hot
    journal a killed writer left is rolled back, as any opener does)."""
    uri = f"file:{quote(str(path))}?mode=rw"
    conn = sqlite3.connect(uri, uri=True, timeout=30)
    try:
        names = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        revision = None
        if "alembic_version" in names:
            row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
            revision = row[0] if row else None
        return names, revision
    finally:
        conn.close()


def schema_problem(path: Path) -> str | None:
    """None when the store at ``path`` is ready; ``"absent"`` when it has no schema yet (no file,
    an empty file or no table); else one line saying what is wrong and what to do."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return "absent"
    if not stat.S_ISREG(st.st_mode):
        return f"MLflow store {path} is not a regular file: set exporters.mlflow.tracking_uri to a file"
    if st.st_size == 0:
        return "absent"
    try:
        tables, revision = _tables(path)
    except sqlite3.Error as exc:
        return (
            f"MLflow store {path} cannot be read as an SQLite database ({exc}): restore it from a "
            "backup, or move it away to start a new store there"
        )
    if not tables:
        return "absent"
    head, known = _mlflow_revisions()
    leftovers = sorted(t for t in tables if t.startswith("_alembic_tmp_"))
    if leftovers or revision is None:
        found = f"table {leftovers[0]} left behind" if leftovers else "tables without a schema revision"
        return (
            f"MLflow store {path} was left half-migrated by an interrupted schema creation or upgrade "
            f"({found}): restore it from a backup; or, if it holds no run you need, move it away and "
            "export again (a new store is created)"
        )
    if revision == head:
        return None
    if revision in known:
        return (
            f"MLflow store {path} has an older schema ({revision}, this MLflow needs {head}): back it "
            f"up, then run `mlflow db upgrade sqlite:///{path}`"
        )
    return (
        f"MLflow store {path} was written by another MLflow version (schema {revision}, unknown to "
        "this one): use that MLflow version, or another tracking_uri"
    )


@contextlib.contextmanager
def _store_lock(path: Path, wait_s: float) -> Iterator[None]:
    """An exclusive inter-process lock on a hidden file beside the store, removed on release.

    POSIX ``lockf`` (NFS honours it, unlike ``flock`` on some clients); the lock dies with its
    holder. The file is unlinked by the holder on release, so a waiter that locked an unlinked
    file (its inode no longer the path's) starts again.
    """
    lock = path.with_name(f".{path.name}.schema-lock")
    deadline = time.monotonic() + wait_s
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            while True:
                try:
                    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EAGAIN, errno.EACCES):
                        raise
                    if time.monotonic() >= deadline:
                        raise StoreUnusable(
                            f"MLflow store {path}: another process has been creating its schema for "
                            f"{wait_s:g} s ({lock}); try again later"
                        ) from None
                    time.sleep(0.05)
            try:
                same = os.fstat(fd).st_ino == os.stat(lock, follow_symlinks=False).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # the previous holder removed this file: lock the new one
                continue
            try:
                yield
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(lock)
            return
        finally:
            os.close(fd)


@contextlib.contextmanager
def _quiet_sdk_logs() -> Iterator[None]:
    """MLflow and alembic announce each migration at INFO: shown with -v only."""
    if logging.getLogger("gym_artifacts").isEnabledFor(logging.INFO):
        yield
        return
    saved = [(logging.getLogger(n), logging.getLogger(n).level) for n in _SDK_LOGGERS]
    for log, _ in saved:
        log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for log, level in saved:
            log.setLevel(level)


def _create(path: Path) -> None:
    """MLflow's whole schema in a scratch file beside ``path``, then renamed onto it."""
    import sqlalchemy
    from mlflow.store.db.utils import _initialize_tables

    scratch = path.with_name(f".{path.name}.creating")
    for leftover in (scratch, scratch.with_name(scratch.name + "-journal")):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(leftover)  # a creator killed before us: we hold the lock, it is dead
    engine = sqlalchemy.create_engine(f"sqlite:///{scratch}", poolclass=sqlalchemy.pool.NullPool)
    try:
        # The SDK's own deprecation warnings (SQLAlchemy's, raised while the migrations configure
        # MLflow's ORM mappers) are not the user's; under ``-W error`` one would leave the mappers
        # broken for the whole process.
        with _quiet_sdk_logs(), warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            _initialize_tables(engine)
    finally:
        engine.dispose()
    fd = os.open(scratch, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(scratch, path)  # under the lock: no other creator; an empty file is replaced
    with contextlib.suppress(OSError):
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    logger.info("mlflow: created the schema of %s", path)


def ensure_sqlite_schema(tracking_uri: str, wait_s: float = LOCK_WAIT_S) -> None:
    """Make sure a ``sqlite:///`` store has MLflow's current schema; nothing for other stores.

    Ready: a read-only check, no lock. Absent: created once (see the module docstring).
    Unusable: StoreUnusable with one line naming the file and what to do.
    """
    path = sqlite_store_path(tracking_uri)
    if path is None:
        return
    problem = schema_problem(path)
    if problem is None:
        return
    if problem != "absent":
        raise StoreUnusable(problem)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _store_lock(path, wait_s):
        problem = schema_problem(path)  # another process may have created it while we waited
        if problem == "absent":
            try:
                _create(path)
            except Exception as exc:  # the SDK's own error (a full disk, a read-only folder ...)
                first = next((line for line in str(exc).splitlines() if line.strip()), "")
                raise StoreUnusable(
                    f"cannot create MLflow's schema in {path}: {type(exc).__name__}: {first}"
                ) from exc
            problem = schema_problem(path)
    if problem is not None:
        raise StoreUnusable(problem)
