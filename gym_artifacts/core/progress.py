"""A one-line progress display for long exports, shown only when stderr is a terminal."""

from __future__ import annotations

import sys
from typing import Any, TextIO


def human_bytes(n: float) -> str:
    """``532 B``, ``1.5 KB``, ``2.0 GB`` (binary multiples): the one byte format of progress and tables."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


EXPORTING_PROGRESS = "exporting to "  # + a backend's name: counts exporters
TRACES_PROGRESS = "traces to "  # + a backend's name: counts rollouts sent as traces
# What a progress label counts, by its start; any other label counts bytes (hashing).
UNITS = {EXPORTING_PROGRESS: "exporter", TRACES_PROGRESS: "trace"}


class Progress:
    """A tqdm progress line on stderr (nothing at all off a terminal).

    ``update(label, done, total)`` counts bytes (hashing), except for ``export_run``'s
    ``exporting to <name>`` steps, which count exporters; ``count`` counts items (runs).
    """

    MIN_INTERVAL_S = 0.1

    def __init__(self, stream: TextIO | None = None, enabled: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self._bar: Any = None
        self._kind: tuple[str, int] | None = None

    def update(self, label: str, done: int, total: int) -> None:
        """Bytes: ``done`` of ``total`` bytes of ``label`` (what ``UNITS`` names for the labels
        it knows: exporters, traces)."""
        unit = next((u for prefix, u in UNITS.items() if label.startswith(prefix)), "B")
        self._draw(label, done, total, unit)

    def count(self, label: str, done: int, total: int) -> None:
        """Items: ``done`` of ``total`` (for example runs exported)."""
        self._draw(label, done, total, "run")

    def _draw(self, label: str, done: int, total: int, unit: str) -> None:
        if not self.enabled:
            return
        from tqdm import tqdm

        if self._bar is None or self._kind != (unit, total):
            self.close()
            self._bar = tqdm(
                total=total, unit=unit, unit_scale=unit == "B", unit_divisor=1024, file=self.stream,
                leave=False, dynamic_ncols=True, mininterval=self.MIN_INTERVAL_S, ascii=True,
            )  # fmt: skip
            self._kind = (unit, total)
        self._bar.set_description_str(label[:60], refresh=False)
        self._bar.update(max(0, done - self._bar.n))

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
            self._kind = None
