"""An MLflow client scoped to one exporter: its own token, timeouts and retries.

MLflow reads the tracking token, request timeout and retry count from process-wide environment
variables. Live logging must never sit in MLflow's default ~4-minute retry loop, and a token
must reach this exporter's requests only, so for ``http(s)://`` tracking URIs the client gets a
REST store whose requests carry this exporter's credentials and limits, and artifacts are
uploaded with the same. Other stores (SQLite, PostgreSQL, file) use ``MlflowClient`` as is.
Nothing here changes ``os.environ`` or MLflow's module state. The SDK is imported lazily.
"""

from __future__ import annotations

import json
import logging
import mimetypes
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from gym_artifacts.plugin import adopted, current_watch, made_progress, mask_secrets

from ._mlflow_bookkeeping import BOOKKEEPING_TAG, bookkeeping_of, encode, lookup_filter

IDENTITY_KEY = "identity"  # the run's content identity, in the bookkeeping tag
logger = logging.getLogger(__name__)


CONNECT_TIMEOUT_S = 10.0  # a server that does not even accept the connection is not waited for


class RequestDeadlinePassed(Exception):
    """The overall time allowed for this client's requests (their retries included) ran out: the
    MLflow backend's own limit, not the export watchdog's ``DeadlinePassed`` (``core/watchdog.py``)."""


class ServerRefused(Exception):
    """The server (or the store) refused a request with a 4xx: asking again, or waiting for
    what it refused to appear, cannot help. The export fails at once with the server's words."""


# 4xx statuses that ask the client to try again later rather than refuse the request.
_TRY_AGAIN = frozenset({408, 425, 429})


def refusal_status(exc: BaseException) -> int | None:
    """The 4xx status of a refusal ``exc`` carries (an MLflow error code, or an HTTP error's
    response), other than those that ask to try again (408, 425, 429); None for anything else
    (a timeout, a dropped connection, a 5xx: the request may still have been applied)."""
    status: int | None = None
    response = getattr(exc, "response", None)
    if response is not None and isinstance(getattr(response, "status_code", None), int):
        status = response.status_code
    elif callable(getattr(exc, "get_http_status_code", None)):
        status = exc.get_http_status_code()  # type: ignore[attr-defined]
    if isinstance(status, int) and 400 <= status < 500 and status not in _TRY_AGAIN:
        return status
    return None


def as_refusal(what: str, exc: BaseException) -> ServerRefused | None:
    """A ServerRefused naming ``what`` was refused and the server's own words, when ``exc`` is a
    refusal (``refusal_status``); None otherwise."""
    status = refusal_status(exc)
    if status is None:
        return None
    words = " ".join(str(exc).split()) or type(exc).__name__
    return ServerRefused(f"MLflow refused {what} (HTTP {status}): {words}")


@dataclass(frozen=True)
class RequestLimits:
    """How long one request may take, how often it is retried, and the overall deadline.

    ``deadline`` (seconds, from when the client is made) bounds every request together,
    retries included, whatever the server does: one that never answers or drips a byte at a
    time (no read timeout ever fires) ends in RequestDeadlinePassed. None: no overall deadline.
    """

    timeout: float
    retries: int
    backoff: float = 1.0
    deadline: float | None = None


class Deadline:
    """When a client's requests must have ended, and the request runner that keeps to it."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.at = None if seconds is None else time.monotonic() + seconds

    def progress(self) -> None:
        """The server took a unit of work (a batch of traces): the deadline restarts from now."""
        if self.seconds is not None:
            self.at = time.monotonic() + self.seconds

    def passed(self) -> RequestDeadlinePassed:
        return RequestDeadlinePassed(f"export deadline of {self.seconds:g} s passed (server not answering)")

    def remaining(self) -> float | None:
        if self.at is None:
            return None
        left = self.at - time.monotonic()
        if left <= 0:
            raise self.passed()
        return left

    def timeout(self, per_request: float) -> tuple[float, float]:
        """(connect, read) timeouts for the next request: within both limits."""
        left = self.remaining()
        read = per_request if left is None else min(per_request, left)
        return min(CONNECT_TIMEOUT_S, read), read

    def run(self, fn: Callable[[], Any]) -> Any:
        """``fn()``, or RequestDeadlinePassed once the deadline passes while it still runs.

        The request runs on a daemon thread: a server that drips bytes keeps every read
        timeout from firing, so only leaving the thread behind bounds the wait.
        """
        left = self.remaining()
        if left is None:
            return fn()
        outcome: dict[str, Any] = {}

        def target() -> None:
            try:
                outcome["value"] = fn()
            except BaseException as exc:  # handed to the caller's thread below
                outcome["error"] = exc

        # its connections belong to the export's watch (gym_artifacts.core.watchdog): cut off with it
        thread = threading.Thread(target=adopted(target), name="gym-artifacts-mlflow-request", daemon=True)
        thread.start()
        thread.join(left)
        if thread.is_alive():
            watch = current_watch()
            if watch is not None:
                watch.abandon()  # the request's socket shut down: it sends nothing more
            raise self.passed()
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]


ENVIRON_RETRIES = 5  # a request cut by a change of os.environ is sent again this many times at most


def _environment_changed(exc: BaseException) -> bool:
    """Whether ``exc`` is (or was raised handling) a KeyError of ``os.environ``'s own lookup:
    another thread removed a variable while ``requests`` iterated the environment for its proxy
    settings (MLflow's telemetry removes ``_MLFLOW_TELEMETRY_SESSION_ID`` from a thread of its
    own), which happens before anything is sent. MLflow reports it as the request failing "with
    exception '<the variable>'"."""
    import traceback

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, KeyError) and seen.__traceback__ is not None:
            last = traceback.extract_tb(seen.__traceback__)[-1:]
            if last and last[0].name == "__getitem__" and last[0].filename.endswith(("os.py", "<frozen os>")):
                return True
        seen = seen.__cause__ or seen.__context__
    return False


def send_once_environment_settles(send: Callable[[], Any]) -> Any:
    """``send()``, sent again when it failed before sending anything because the environment
    changed under ``requests`` (``_environment_changed``); any other failure is raised as is."""
    for attempt in range(ENVIRON_RETRIES):
        try:
            return send()
        except Exception as exc:
            if attempt + 1 == ENVIRON_RETRIES or not _environment_changed(exc):
                raise
    raise AssertionError("unreachable")


def is_rest(uri: str) -> bool:
    """An ``http(s)://`` tracking URI: an MLflow server, not a database or file store."""
    return uri.startswith(("http://", "https://"))


def _scoped_rest_store(
    tracking_uri: str, token: str | None, limits: RequestLimits, deadline: Deadline
) -> Any:
    from mlflow.protos.service_pb2 import CreateRun
    from mlflow.store.tracking.rest_store import RestStore
    from mlflow.utils.proto_json_utils import parse_dict
    from mlflow.utils.rest_utils import MlflowHostCreds, http_request, verify_rest_response

    creds = MlflowHostCreds(host=tracking_uri, token=token)

    class ScopedRestStore(RestStore):  # type: ignore[misc]
        """RestStore whose requests use this exporter's token, timeout and retry count."""

        def _call_endpoint(
            self,
            api: Any,
            json_body: Any = None,
            endpoint: str | None = None,
            retry_timeout_seconds: Any = None,
            response_proto: Any = None,
        ) -> Any:
            method_to_info = self._V3_METHOD_TO_INFO if api in self._V3_APIS else self._METHOD_TO_INFO
            default_endpoint, method = method_to_info[api]
            endpoint = endpoint or default_endpoint
            response_proto = response_proto or api.Response()
            body = json.loads(json_body) if json_body is not None else None
            # runs/create is not idempotent: a retry after a timeout can leave a second run.
            # The exporter looks the run's identity up before it creates again.
            retries = 0 if api is CreateRun else limits.retries
            payload = {"params": body} if method == "GET" else {"json": body}
            response = deadline.run(
                lambda: send_once_environment_settles(
                    lambda: http_request(
                        self.get_host_creds(),
                        endpoint,
                        method,
                        max_retries=retries,
                        backoff_factor=limits.backoff if retries else 0,
                        timeout=deadline.timeout(limits.timeout),
                        **payload,
                    )
                )
            )
            response = verify_rest_response(response, endpoint)
            if response.status_code == 204 or not response.text.strip():
                return response_proto
            parse_dict(js_dict=json.loads(response.text), message=response_proto)
            return response_proto

    return ScopedRestStore(lambda: creds)


class ScopedMlflow:
    """The MLflow operations the exporter needs, on explicit run ids (no fluent active run)."""

    def __init__(
        self, tracking_uri: str, token: str | None, limits: RequestLimits, deadline: Deadline | None = None
    ) -> None:
        """``deadline``: one shared with another client of the same export (its progress counts
        for both); by default a new one of ``limits.deadline`` seconds."""
        from mlflow.tracking import MlflowClient

        self.tracking_uri = tracking_uri
        self.token = token
        self.limits = limits
        self.deadline = deadline if deadline is not None else Deadline(limits.deadline)
        self._artifact_uris: dict[str, str] = {}
        # each run's bookkeeping as last read or written through this client: an update is a
        # read-modify-write of one tag, and needs no extra read when the run was just seen
        self._bookkeeping: dict[str, dict[str, str]] = {}
        self.client = MlflowClient(tracking_uri=tracking_uri)
        if is_rest(tracking_uri):
            from mlflow.tracking._tracking_service.client import TrackingServiceClient

            store = _scoped_rest_store(tracking_uri, token, limits, self.deadline)

            class ScopedTrackingClient(TrackingServiceClient):  # type: ignore[misc]
                @property
                def store(self) -> Any:
                    return store

                def _log_url(self, run_id: str) -> None:
                    # MLflow writes the run's URL to stdout; ours must stay machine-readable.
                    logger.info("mlflow run %s at %s", run_id, tracking_uri)

            self.client._tracking_client = ScopedTrackingClient(tracking_uri)

    # -- experiments and runs ------------------------------------------------------------------
    def experiment_id(self, name: str, artifact_location: str | None) -> str:
        """Get or create the experiment; a concurrent creator winning the race is fine."""
        from mlflow.exceptions import MlflowException

        existing = self.client.get_experiment_by_name(name)
        if existing is None:
            try:
                return str(self.client.create_experiment(name, artifact_location=artifact_location))
            except MlflowException:
                existing = self.client.get_experiment_by_name(name)
                if existing is None:
                    raise
        if existing.lifecycle_stage == "deleted":
            raise ValueError(
                f"MLflow experiment {name!r} is deleted: restore it (mlflow experiments restore) "
                "or set exporters.mlflow.experiment_name to another name"
            )
        return str(existing.experiment_id)

    def create_run(
        self,
        experiment_id: str,
        run_name: str | None,
        tags: dict[str, str],
        start_ms: int,
        bookkeeping: dict[str, str] | None = None,
    ) -> str:
        """A new run; ``bookkeeping`` goes into the one bookkeeping tag. Tags under secret names
        or holding secret-shaped values are masked."""
        masked = mask_secrets(tags)
        kept = mask_secrets(bookkeeping or {})
        if kept:
            masked[BOOKKEEPING_TAG] = encode(kept)
        run = self.client.create_run(experiment_id, start_time=start_ms, tags=masked, run_name=run_name)
        self._bookkeeping[str(run.info.run_id)] = kept
        return str(run.info.run_id)

    def find_runs(self, experiment_id: str, key: str, value: str) -> list[Any]:
        """Active runs of the experiment whose bookkeeping has ``key == value`` (oldest first):
        a ``LIKE`` prefilter on the bookkeeping tag, each hit's parsed value checked exactly."""
        hits = self._search(experiment_id, lookup_filter(key, value))
        return [r for r in hits if bookkeeping_of(r.data.tags).get(key) == value]

    def find_tagged(self, experiment_id: str, tag: str, value: str) -> list[Any]:
        """Active runs of the experiment whose own tag ``tag`` equals ``value`` (oldest first)."""
        return self._search(experiment_id, f"tags.`{tag}` = '{value}'")

    def _search(self, experiment_id: str, filter_string: str) -> list[Any]:
        from mlflow.entities import ViewType

        runs = self.client.search_runs(
            [experiment_id],
            filter_string=filter_string,
            run_view_type=ViewType.ACTIVE_ONLY,
            max_results=50,
            order_by=["attributes.start_time ASC"],
        )
        for run in runs:
            self._bookkeeping[str(run.info.run_id)] = bookkeeping_of(run.data.tags)
        return list(runs)

    def delete_run(self, run_id: str) -> None:
        self.client.delete_run(run_id)

    def get_run(self, run_id: str) -> Any:
        run = self.client.get_run(run_id)
        self._bookkeeping[run_id] = bookkeeping_of(run.data.tags)
        return run

    def set_status(self, run_id: str, status: str) -> None:
        self.client.update_run(run_id, status=status)

    def terminate(self, run_id: str, status: str, end_ms: int | None = None) -> None:
        """End the run at ``end_ms`` (the eval's end for a post-run export), else now."""
        end = int(time.time() * 1000) if end_ms is None else end_ms
        self.client.set_terminated(run_id, status=status, end_time=end)

    def set_tags(self, run_id: str, tags: dict[str, str], bookkeeping: dict[str, str] | None = None) -> None:
        """Tags in batches; under secret names (user tags, journal texts) or secret-shaped: masked.
        ``bookkeeping`` entries are merged into the run's bookkeeping tag (read first unless this
        client saw the run last) and sent in the same request as the first batch."""
        from mlflow.entities import RunTag

        masked = mask_secrets(tags)
        merged: dict[str, str] | None = None
        if bookkeeping:
            current = self._bookkeeping.get(run_id)
            if current is None:
                current = dict(self._read_bookkeeping(run_id))
            merged = {**current, **mask_secrets(bookkeeping)}
            masked[BOOKKEEPING_TAG] = encode(merged)
        items = [RunTag(k, v) for k, v in masked.items()]
        for batch in _batches(items, 100):
            self.client.log_batch(run_id, tags=batch)
        if merged is not None:
            self._bookkeeping[run_id] = merged

    def _read_bookkeeping(self, run_id: str) -> dict[str, str]:
        self.get_run(run_id)
        return self._bookkeeping[run_id]

    def log_params(self, run_id: str, params: dict[str, str]) -> list[str]:
        """Log params in batches; a batch MLflow refuses is retried key by key. Returns refused keys."""
        from mlflow.entities import Param
        from mlflow.exceptions import MlflowException

        refused: list[str] = []
        items = [Param(k, v) for k, v in params.items()]
        for batch in _batches(items, 100):
            try:
                self.client.log_batch(run_id, params=batch)
            except MlflowException:
                for param in batch:
                    try:
                        self.client.log_batch(run_id, params=[param])
                    except MlflowException:
                        refused.append(param.key)
        return refused

    def log_metrics(self, run_id: str, points: Iterable[tuple[str, float, int, int]]) -> int:
        """Log ``(key, value, timestamp_ms, step)`` points, 1000 per request; returns the count."""
        from mlflow.entities import Metric

        count = 0
        batch: list[Any] = []
        for key, value, timestamp_ms, step in points:
            batch.append(Metric(key, value, timestamp_ms, step))
            if len(batch) == 1000:
                self.client.log_batch(run_id, metrics=batch)
                count += len(batch)
                batch = []
        if batch:
            self.client.log_batch(run_id, metrics=batch)
            count += len(batch)
        return count

    # -- traces -------------------------------------------------------------------------------------
    def progress(self) -> None:
        """The server took a unit of work (a batch of traces): this client's deadline and the
        export's watched deadline restart from now (``export_deadline`` bounds a stall, not a
        large export that keeps landing batches)."""
        self.deadline.progress()
        made_progress()

    def post_otlp(self, experiment_id: str, body: bytes) -> None:
        """One OTLP/HTTP protobuf request to the server's ``/v1/traces`` (MLflow 3.6+) into the
        experiment, with this client's token, timeouts, retries and deadline. The server upserts
        spans by id, so a retried request adds nothing."""
        from mlflow.utils.request_utils import augmented_raise_for_status
        from mlflow.utils.rest_utils import MlflowHostCreds, http_request

        creds = MlflowHostCreds(host=self.tracking_uri, token=self.token)
        headers = {"Content-Type": "application/x-protobuf", "x-mlflow-experiment-id": experiment_id}
        backoff = self.limits.backoff if self.limits.retries else 0
        response = self.deadline.run(
            lambda: send_once_environment_settles(lambda: http_request(
                creds, "/v1/traces", "POST", data=body, extra_headers=headers,
                max_retries=self.limits.retries, backoff_factor=backoff,
                timeout=self.deadline.timeout(self.limits.timeout),
            ))
        )  # fmt: skip
        augmented_raise_for_status(response)

    # -- artifacts ----------------------------------------------------------------------------------
    def log_artifact(self, run_id: str, local_path: Path, artifact_dir: str | None) -> int:
        """Upload one file as ``<artifact_dir>/<file name>`` (overwriting); returns its size."""
        size = local_path.stat().st_size
        artifact_uri = self._artifact_uris.get(run_id)
        if artifact_uri is None:  # a run's artifact root never changes: ask once
            artifact_uri = self._artifact_uris[run_id] = self.get_run(run_id).info.artifact_uri
        base = self._http_artifact_base(artifact_uri)
        if base is None:
            self.client.log_artifact(run_id, str(local_path), artifact_dir)
            return size
        check_artifact_name(local_path.name)
        segments = [*(artifact_dir.split("/") if artifact_dir else []), local_path.name]
        # every segment escaped: "#", "%", "?" and spaces are part of the name, not of the URL
        self._put(base, "/" + "/".join(quote(seg, safe="") for seg in segments), local_path)
        return size

    def _http_artifact_base(self, artifact_uri: str) -> str | None:
        if artifact_uri.startswith("mlflow-artifacts:"):
            from mlflow.store.artifact.mlflow_artifacts_repo import MlflowArtifactsRepository

            return str(MlflowArtifactsRepository.resolve_uri(artifact_uri, self.tracking_uri))
        if is_rest(artifact_uri):
            return artifact_uri
        return None

    def _put(self, base: str, endpoint: str, local_path: Path) -> None:
        from mlflow.utils.request_utils import augmented_raise_for_status
        from mlflow.utils.rest_utils import MlflowHostCreds, http_request

        creds = MlflowHostCreds(host=base, token=self.token)
        mime = mimetypes.guess_type(local_path.name)[0] or "application/octet-stream"
        for attempt in range(self.limits.retries + 1):
            try:
                with open(local_path, "rb") as fh:  # reopened per attempt: a retried body is whole
                    response = self.deadline.run(
                        lambda fh=fh: send_once_environment_settles(lambda: http_request(  # type: ignore[misc]
                            creds, endpoint, "PUT", data=fh, extra_headers={"Content-Type": mime},
                            max_retries=0, timeout=self.deadline.timeout(self.limits.timeout),
                        ))
                    )  # fmt: skip
                augmented_raise_for_status(response)
                return
            except RequestDeadlinePassed:
                raise
            except Exception as exc:
                refusal = as_refusal(f"the upload of {endpoint}", exc)
                if refusal is not None:  # asking again cannot help
                    raise refusal from exc
                if attempt == self.limits.retries:
                    raise
                time.sleep(min(self.limits.backoff * (2**attempt), self.deadline.remaining() or float("inf")))


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_artifact_name(name: str) -> None:
    """Refuse (ValueError) an artifact name MLflow cannot store exactly.

    A control character (a newline) cannot travel in a URL path; an ``mlflow server`` decodes
    %-escapes in a path (``100%25.txt`` would be stored as ``100%.txt``) and refuses ``#``; its
    client cannot download a name holding ``?``. Every other character (a lone ``%``, spaces,
    ``&``, ``+``, quotes, unicode) is stored as is.
    """
    decoded = name
    for _ in range(10):  # as the server decodes: until nothing changes
        once = unquote(decoded)
        if once == decoded:
            break
        decoded = once
    if _CONTROL.search(decoded):
        raise ValueError(f"artifact name {name!r} holds a control character; MLflow cannot store it exactly")
    if decoded != name:
        raise ValueError(f"artifact name {name!r} holds a %-escape, which an MLflow server decodes")
    if "#" in decoded or "?" in decoded:
        raise ValueError(f"artifact name {name!r} holds '#' or '?', which MLflow cannot store and read back")


def _batches(items: Sequence[Any], size: int) -> Iterable[Sequence[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def file_mtime_ms(fpath: Path) -> int:
    """A file's modification time in milliseconds (stable across retries of one export)."""
    return int(os.stat(fpath).st_mtime_ns // 1_000_000)
