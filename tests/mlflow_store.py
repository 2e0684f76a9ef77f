"""MLflow SQLite stores for tests, created from one schema template per test process.

MLflow builds a fresh SQLite store's schema on first use (~7-10 s on these machines: a run of
Alembic migrations). Most tests are about what an export writes, not about that first use, so
they get a copy of a store MLflow itself initialised once in this process: the same real SQLite
store with the same schema, in a tenth of a second. Tests about the first use (the embedded
default on a fresh machine, ``--jobs`` on a new store, a kill during it) keep a path no one
prepared."""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
import tempfile
import threading
from pathlib import Path

_template: Path | None = None
_lock = threading.Lock()


def _schema_template() -> Path:
    """A store MLflow initialised in this process (once), with no experiment at all."""
    global _template
    with _lock:
        if _template is None:
            from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

            folder = Path(tempfile.mkdtemp(prefix="mlflow-schema-"))
            store = SqlAlchemyStore(f"sqlite:///{folder / 'template.db'}", str(folder / "artifacts"))
            store.engine.dispose()  # every connection closed: the file is complete to copy
            template = folder / "template.db"
            # Without its Default experiment: MLflow makes it on first use, where the user's
            # store would have it (its artifact location is the first user's, not this folder).
            with contextlib.closing(sqlite3.connect(template)) as db, db:
                db.execute("DELETE FROM experiment_tags WHERE experiment_id = 0")
                db.execute("DELETE FROM experiments WHERE experiment_id = 0")
            _template = template
        return _template


def mlflow_sqlite(db: Path) -> str:
    """The tracking URI of a SQLite store at ``db``: a copy of the schema template when ``db``
    does not exist yet, the store as it is when it does (a test reading back what it exported)."""
    db = Path(db)
    if not db.exists():
        db.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_schema_template(), db)
    return f"sqlite:///{db}"
