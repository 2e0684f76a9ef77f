"""Where a run's files are, which are present, and what keeps the run from a faithful export."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gym_artifacts.core.errors import MissingRunError, RunError, RunNameTooLong, first_validation_error
from gym_artifacts.core.flags import PARTIAL_OVERRIDE_FLAG
from gym_artifacts.core.jsonio import read_json
from gym_artifacts.run import layout
from gym_artifacts.run.levels import agent_label
from gym_artifacts.run.staleness import stale_reason
from gym_artifacts.run.torn import PartialLine, partial_last_line

if TYPE_CHECKING:
    from gym_artifacts.run.aggregate_read import AggregateRead

EXPORTER_NAME_RE = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")

ROLLOUTS = "rollouts.jsonl"
AGGREGATE_METRICS = "aggregate_metrics.json"
CONFIG = "config.yaml"
ACCEPTANCE = "acceptance.json"
METRICS_JOURNAL = "metrics.jsonl"
# NeMo Gym's sidecars: failed rollouts, the planned inputs, and its quality checker's files
# (the last two sit in the output's folder without the stem).
FAILURES = "failures.jsonl"
MATERIALIZED_INPUTS = "materialized_inputs.jsonl"
QUALITY_SUMMARY = "quality_summary.json"
ROLLOUT_VERDICTS = "rollout_verdicts.jsonl"
SIDECARS = (FAILURES, MATERIALIZED_INPUTS, QUALITY_SUMMARY, ROLLOUT_VERDICTS)
ARTIFACTS_PREFIX = "artifacts/"


class Acceptance(BaseModel):
    """A recovery gate's record that a stage was accepted partial."""

    model_config = ConfigDict(extra="allow")

    planned_rows: int = Field(ge=0)
    omitted_rows: int = Field(ge=0)
    reason: str


def check_exporter_name(name: str) -> str:
    """Exporter names become parts of file names: keep them plain."""
    if not EXPORTER_NAME_RE.match(name):
        raise RunError(f"invalid exporter name {name!r}: use lower-case letters, digits, '_' or '-'")
    return name


def _check_run_argument(given: str) -> None:
    """Refuse, before any path arithmetic, a run argument that names no run: an empty path (the
    working folder), or one ending in ``.`` or ``..`` (a folder named by where the command runs,
    whose receipts would land in its parent)."""
    if not given.strip():
        raise MissingRunError(f"no run at {given!r}: an empty path names no run")
    if given.rstrip("/").rsplit("/", 1)[-1] in (".", ".."):
        raise MissingRunError(
            f"no run at {given}: name the run by its rollouts file OUT.jsonl or by its artifacts "
            "folder's own path"
        )


def _check_not_a_folder_of_runs(given: str, dpath: Path) -> None:
    """A folder holding a run's rollouts file (``OUT.jsonl`` beside its aggregate metrics, config,
    journal or artifacts folder) is a folder of runs, not a run: exporting it would copy every
    file of it as one run."""
    try:
        names = {entry.name for entry in os.scandir(dpath)}
    except OSError:
        return
    sibling_suffixes = (
        layout.AGGREGATE_SUFFIX, layout.CONFIG_SUFFIX, layout.JOURNAL_SUFFIX, layout.ARTIFACTS_SUFFIX
    )  # fmt: skip
    for name in sorted(names):
        if name.endswith(layout.ROLLOUTS_SUFFIX):
            stem = name[: -len(layout.ROLLOUTS_SUFFIX)]
            if any(stem + suffix in names for suffix in sibling_suffixes):
                raise MissingRunError(
                    f"no run at {given}: it is a folder of runs; name one by its rollouts file "
                    f"({os.path.join(given, name)})"
                )


def _no_exporters() -> tuple[str, ...]:
    return ()


# The exporters whose file names a run must have room for when a caller names none. The registry
# (a layer above the run model) installs its scan here when it is imported: the run model never
# imports it (docs/architecture.md).
registered_exporter_names: Callable[[], Iterable[str]] = _no_exporters


class RunArtifacts(BaseModel):
    """A run named by its rollouts file ``STEM.jsonl``, or an artifacts folder given alone.

    ``stem`` is the rollouts path without ``.jsonl``; for a folder given alone it is the folder
    itself, so receipts and markers sit beside it as ``<folder>_<exporter>_...``.
    """

    model_config = ConfigDict(frozen=True)

    stem: Path
    artifacts_dpath: Path
    has_rollouts_file: bool
    source: str

    @classmethod
    def from_path(cls, path: str | os.PathLike[str]) -> RunArtifacts:
        """Build from ``OUT.jsonl`` (present or not) or from an artifacts folder."""
        given = os.fspath(path)
        _check_run_argument(given)
        fpath = Path(given).expanduser().absolute()
        if fpath.is_dir():
            _check_not_a_folder_of_runs(given, fpath)
            if fpath.name.endswith(layout.ARTIFACTS_SUFFIX):
                stem = fpath.with_name(fpath.name[: -len(layout.ARTIFACTS_SUFFIX)])
                if stem.with_name(stem.name + ".jsonl").is_file():
                    return cls(stem=stem, artifacts_dpath=fpath, has_rollouts_file=True, source=given)
            return cls(stem=fpath, artifacts_dpath=fpath, has_rollouts_file=False, source=given)
        if fpath.suffix != ".jsonl":
            if not fpath.exists():
                raise MissingRunError(f"no run at {given}: no such file or folder")
            raise RunError(f"{given}: a run is named by its rollouts file OUT.jsonl or an artifacts folder")
        stem = fpath.with_suffix("")
        return cls(
            stem=stem,
            artifacts_dpath=stem.with_name(stem.name + layout.ARTIFACTS_SUFFIX),
            has_rollouts_file=True,
            source=given,
        )

    def check_name_room(
        self, exporters: list[str] | tuple[str, ...] | None = None, *, live: bool = False
    ) -> RunArtifacts:
        """This run, or RunNameTooLong when a name it may need (a receipt, a lock, a marker for
        any registered exporter, the report, the identity cache) is longer than its folder
        allows: refused before the first write, never a half-done export."""
        if exporters is None:
            exporters = tuple(registered_exporter_names())
        folder = self.stem.parent
        try:
            limit = os.pathconf(folder if folder.is_dir() else "/", "PC_NAME_MAX")
        except (OSError, ValueError):
            limit = 255
        names = layout.run_file_names(self.stem.name, exporters, live=live)
        longest = max(names, key=lambda n: len(os.fsencode(n)))
        if len(os.fsencode(longest)) > limit:
            room = limit - (len(os.fsencode(longest)) - len(os.fsencode(self.stem.name)))
            raise RunNameTooLong(
                f"{self.source}: the run's name is too long: {longest[len(self.stem.name) :]!r} must fit "
                f"beside it and file names here hold {limit} bytes; rename the run to a stem of at most "
                f"{room} bytes"
            )
        return self

    def require_present(self) -> RunArtifacts:
        """This run, or MissingRunError when none of its files exists (a typo, a wrong folder),
        or RunNameTooLong when its stem cannot hold every name it needs."""
        self.check_name_room()
        if self.has_rollouts_file and not (self._top_level_files() or self.artifacts_dpath.is_dir()):
            raise MissingRunError(
                f"no run at {self.source}: neither it nor its aggregate metrics, config, journal "
                f"or artifacts folder exists"
            )
        return self

    def partial_rollouts_line(self) -> PartialLine | None:
        """The rollouts file's torn last line (the eval was killed mid-write), or None."""
        rollouts = self.rollouts_fpath
        if rollouts is None or not rollouts.is_file():
            return None
        return partial_last_line(rollouts)

    def _sibling(self, suffix: str) -> Path:
        return self.stem.with_name(self.stem.name + suffix)

    @property
    def name(self) -> str:
        """A short human name for the run: the stem's last part."""
        return self.stem.name

    @property
    def rollouts_fpath(self) -> Path | None:
        return self._sibling(layout.ROLLOUTS_SUFFIX) if self.has_rollouts_file else None

    @property
    def aggregate_metrics_fpath(self) -> Path:
        return self._sibling(layout.AGGREGATE_SUFFIX)

    @property
    def config_fpath(self) -> Path:
        return self._sibling(layout.CONFIG_SUFFIX)

    @property
    def acceptance_fpath(self) -> Path:
        return self._sibling(layout.ACCEPTANCE_SUFFIX)

    @property
    def metrics_journal_fpath(self) -> Path:
        return self._sibling(layout.JOURNAL_SUFFIX)

    @property
    def failures_fpath(self) -> Path:
        return self._sibling("_failures.jsonl")

    @property
    def materialized_inputs_fpath(self) -> Path:
        return self._sibling("_materialized_inputs.jsonl")

    def sidecar_files(self) -> dict[str, Path]:
        """NeMo Gym's sidecar files that are present, by artifact name."""
        if not self.has_rollouts_file:
            return {}
        candidates = {
            FAILURES: self.failures_fpath,
            MATERIALIZED_INPUTS: self.materialized_inputs_fpath,
            QUALITY_SUMMARY: self.stem.parent / QUALITY_SUMMARY,
            ROLLOUT_VERDICTS: self.stem.parent / ROLLOUT_VERDICTS,
        }
        return {name: fpath for name, fpath in candidates.items() if fpath.is_file()}

    def export_done_fpath(self, exporter: str) -> Path:
        """The version-1 receipt of a post-run export to ``exporter``."""
        return self.stem.with_name(layout.receipt_name(self.stem.name, check_exporter_name(exporter)))

    def run_id_marker_fpath(self, exporter: str) -> Path:
        """The marker naming the backend run a live run opened."""
        return self.stem.with_name(layout.marker_name(self.stem.name, check_exporter_name(exporter)))

    @property
    def identity_cache_fpath(self) -> Path:
        """A hidden file beside the run remembering its files' identities (never part of the run)."""
        return self.stem.with_name(layout.identity_cache_name(self.stem.name))

    def live_writer_lock_fpath(self) -> Path:
        """The lock one live-logging process holds on this output while it writes to it."""
        return self._sibling("_live.lock")

    def export_lock_fpath(self, exporter: str) -> Path:
        """The lock held while one process exports this run to ``exporter``."""
        return self.stem.with_name(layout.lock_name(self.stem.name, check_exporter_name(exporter)))

    def _top_level_files(self) -> dict[str, Path]:
        files: dict[str, Path] = {}
        if not self.has_rollouts_file:
            return files
        candidates = {
            ROLLOUTS: self.rollouts_fpath,
            AGGREGATE_METRICS: self.aggregate_metrics_fpath,
            CONFIG: self.config_fpath,
            ACCEPTANCE: self.acceptance_fpath,
            METRICS_JOURNAL: self.metrics_journal_fpath,
        }
        for name, fpath in candidates.items():
            if fpath is not None and fpath.is_file():
                files[name] = fpath
        files.update(self.sidecar_files())
        return files

    def runtime_artifact_files(self) -> dict[str, Path]:
        """``{relative name: path}`` of the artifacts folder's files, refusing paths that leave it.

        Hidden files (temporary files of an atomic write in progress) are not part of the run.
        """
        root = self.artifacts_dpath
        if not root.is_dir():
            return {}
        self._check_inside(root, root.parent.resolve())  # the folder itself a link leaving the run
        real_root = root.resolve()
        files: dict[str, Path] = {}
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            dpath = Path(dirpath)
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for dname in dirnames:
                if (dpath / dname).is_symlink():
                    self._check_inside(dpath / dname, real_root)
            for fname in sorted(filenames):
                if fname.startswith("."):
                    continue
                fpath = dpath / fname
                rel = fpath.relative_to(root).as_posix()
                try:
                    rel.encode("utf-8")
                except UnicodeEncodeError as exc:
                    raise RunError(f"{fpath!s}: file name is not valid UTF-8") from exc
                self._check_inside(fpath, real_root)
                if not fpath.is_file():
                    raise RunError(f"{fpath}: not a regular file (only files can be exported)")
                files[rel] = fpath
        return files

    @staticmethod
    def _check_inside(fpath: Path, real_root: Path) -> None:
        if fpath.is_symlink():
            target = fpath.resolve()
            if not target.is_relative_to(real_root):
                raise RunError(
                    f"{fpath}: symlink leads outside the run folder (to {target}); refusing to export it"
                )

    def artifact_files(self) -> dict[str, Path]:
        """Every file of the run that is present, by artifact name (what identities are keyed by)."""
        files = self._top_level_files()
        for rel, fpath in self.runtime_artifact_files().items():
            files[ARTIFACTS_PREFIX + rel] = fpath
        return files

    def read_aggregate_metrics(self) -> list[dict[str, Any]]:
        """The aggregate metrics entries, checked to be NeMo Gym's format (a list of objects),
        parsed whole: readers of a run use ``read_aggregate`` (its size does not count)."""
        from gym_artifacts.run.aggregate_read import read_entries

        return read_entries(self.aggregate_metrics_fpath)

    def read_aggregate(self) -> AggregateRead:
        """The aggregate metrics file as readers take it (heads, level tables, expected
        rollouts), read once per unchanged file in memory that does not grow with it."""
        from gym_artifacts.run.aggregate_read import read_aggregate

        return read_aggregate(self.aggregate_metrics_fpath)

    def read_acceptance(self) -> Acceptance | None:
        """The accepted-partial record, or None when the run has none."""
        fpath = self.acceptance_fpath
        if not self.has_rollouts_file or not fpath.is_file():
            return None
        data = read_json(fpath, "acceptance JSON")
        try:
            return Acceptance.model_validate(data)
        except ValidationError as exc:
            loc, msg, _ = first_validation_error(exc)
            raise RunError(f"{fpath}: invalid acceptance record at {loc or '(top level)'}: {msg}") from exc

    def omitted_rows(self) -> int:
        """How many planned rows an accepted partial stage omitted (0 when none was)."""
        acceptance = self.read_acceptance()
        return acceptance.omitted_rows if acceptance else 0

    def missing_for_export(
        self,
        rollouts_required: bool = True,
        *,
        accept_partial_line: bool = False,
        accept_stale_aggregates: bool = False,
    ) -> str | None:
        """What keeps this run from a faithful export, or None when nothing does.

        ``accept_partial_line`` lets a torn last rollouts line be left out (the export records
        it); ``accept_stale_aggregates`` exports aggregate metrics the content and times cannot
        tie to the rollouts.
        """
        problems: list[str] = []
        if not self.has_rollouts_file:
            if not self.artifacts_dpath.is_dir():
                return f"artifacts folder {self.artifacts_dpath} is missing"
            try:
                if not self.runtime_artifact_files():
                    return f"artifacts folder {self.artifacts_dpath} holds no files"
            except RunError as exc:
                return str(exc)
            return None
        rollouts = self.rollouts_fpath
        assert rollouts is not None
        aggregate = self.aggregate_metrics_fpath
        torn = self.partial_rollouts_line()
        if rollouts_required and not rollouts.is_file():
            problems.append(f"rollouts file {rollouts} {_absent(rollouts)}")
        elif rollouts_required and _blank(rollouts):
            problems.append(f"rollouts file {rollouts} holds no rollouts")
        elif torn is not None and not accept_partial_line:
            problems.append(
                f"{torn.describe(rollouts)}; pass {PARTIAL_OVERRIDE_FLAG} to export the complete "
                "lines (the backend run records what was left out)"
            )
        if not aggregate.is_file():
            problems.append(f"aggregate metrics file {aggregate} {_absent(aggregate)}")
        else:
            try:
                entries = self.read_aggregate().heads
            except RunError as exc:
                problems.append(str(exc))
            else:
                failed = [e for e in entries if e.get("aggregation_error")]
                if failed:
                    first = failed[0]
                    problems.append(
                        f"{aggregate}: {len(failed)} agent(s) hold an aggregation_error "
                        f"({agent_label(first.get('agent_ref'))}: {first['aggregation_error']}); "
                        "a partial result is never marked exported"
                    )
                elif not entries:
                    problems.append(f"{aggregate}: aggregate metrics list no agent")
                if rollouts.is_file() and not accept_stale_aggregates:
                    try:
                        stale = stale_reason(
                            aggregate, rollouts, entries, torn.complete_bytes if torn else None
                        )
                    except RunError as exc:
                        stale = str(exc)
                    if stale is not None:
                        problems.append(stale)
        try:
            self.read_acceptance()
            self.runtime_artifact_files()
        except RunError as exc:
            problems.append(str(exc))
        return "; ".join(problems) or None


def _blank(fpath: Path) -> bool:
    """Whether a file holds nothing but white space (only small files are read to tell)."""
    size = fpath.stat().st_size
    if size == 0:
        return True
    if size > 1 << 16:
        return False
    return not fpath.read_bytes().strip()


def _absent(fpath: Path) -> str:
    """Why a run file that must be a regular file is not one: missing, or something else there
    (a folder, a FIFO, a socket, a device)."""
    return "is not a regular file" if os.path.lexists(fpath) else "is missing"
