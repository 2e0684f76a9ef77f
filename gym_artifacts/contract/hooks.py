"""The backend contract: every hook a backend implements, what it receives and what it returns.

A *post-run* backend subclasses ``gym_artifacts.contract.exporter.Exporter`` and implements one
hook, ``_export``. A *live* backend subclasses ``gym_artifacts.contract.live_exporter.LiveExporter``
(a plugin imports it from ``gym_artifacts.plugin``) and implements three more, the required
``LiveHooks`` below (``_setup``, ``_log_metrics``, ``_teardown``); every other hook has a default
that is correct. The core's ``LiveChannel`` calls the live hooks; the post-run export engine
decides certify or a new run (``export.certify``). Both set the class attributes ``name``
(lower-case letters, digits, ``_``, ``-``; the entry-point name), ``config_model`` (an
``ExporterConfig`` subclass: the settings under ``exporters.<name>``, extra keys refused) and, for
a backend with an SDK, ``sdk_module`` (its top-level module, checked without importing it).

Hooks run on one thread per backend (the worker for live hooks), may block and may raise: an
exception listed in ``expected_errors()`` becomes a FAILED result or a counted live failure;
anything else is a bug and propagates. A class that leaves a required hook out, or overrides a
hook with a signature the core cannot call, is refused when the registry loads it, naming the
hook. ``docs/plugins.md`` walks through a whole backend.
"""

from __future__ import annotations

import contextlib
import enum
import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from gym_artifacts.core.errors import RunError

if TYPE_CHECKING:
    from pathlib import Path

    from gym_artifacts.contract.comparison import ComparisonPayload
    from gym_artifacts.run.artifacts import RunArtifacts
    from gym_artifacts.run.coverage import Coverage
    from gym_artifacts.run.torn import PartialLine


class RunStatus(str, enum.Enum):
    """How the eval ended, as backends record it."""

    FINISHED = "FINISHED"
    FAILED = "FAILED"
    KILLED = "KILLED"


class ExportStatus(str, enum.Enum):
    """How an export of one run to one backend ended."""

    EXPORTED = "EXPORTED"
    SKIPPED = "SKIPPED"
    FAILED = "FAILED"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class ExportResult:
    """One run's export to one backend: what happened, where it went, how much was sent."""

    exporter: str
    status: ExportStatus
    backend_run_id: str | None = None
    reason: str | None = None
    rows: int = 0
    bytes: int = 0
    seconds: float = 0.0
    # The export completed the backend's live run of this eval (``backend_run_id``) instead of
    # sending a new run: the export engine's decision (``export.certify``).
    certified: bool = False

    def to_json(self, run: str) -> dict[str, Any]:
        """The CLI's ``--json`` object for this result."""
        return {
            "run": run,
            "exporter": self.exporter,
            "status": self.status.value,
            "backend_run_id": self.backend_run_id,
            "reason": self.reason,
            "rows": self.rows,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 6),
            "certified": self.certified,
        }


@dataclass(frozen=True)
class ExportPlan:
    """What a send needs beyond the run's paths, computed once for every backend."""

    identities: dict[str, str]
    run_identity: str
    upload_rollouts: bool
    # None or True: complete the live run of this output unless what it recorded differs from
    # the files (``export.certify``), repairing what it lost; False: never (a new run).
    certify: bool | None = None
    config: dict[str, Any] | None = None
    secrets: frozenset[str] = field(default_factory=frozenset)
    # Records in the rollouts file, when hashing counted them (saves a second read).
    rollout_rows: int | None = None
    # A torn last rollouts line the user chose to leave out (--accept-partial-line).
    partial_line: PartialLine | None = None
    # Planned, scored and failed rollouts (``coverage/*`` in every backend).
    coverage: Coverage | None = None
    # The export's ``RunPayload`` per run, made on first use (``RunPayload.of``): what every
    # backend sends, read and masked once for all of them.
    payloads: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    # A digest of the run's files' bytes (``identity.send_key``), known before the send: what a
    # backend finds its run of these files by while (or after a crash before) it is tagged with
    # ``run_identity``. None from a caller that does not compute it.
    send_key: str | None = None
    # While the identities are hashed beside the send (``identities_pending``): returns
    # ``(identities, run_identity)`` once they are; ``identities`` is empty until ``complete()``.
    identities_later: Callable[[], tuple[dict[str, str], str]] | None = field(
        default=None, compare=False, repr=False
    )
    # Whether the run's files are still as the export found them (size, times, inode): asked by
    # ``complete()``. None from a caller that does not watch them.
    files_unchanged: Callable[[], bool] | None = field(default=None, compare=False, repr=False)
    # Where a backend reports rollouts sent as traces, ``(sent, total)`` (the export's progress
    # line: an hour-long trace export must not look hung). None: nobody shows it.
    on_traces_sent: Callable[[int, int], None] | None = field(default=None, compare=False, repr=False)

    def traces_sent(self, sent: int, total: int) -> None:
        """Report ``sent`` of ``total`` rollouts sent as traces so far (a batch landed)."""
        if self.on_traces_sent is not None:
            self.on_traces_sent(sent, total)

    @property
    def identities_pending(self) -> bool:
        """The identities are still being hashed: a backend that hashes while sending
        (``Exporter.hashes_while_sending``) finds its run by ``send_key`` and calls ``complete()``
        before tagging it with ``run_identity``."""
        return self.identities_later is not None

    def complete(self) -> ExportPlan:
        """This plan with its identities, waiting for the hashing when it is still in flight (a
        file that cannot be hashed raises here, RunError naming it). Also RunError when the run's
        files changed since the export looked at them (``files_unchanged``): a backend calls this
        before it marks its run complete, so a run is never sealed with an identity its content
        does not have."""
        plan = self
        if self.identities_later is not None:
            identities, run_identity = self.identities_later()
            plan = replace(self, identities=identities, run_identity=run_identity, identities_later=None)
        if plan.files_unchanged is not None and not plan.files_unchanged():
            raise RunError(
                "the run's files changed while it was exported; nothing of this export was kept: "
                "export again once the run is finished"
            )
        return plan

    def complete_or_undo(self, undo: Callable[[], None]) -> ExportPlan:
        """``complete()``; when the identities cannot be computed (a malformed file: the run is
        not exportable) or the files changed while they were sent, ``undo()`` what was sent of it
        first, then raise that error. A backend
        calls it after its send, and when its send failed (a malformed file may fail the send
        first): a run that cannot be identified leaves nothing behind, as when it was hashed
        before the send."""
        try:
            return self.complete()
        except Exception:
            with contextlib.suppress(Exception):
                undo()
            raise


@dataclass(frozen=True)
class Sent:
    """What a backend's send reports back: the backend run and the amount sent."""

    backend_run_id: str | None
    rows: int = 0
    bytes: int = 0
    note: str | None = None


class CannotCertify(Exception):
    """Raised by ``_certify``: this live run cannot be completed now (gone, deleted, unsupported).

    Not an error: the export then sends the run into a new backend run, as without a live run.
    (``NotImplementedError`` stays what it means in Python: a bug, a hook left out.)
    """


class PostRunHooks(ABC):
    """The one hook every backend implements, and the settings its contract suite runs with."""

    @abstractmethod
    def _export(self, run: RunArtifacts, plan: ExportPlan) -> Sent:
        """Send everything the run has into one backend run; idempotent for ``plan.run_identity``."""

    @classmethod
    def contract_settings(cls, folder: Path) -> dict[str, Any]:
        """Settings under which everything this backend stores lands inside ``folder`` (the suite's)."""
        return {}

    def _export_comparison(self, comparison: ComparisonPayload) -> Sent:
        """Optional: send a comparison of finished runs (``compare --log``) into one backend run;
        idempotent for ``comparison.identity``. A backend with no place for one leaves it out
        (``Exporter.receives_comparisons`` is then False and the core never calls it)."""
        raise NotImplementedError(f"{type(self).__name__} has no place for a comparison")

    def _after_receipt(self, run: RunArtifacts, plan: ExportPlan, backend_run_id: str | None) -> None:
        """Optional work once the export's receipt is published (the local backend's report):
        off the export's critical path. It may raise or be killed: the export stays EXPORTED."""
        return None


class LiveHooks(ABC):
    """What a live backend implements; all run on its worker thread and may raise.

    Called only by the backend's ``LiveChannel``, which sets what they read: ``self.run`` (the
    eval's ``RunArtifacts``), ``self.resume_run_id`` (the earlier process's backend run when
    resuming, else None), ``self.run_id`` (the open run, set from ``_setup``'s return),
    ``self.reopened``, ``self.secrets`` and ``self.previous_last_step()``.
    """

    @abstractmethod
    def _setup(self) -> str:
        """Open a backend run (reopen ``self.resume_run_id`` when set and possible); return its id."""

    @abstractmethod
    def _log_metrics(self, metrics: dict[str, Any], step: int, timestamp: float) -> None:
        """Record one step's metrics at ``step`` and wall-clock ``timestamp`` (seconds since the epoch)."""

    @abstractmethod
    def _teardown(self, status: RunStatus) -> None:
        """End the open run with ``status``; called once, within the eval's teardown deadline."""

    # -- optional hooks: the defaults are correct, a backend overrides them to do better ------------
    def _log_config(self, config: dict[str, Any]) -> None:
        """Record the eval's config (already masked: secrets replaced). By default nothing: the
        post-run export sends it (``RunPayload.config``)."""
        return None

    def _log_rollouts(self, rollouts: list[Any]) -> None:
        """Append finished rollouts (JSON-like records, in the eval's order) to the run. By
        default nothing: the run's rollouts file holds them all and the post-run export sends them."""
        return None

    def _log_metrics_batch(self, entries: list[tuple[dict[str, Any], int, float]]) -> None:
        """Several queued ``(metrics, step, timestamp)`` at once; override when the SDK has a batch call.

        The default applies them one by one and, when one raises, says how far it got
        (``PartialBatch``), so the calls already applied are never sent again. An override that
        raises anything else is taken as atomic: all its calls are then tried again alone.
        """
        for applied, (metrics, step, timestamp) in enumerate(entries):
            try:
                self._log_metrics(metrics, step, timestamp)
            except Exception as exc:
                raise PartialBatch(applied, exc) from exc

    def _log_rollouts_batch(self, batches: list[list[Any]]) -> None:
        """Several queued ``export_rollouts`` calls at once (the worker groups the calls that
        queued up behind a slow one); override to send them together (one trace request).

        The default applies them one by one, saying how far it got when one raises
        (``PartialBatch``), as ``_log_metrics_batch`` does.
        """
        for applied, rollouts in enumerate(batches):
            try:
                self._log_rollouts(rollouts)
            except Exception as exc:
                raise PartialBatch(applied, exc) from exc

    def _release_reopened(self) -> None:
        """Let go of a reopened run without marking it ended (by default: end it KILLED)."""
        self._teardown(RunStatus.KILLED)

    def _certify(self, run: RunArtifacts, plan: ExportPlan, live_run_id: str) -> Sent:
        """Make the live run the whole run: send into it everything the run's files hold that it
        lacks (it may have lost calls: a server down, a process killed), then end it FINISHED;
        raise ``CannotCertify`` when unable (a new run is then sent)."""
        raise CannotCertify(f"{type(self).__name__} does not complete live runs")

    def _mark_superseded(self, live_run_id: str, new_run_id: str) -> None:
        """Note on the live run that a post-run export replaced it, and end it if it never ended
        (best effort; its data untouched)."""
        return None


def missing_hooks(cls: type) -> list[str]:
    """The required hooks ``cls`` leaves out (empty for a complete backend)."""
    return sorted(getattr(cls, "__abstractmethods__", ()))


def hooks_with_wrong_signatures(cls: type) -> list[str]:
    """The hooks ``cls`` overrides that the core could not call as the contract does, each with
    the signature it has and the one it needs (``_log_metrics(self, metrics)`` cannot take
    ``(metrics, step, timestamp)``); empty for a class that keeps the contract."""
    problems = []
    for contract in (PostRunHooks, LiveHooks):
        if not (isinstance(cls, type) and issubclass(cls, contract)):
            continue
        for name in list(vars(contract)):
            if name.startswith("__") or not callable(getattr(contract, name)):
                continue
            needed, given = getattr(contract, name), getattr(cls, name)
            if given is needed or name in getattr(cls, "__abstractmethods__", ()):
                continue
            expected = inspect.signature(needed)
            arguments = [p for p in expected.parameters.values() if p.default is inspect.Parameter.empty]
            try:
                inspect.signature(given).bind(*(None for _ in arguments))
            except TypeError:
                have = _bare(inspect.signature(given))
                problems.append(f"{name}{have} cannot be called as {name}{_bare(expected)}")
            except ValueError:  # no signature to read (a builtin): trust it
                continue
    return problems


def _bare(signature: inspect.Signature) -> inspect.Signature:
    """``signature`` without its annotations: ``(self, metrics, step, timestamp)``."""
    empty = inspect.Parameter.empty
    parameters = [p.replace(annotation=empty) for p in signature.parameters.values()]
    return signature.replace(parameters=parameters, return_annotation=empty)


class PartialBatch(Exception):
    """A batch function applied its first ``applied`` calls, then call ``applied`` raised ``error``.

    The worker then counts those delivered and that one failed, and applies only the calls after
    it (one by one): no call reaches the backend twice. A batch function that raises anything
    else is taken as atomic (nothing applied) and all its calls are tried again alone.
    """

    def __init__(self, applied: int, error: Exception) -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.applied = applied
        self.error = error
