"""Each test is a fresh process as far as secrets go: a secret one test's config made known must
not mask another test's output (the process-wide set redacts every later log line and page)."""

from __future__ import annotations

from gym_artifacts.core.secrets import redact_text, remember_secrets

_SHORT_SECRET = "json"  # a 4-character password, as a generated config may hold


def test_a_config_makes_a_short_secret_known() -> None:
    remember_secrets([_SHORT_SECRET])
    assert redact_text("tables/metrics.json") == "tables/metrics.***"


def test_the_next_test_does_not_inherit_it() -> None:
    assert redact_text("tables/metrics.json") == "tables/metrics.json"
