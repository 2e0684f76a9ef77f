"""The plugin surface imports, and names what it promises (a rename in the core must not break plugins)."""

from __future__ import annotations


def test_every_promised_name_imports() -> None:
    from gym_artifacts import plugin

    missing = [name for name in plugin.__all__ if not hasattr(plugin, name)]
    assert missing == []
    assert {"Exporter", "LiveExporter", "ExporterConfig", "CannotCertify", "RunStatus"} <= set(plugin.__all__)
