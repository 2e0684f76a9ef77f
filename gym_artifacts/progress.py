"""A one-line progress display for long exports, shown only when stderr is a terminal."""

from __future__ import annotations

import sys
import time
from typing import TextIO


def human_bytes(n: float) -> str:
    """``532 B``, ``1.5 KB``, ``2.0 GB`` (binary multiples): the one byte format of progress and tables."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


class Progress:
    """``update(label, done, total)`` redraws one line; nothing at all off a terminal."""

    WIDTH = 28
    MIN_INTERVAL_S = 0.1

    def __init__(self, stream: TextIO | None = None, enabled: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self._last = 0.0
        self._shown = False

    def update(self, label: str, done: int, total: int) -> None:
        """Bytes: ``done`` of ``total`` bytes of ``label``."""
        self._draw(label, done, total, f"{human_bytes(done)}/{human_bytes(total)}")

    def count(self, label: str, done: int, total: int) -> None:
        """Items: ``done`` of ``total`` (for example runs exported)."""
        self._draw(label, done, total, f"{done:,}/{total:,}")

    def _draw(self, label: str, done: int, total: int, amount: str) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last < self.MIN_INTERVAL_S and done < total:
            return
        self._last = now
        share = done / total if total else 1.0
        filled = int(share * self.WIDTH)
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        line = f"\r[{bar}] {share:4.0%} {amount}  {label[:60]}"
        self.stream.write(line.ljust(110))
        self.stream.flush()
        self._shown = True

    def close(self) -> None:
        if self.enabled and self._shown:
            self.stream.write("\r" + " " * 110 + "\r")
            self.stream.flush()
            self._shown = False
