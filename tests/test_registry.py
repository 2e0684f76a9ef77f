"""Exporter discovery: entry points, unknown names, duplicate names naming both providers."""

from __future__ import annotations

import pytest

from gym_artifacts import registry
from gym_artifacts.errors import ConfigError
from gym_artifacts.exporter import Exporter, ExportPlan, Sent


def test_builtin_local_is_registered_by_entry_point() -> None:
    entry = registry.discover()["local"]
    assert entry.target == "gym_artifacts._builtin_exporters.local:LocalExporter"
    assert entry.provider == "gym-artifacts"
    assert entry.sdk_installed()


def test_duplicate_name_names_both() -> None:
    class OtherLocal(Exporter):
        name = "local"

        def _export(self, run: object, plan: ExportPlan) -> Sent:
            raise NotImplementedError

    with pytest.raises(
        ConfigError,
        match=r"'local' is registered twice: gym_artifacts\._builtin_exporters\.local:LocalExporter .*OtherLocal",
    ):
        registry.register(OtherLocal, provider="some-plugin")


def test_unknown_name_lists_known() -> None:
    with pytest.raises(ConfigError, match=r"unknown exporter 'nope' \(known: .*local"):
        registry.get_entry("nope")
