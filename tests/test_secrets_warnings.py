"""Python warnings pass the same redaction as log records: once :func:`install_log_redaction` is
active (the CLI installs it), a ``warnings.warn`` text holding a known secret or a secret shape is
masked, whether printed by Python or routed through logging (``logging.captureWarnings``).
Run in subprocesses: pytest's own warning capture would hide what Python prints."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.processes import run_bounded

REPO = Path(__file__).resolve().parents[1]
CANARY = "canary-warning-secret-4f7a2c"
URI_PW = "canary-warn-uri-pw-9b1d"


def _run(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_bounded(
        [sys.executable, "-W", "always", "-c", textwrap.dedent(code), *args],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip


def test_warnings_warn_is_redacted_printed_and_captured_by_logging() -> None:
    proc = _run(f"""
        import logging, warnings
        from gym_artifacts.core.secrets import install_log_redaction, remember_secrets
        install_log_redaction()
        remember_secrets({{"{CANARY}"}})
        warnings.warn("printed: key {CANARY} for http://u:{URI_PW}@h/x")
        logging.basicConfig(format="logged: %(message)s")
        logging.captureWarnings(True)
        warnings.warn("via logging: key {CANARY} for http://u:{URI_PW}@h/x")
        """)
    assert proc.returncode == 0, proc.stderr
    assert "printed: key *** for http://u:***@h/x" in proc.stderr, proc.stderr
    assert "logged:" in proc.stderr and "via logging: key *** for http://u:***@h/x" in proc.stderr, (
        proc.stderr
    )
    assert CANARY not in proc.stderr and URI_PW not in proc.stderr, proc.stderr


@pytest.mark.slow
def test_cli_redacts_a_backend_warning_raised_during_export(quickstart_run: Path, tmp_path: Path) -> None:
    """A backend warns with a secret of the config while it exports: the CLI shows it masked."""
    proc = _run(
        f"""
        import sys, warnings
        from gym_artifacts._builtin_exporters.local import LocalExporter
        from gym_artifacts.cli import main
        original = LocalExporter._export
        def export_warning(self, run, plan):
            warnings.warn("backend: login with {CANARY} refused, retrying at http://u:{URI_PW}@h")
            return original(self, run, plan)
        LocalExporter._export = export_warning
        sys.exit(main(sys.argv[1:]))
        """,
        "-v",
        "export",
        str(quickstart_run),
        "-e",
        "local",
        "--json",
        f"exporters.local.root={tmp_path / 'store'}",
        f"mlflow_tracking_token={CANARY}",  # a known key holding a secret of the config
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "backend: login with *** refused, retrying at http://u:***@h" in proc.stderr, proc.stderr[-3000:]
    assert CANARY not in proc.stderr + proc.stdout and URI_PW not in proc.stderr + proc.stdout, proc.stderr
