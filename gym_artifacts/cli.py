"""The ``gym-artifacts`` command: export finished eval runs once per backend, show status, write reports.

Argv and printing only: each command is one call of the Python API (``export_runs``,
``run_status``, ``build_report``, ``list_exporters``), which decides everything else, so the
command and the API cannot disagree.

Exit codes: 0 when every result is EXPORTED or SKIPPED, 1 when any FAILED, 2 for unusable
arguments or config, or a run that does not exist. Heavy modules are imported inside the
commands that need them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import signal
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from gym_artifacts.export.executors import RunResults

from gym_artifacts.core.flags import PARTIAL_OVERRIDE_FLAG, STALE_OVERRIDE_FLAG
from gym_artifacts.core.progress import human_bytes
from gym_artifacts.core.secrets import install_log_redaction
from gym_artifacts.core.text_table import format_table

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 130  # Ctrl-C: what finished is printed, the rest cancelled


# Deprecated flags, each working as the one it was renamed to (``_RenamedFlag``).
RENAMED_FLAGS = {"--certify": "--complete-live-run", "--no-certify": "--no-complete-live-run"}


class _RenamedFlag(argparse.BooleanOptionalAction):
    """A deprecated ``--[no-]NAME`` flag: works as the flag it was renamed to, saying so on stderr."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:  # fmt: skip
        new = RENAMED_FLAGS.get(option_string or "", "")
        print(f"gym-artifacts: {option_string} is deprecated: use {new}", file=sys.stderr)
        super().__call__(parser, namespace, values, option_string)


_INVALID_CHOICE = re.compile(r"invalid choice: '(?P<word>[^']*)' \(choose from (?P<choices>.*)\)")


class _Parser(argparse.ArgumentParser):
    """Usage errors with exit code 2, the closest choice suggested for an invalid one."""

    commands: dict[str, argparse.ArgumentParser]

    def error(self, message: str) -> None:  # type: ignore[override]
        from gym_artifacts.core.suggest import did_you_mean

        if match := _INVALID_CHOICE.search(message):
            choices = [c.strip().strip("'\"") for c in match["choices"].split(",")]
            message += did_you_mean(match["word"], choices)
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


logger = logging.getLogger("gym_artifacts.cli")

EPILOG = """examples:
  gym-artifacts export results/eval.jsonl                 # to the run's saved exporters, else the default
  gym-artifacts export results/*.jsonl -e mlflow --jobs 4
  gym-artifacts status results/eval.jsonl
  gym-artifacts report results/eval.jsonl -o eval.html
  gym-artifacts compare results/base.jsonl results/new.jsonl -o compare.html
  gym-artifacts exporters
  gym-artifacts instrument -- gym eval run ...           # NeMo Gym logging through gym-artifacts
"""


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gym-artifacts")
    except PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="gym-artifacts",
        description=__doc__.splitlines()[0].split(": ", 1)[1],
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    verbose = argparse.ArgumentParser(add_help=False)
    verbose.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=argparse.SUPPRESS,
        help="log each step the tool takes (and the backends' own logs) to stderr",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help=verbose._actions[0].help)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    exp = sub.add_parser(
        "export", parents=[verbose], help="export finished runs, exactly once per backend"
    )
    exp.add_argument(
        "items",
        nargs="+",
        metavar="OUT.jsonl|key=value",
        help="runs (rollouts files or artifacts folders), then config overrides",
    )
    exp.add_argument("-c", "--config", type=Path, help="YAML config choosing exporters and settings")
    exp.add_argument(
        "-e",
        "--exporter",
        action="append",
        default=[],
        metavar="NAME",
        help="export only to this backend (repeatable)",
    )
    exp.add_argument(
        "--upload-rollouts",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="send the rollouts (default: the run's saved setting, else yes)",
    )
    exp.add_argument(
        "--complete-live-run",
        dest="certify",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="send into the live run of this output, completing it (repairing what it lost), "
        "instead of a new backend run: the default, unless what it recorded differs from the "
        "files; --no-complete-live-run always sends a new run",
    )
    exp.add_argument(  # the old name, kept working for scripts: it said "certify" but only chose this
        "--certify", dest="certify", action=_RenamedFlag, default=None, help=argparse.SUPPRESS
    )
    exp.add_argument(
        "--verify",
        action="store_true",
        help="ask each backend whether the receipted run still exists; export anew if it is gone",
    )
    exp.add_argument(
        PARTIAL_OVERRIDE_FLAG,
        action="store_true",
        help="rollouts whose last line is torn: export the complete lines (the backend run records it)",
    )
    exp.add_argument(
        STALE_OVERRIDE_FLAG,
        action="store_true",
        help="export aggregate metrics that neither content nor times tie to the rollouts",
    )
    exp.add_argument(
        "--run-config",
        dest="nemo_gym_config",
        type=Path,
        metavar="FILE",
        help="NeMo Gym's resolved global config (YAML/JSON): logged, masked, as the run's params",
    )
    exp.add_argument("--jobs", type=int, default=1, metavar="N", help="runs exported in parallel")
    exp.add_argument(
        "--executor",
        choices=("local", "ray"),
        default="local",
        help="local: this machine (--jobs processes); ray: one Ray task per run on a cluster",
    )
    exp.add_argument(
        "--ray-address",
        metavar="ADDRESS",
        help="the Ray cluster to join ('auto': the running one); default: a local one for this export",
    )
    exp.add_argument(
        "--ray-connect-timeout",
        type=float,
        metavar="SECONDS",
        help="give up joining the Ray cluster after this long (default: "
        "$GYM_ARTIFACTS_RAY_CONNECT_TIMEOUT, else 30)",
    )
    exp.add_argument("--json", action="store_true", help="print one JSON array of results")
    exp.add_argument("-q", "--quiet", action="store_true", help="print nothing on success")

    st = sub.add_parser(
        "status", parents=[verbose], help="a run's identities, receipts and what it is missing"
    )
    st.add_argument("run", metavar="OUT.jsonl")
    st.add_argument("--json", action="store_true", help="print the same as one JSON object")
    st.add_argument("--verify", action="store_true", help="ask each backend whether its receipted run exists")

    rp = sub.add_parser(
        "report", parents=[verbose], help="write a self-contained HTML report of a run"
    )
    rp.add_argument("run", metavar="OUT.jsonl")
    rp.add_argument("-o", "--output", type=Path, help="where to write it (default: STEM_report.html)")

    from gym_artifacts.compare.cli import add_compare_parser

    cmp = add_compare_parser(sub, [verbose])

    ls = sub.add_parser(
        "exporters", parents=[verbose], help="registered backends and whether their SDK is installed"
    )
    ls.add_argument("-c", "--config", type=Path, help="config whose enabled flags to show")
    ls.add_argument("--json", action="store_true", help="print one JSON array, a backend per object")
    ins = sub.add_parser(
        "instrument",
        help="run a command with NeMo Gym's exporters replaced by gym-artifacts' (no file edited)",
        description="Run COMMAND (and every Python process it starts) with `nemo_gym.exporters` "
        "replaced by gym-artifacts' drop-in: `gym-artifacts instrument -- gym eval run ...`. "
        "The command replaces this process: its exit code and signals are its own.",
    )
    ins.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")
    parser.commands = {
        "export": exp, "status": st, "report": rp, "exporters": ls, "compare": cmp, "instrument": ins
    }
    return parser


def _refuse_unknown(parser: _Parser, command: str, unknown: Sequence[str]) -> None:
    """Exit 2 with the command's own usage, suggesting the option closest to the first unknown one."""
    from gym_artifacts.core.suggest import did_you_mean

    command_parser = parser.commands[command]
    actions = [*parser._actions, *command_parser._actions]
    options = [opt for action in actions for opt in action.option_strings]
    first = next((u for u in unknown if u.startswith("-")), None)
    hint = did_you_mean(first.split("=", 1)[0], options) if first is not None else ""
    command_parser.error(f"unrecognized arguments: {' '.join(unknown)}{hint}")


def _looks_like_path(text: str) -> bool:
    return "/" in text or os.sep in text or text.endswith((".jsonl", ".json"))


def _split_items(items: Sequence[str]) -> tuple[list[str], list[str]]:
    runs: list[str] = []
    overrides: list[str] = []
    for item in items:
        # ``key=value`` unless it names a file, or its "key" is a path (``runs/lr=0.1/eval.jsonl``)
        if "=" in item and not os.path.exists(item) and not _looks_like_path(item.split("=", 1)[0]):
            overrides.append(item)
        else:
            runs.append(item)
    return runs, overrides


def cmd_export(ns: argparse.Namespace) -> int:
    """``export_runs`` with the parsed arguments; the results printed, the exit code chosen."""
    from gym_artifacts.core.errors import ClusterError, GymArtifactsError
    from gym_artifacts.export.executors import export_runs

    runs, overrides = _split_items(ns.items)  # no run at all: export_runs refuses it
    finished: list[RunResults] = []
    try:
        outputs = export_runs(
            runs,
            ns.config,
            overrides=overrides,
            exporters=ns.exporter,
            upload_rollouts=ns.upload_rollouts,
            certify=ns.certify,
            verify=ns.verify,
            accept_partial_line=ns.accept_partial_line,
            accept_stale_aggregates=ns.accept_stale_aggregates,
            executor=ns.executor,
            jobs=ns.jobs,
            ray_address=ns.ray_address,
            ray_connect_timeout=ns.ray_connect_timeout,
            progress=not (ns.json or ns.quiet),
            on_result=lambda _done, out: finished.append(out),
            nemo_gym_config=ns.nemo_gym_config,
        )
    except ClusterError as exc:  # no Ray cluster could be started or joined
        print(f"gym-artifacts: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except GymArtifactsError as exc:  # an unusable request
        print(f"gym-artifacts: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as interrupt:
        partial = getattr(interrupt, "finished", None)  # the backends a cut-off run finished
        if partial is not None and partial.results and partial.run not in {out.run for out in finished}:
            finished.append(partial)
        cut = partial is not None and partial in finished and not getattr(interrupt, "whole", False)
        cancelled = len(runs) - len(finished) + cut
        if cancelled:
            print(f"gym-artifacts: interrupted: {cancelled} run(s) not exported (cancelled)"
                  + (f"; {partial.run} only in part: its finished backends are listed" if cut else ""),
                  file=sys.stderr)  # fmt: skip
        else:
            print("gym-artifacts: interrupted after every export finished (what ran after them, such as a "
                  "report, was cancelled)", file=sys.stderr)  # fmt: skip
        _print_results(sorted(finished, key=lambda out: runs.index(out.run)), ns)
        return EXIT_INTERRUPTED
    for out in outputs:
        if out.config_error is not None:
            print(f"gym-artifacts: error: {out.run}: {out.config_error}", file=sys.stderr)
    _print_results(outputs, ns)
    if any(out.config_error is not None for out in outputs):
        return EXIT_USAGE
    return EXIT_FAILED if any(out.failed for out in outputs) else EXIT_OK


def _print_results(outputs: Sequence[RunResults], ns: argparse.Namespace) -> None:
    """The result table (or ``--json`` array) in the order the runs were given."""
    results = [r for out in outputs for r in out.to_json()]
    if ns.json:
        print(json.dumps(results, indent=2))
    elif results and not (ns.quiet and all(r["status"] != "FAILED" for r in results)):
        print(format_results_table(results))


def format_results_table(results: Sequence[dict[str, Any]]) -> str:
    """The human-readable result table of an export."""
    many_runs = len({r["run"] for r in results}) > 1
    headers = (["run"] if many_runs else []) + [
        "exporter",
        "status",
        "backend run",
        "rows",
        "bytes",
        "seconds",
        "reason",
    ]
    rows = []
    for r in results:
        row = [r["run"]] if many_runs else []
        row += [
            r["exporter"],
            r["status"],
            r["backend_run_id"] or "-",
            str(r["rows"]),
            human_bytes(r["bytes"]),
            f"{r['seconds']:.2f}",
            r["reason"] or "",
        ]
        rows.append(row)
    return format_table(headers, rows)


def cmd_status(ns: argparse.Namespace) -> int:
    from gym_artifacts.core.errors import GymArtifactsError, MissingRunError
    from gym_artifacts.export.status import exports_table, run_status
    from gym_artifacts.run.names import NO_CONFIG

    try:
        state = run_status(ns.run, verify=ns.verify)
    except MissingRunError as exc:
        print(f"gym-artifacts: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except GymArtifactsError as exc:
        print(f"gym-artifacts: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if ns.json:
        print(json.dumps(state.to_json(), indent=2))
        return EXIT_OK
    print(f"run: {ns.run}")
    if state.partial_line is not None and state.run.rollouts_fpath is not None:
        print(f"rollouts: {state.partial_line.describe(state.run.rollouts_fpath)}")
    missing = state.missing_for_export
    print(f"exportable: {'yes' if missing is None else 'no: ' + missing}")
    print(f"coverage: {state.coverage.text()}")
    print(f"config: {state.run.config_fpath if state.has_config else NO_CONFIG}")
    print(f"run identity: {state.run_identity}")
    print(format_table(["artifact", "identity"], [[k, v] for k, v in state.identities.items()]))
    print()
    print(format_table(*exports_table(state.exporters)))
    return EXIT_OK


def cmd_report(ns: argparse.Namespace) -> int:
    from gym_artifacts.core.errors import GymArtifactsError, MissingRunError
    from gym_artifacts.report import build_report

    try:
        dest = build_report(ns.run, ns.output)
    except MissingRunError as exc:
        print(f"gym-artifacts: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except GymArtifactsError as exc:
        print(f"gym-artifacts: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(dest)
    return EXIT_OK


def cmd_exporters(ns: argparse.Namespace) -> int:
    from gym_artifacts.contract.registry import list_exporters
    from gym_artifacts.core.errors import GymArtifactsError

    logger.info("reading %s", ns.config or "the embedded default config")
    try:
        rows = list_exporters(ns.config)
    except GymArtifactsError as exc:
        print(f"gym-artifacts: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if ns.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    yes_no = {True: "yes", False: "no"}
    headers = ["exporter", "enabled", "sdk installed", "modes", "provider"]
    print(format_table(headers, [
        [r["name"], yes_no[r["enabled"]], yes_no[r["sdk_installed"]], r["modes"], r["provider"]] for r in rows
    ]))  # fmt: skip
    return EXIT_OK


def _printable_streams() -> None:
    """Standard output and error write a path's undecodable bytes (``r\xe9sultats`` as
    ``os.fsdecode`` holds it: a lone surrogate) as an escape instead of failing the command."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            with contextlib.suppress(Exception):  # a stream that cannot change keeps its own errors
                reconfigure(errors="backslashreplace")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; a reader that closes the pipe early (``| head``) ends it quietly, and a
    Ctrl-C no command handled itself (``status``, ``report``, an import) exits 130 in one line."""
    _printable_streams()
    try:
        code = _main(argv)
        sys.stdout.flush()
    except BrokenPipeError:
        # Python would print a traceback flushing stdout at exit: point stdout at nothing first.
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("gym-artifacts: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return code


def run() -> NoReturn:
    """The program (``gym-artifacts``, ``python -m gym_artifacts``): ``main()``, then exit.

    After a Ctrl-C the process ends at once, without the interpreter's shutdown: that waits for
    every non-daemon thread (a pool sending traces, an SDK's own workers), each of which may sit
    in a request to a server that never answers, for as long as its deadline (minutes). What the
    command had to say is printed and flushed first; locks are the kernel's (``flock``) and end
    with the process; nothing abandoned wrote a receipt."""
    try:
        code = main()
    except KeyboardInterrupt:  # a second Ctrl-C while the first one's results were printed
        code = EXIT_INTERRUPTED
    if code == EXIT_INTERRUPTED:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a further Ctrl-C cannot cut the flush
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(EXIT_INTERRUPTED)
    sys.exit(code)


def cmd_instrument(command: Sequence[str]) -> int:
    """``exec`` the command instrumented; returns only when it cannot be run."""
    from gym_artifacts.instrument.command import InstrumentError, exec_instrumented

    try:
        exec_instrumented(command)
    except InstrumentError as exc:
        print(f"gym-artifacts: error: {exc}", file=sys.stderr)
        return exc.code
    return EXIT_FAILED  # not reached: exec replaced this process


def _instrument_command(argv: Sequence[str]) -> list[str] | None:
    """The COMMAND of ``instrument [--] COMMAND ...`` (taken as it is: its own options are not
    this tool's), or None when argv is another command or asks for help."""
    args = list(argv)
    if not args or args[0] != "instrument" or (len(args) > 1 and args[1] in ("-h", "--help")):
        return None
    rest = args[1:]
    return rest[1:] if rest[:1] == ["--"] else rest


def _main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = _instrument_command(argv)
    if command is not None:
        return cmd_instrument(command)
    parser = build_parser()
    assert isinstance(parser, _Parser)
    # Runs and key=value overrides may come before or after options: collect both.
    ns, extra = parser.parse_known_args(argv)
    unknown = [e for e in extra if e.startswith("-") or ns.command != "export"]
    if unknown:
        _refuse_unknown(parser, ns.command, unknown)
    if ns.command == "export":
        ns.items += extra
    install_log_redaction()
    logging.basicConfig(
        level=logging.INFO if ns.verbose else logging.WARNING,
        format="gym-artifacts: %(levelname)s: %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logger.info("gym-artifacts %s: %s", _version(), ns.command)
    from gym_artifacts.compare.cli import cmd_compare

    handlers = {"export": cmd_export, "status": cmd_status, "exporters": cmd_exporters, "report": cmd_report,
                "compare": cmd_compare}  # fmt: skip
    try:
        with _backend_logs(ns.verbose):
            return handlers[ns.command](ns)
    except BrokenPipeError:  # the reader went away: main() ends quietly
        raise
    except Exception as exc:  # from a dependency or the system: one line; -v adds the traceback
        return _unexpected(exc, ns.verbose)


@contextlib.contextmanager
def _backend_logs(verbose: bool) -> Iterator[None]:
    """Backends' own INFO lines only with -v. MLflow configures its own INFO handler when it is
    imported ("Creating initial MLflow database tables..."), from ``MLFLOW_LOGGING_LEVEL``: set
    for the command (worker processes inherit it) unless the user chose a level; restored after."""
    if verbose or os.environ.get("MLFLOW_LOGGING_LEVEL"):
        yield
        return
    os.environ["MLFLOW_LOGGING_LEVEL"] = "WARNING"
    try:
        yield
    finally:
        os.environ.pop("MLFLOW_LOGGING_LEVEL", None)


def _unexpected(exc: Exception, verbose: bool) -> int:
    """Print an error no command handles as one line (secrets masked); exit code 1."""
    from gym_artifacts.core.secrets import redact_text

    if verbose:
        logger.error("traceback:", exc_info=exc)
    text = " ".join(str(exc).split()) or "(no message)"
    text = text if len(text) <= 500 else text[:499] + "…"
    hint = "" if verbose else " (run with -v for the traceback)"
    print(redact_text(f"gym-artifacts: error: {type(exc).__name__}: {text}{hint}"), file=sys.stderr)
    return EXIT_FAILED


if __name__ == "__main__":
    run()
