"""A one-line progress display for long exports, shown only when stderr is a terminal.

The line is redrawn every second while it is shown, so its elapsed time moves even while the
work it describes reports nothing (a server holding a request, another export's lock): a long
export never looks frozen."""

from __future__ import annotations

import sys
import threading
import time
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
WAITING_PROGRESS = "waiting for another export to "  # + a backend's name and the holder: seconds
# What a progress label counts, by its start; any other label counts bytes (hashing).
UNITS = {EXPORTING_PROGRESS: "exporter", TRACES_PROGRESS: "trace", WAITING_PROGRESS: "s"}


class Progress:
    """A tqdm progress line on stderr (nothing at all off a terminal).

    ``update(label, done, total)`` counts bytes (hashing), except for ``export_run``'s
    ``exporting to <name>`` steps, which count exporters; ``count`` counts items (runs).
    """

    MIN_INTERVAL_S = 0.1
    REDRAW_S = 1.0  # the shown line is redrawn this often, whether or not the work reported

    def __init__(self, stream: TextIO | None = None, enabled: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self._bar: Any = None
        self._kind: tuple[str, int] | None = None
        self._lock = threading.Lock()  # the bar is drawn from the caller's thread and the redrawer
        self._redrawer: threading.Thread | None = None

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

        with self._lock:
            if self._bar is None or self._kind != (unit, total):
                self._close_bar()
                self._bar = tqdm(
                    total=total, unit=unit, unit_scale=unit == "B", unit_divisor=1024, file=self.stream,
                    leave=False, dynamic_ncols=True, mininterval=self.MIN_INTERVAL_S, ascii=True,
                    desc=label[:60],
                )  # fmt: skip
                self._kind = (unit, total)
            if self._bar.desc != label[:60]:
                self._bar.set_description_str(label[:60], refresh=True)
            self._bar.update(max(0, done - self._bar.n))
            if self._redrawer is None or not self._redrawer.is_alive():
                self._redrawer = threading.Thread(target=self._redraw, name="gym-artifacts-progress",
                                                  daemon=True)  # fmt: skip
                self._redrawer.start()

    def _redraw(self) -> None:
        """Redraw the shown line every ``REDRAW_S`` until none is shown."""
        while True:
            with self._lock:
                if self._bar is None:
                    return
                self._bar.refresh()
            time.sleep(self.REDRAW_S)

    def close(self) -> None:
        with self._lock:
            self._close_bar()

    def _close_bar(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
            self._kind = None
