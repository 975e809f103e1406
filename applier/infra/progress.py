"""How far a long piece of work is and when it ends, for the progress lines of the catch-ups.

Why one helper: the initial copy, the catch-up on the driver and the catch-up on executors all say
"x of y, rate, ETA"; an on-call engineer reads the same fields in each (and a JSON log carries them
in the message alike).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

#: Where a run's progress lines go (the command prints them, a test collects them): one line at a time,
#: a ProgressReport when the line carries its numbers. The one definition every driver and the loop use.
Progress = Callable[[str], None]


class ProgressReport(str):
    """A progress line that also carries its numbers: a plain ``str`` to every progress callback (so
    callers that print or join it need nothing new), and ``fields`` for whoever knows to look — the
    JSON log format adds them as ``"progress": {...}`` and a terminal draws a live bar from ``done`` and
    ``total`` (applier.commands.logsetup)."""

    fields: dict[str, Any]

    def __new__(cls, text: str, fields: dict[str, Any]) -> ProgressReport:
        report = super().__new__(cls, text)
        report.fields = fields
        return report


def count_fields(task: str, done: int, total: int | None, seconds: float, unit: str) -> dict[str, Any]:
    """The numbers of :func:`count_line` as fields: task, done, total, unit, rate per second, ETA seconds."""
    rate = done / seconds if seconds > 0 else 0.0
    eta = (total - done) / rate if total and total > done and rate > 0 else None
    return {"task": task, "done": done, "total": total or None, "unit": unit, "rate_per_s": round(rate, 1),
            "eta_seconds": round(eta, 1) if eta is not None else None, "elapsed_seconds": round(seconds, 1)}


def byte_size(n: float) -> str:
    """``1.2 GB``-style sizes (binary units, one decimal)."""
    value, unit = float(n), "B"
    for bigger in ("kB", "MB", "GB", "TB"):
        if abs(value) < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"


class Backlog:
    """A backlog of WAL bytes being worked down: remembers where it started, and says how much of it is
    done, at what rate, and when it ends at that rate (the server may add WAL meanwhile: the rate is
    the net one, so the ETA is honest about a mirror that does not catch up)."""

    def __init__(self, behind: int, *, clock: float | None = None) -> None:
        self.start_behind = max(behind, 0)
        self.started = time.monotonic() if clock is None else clock

    def fields(self, behind: int, *, clock: float | None = None) -> dict[str, Any]:
        """The numbers of :meth:`line` (bytes): done and total of the backlog, net rate, ETA."""
        now = time.monotonic() if clock is None else clock
        seconds = now - self.started
        behind = max(behind, 0)
        worked = min(max(self.start_behind - behind, 0), self.start_behind)
        rate = (self.start_behind - behind) / seconds if seconds > 0 else 0.0
        eta = behind / rate if behind and rate > 0 else None
        return {"task": "catch-up", "done": worked, "total": self.start_behind or None, "unit": "bytes",
                "behind_bytes": behind, "rate_per_s": round(rate, 1),
                "eta_seconds": round(eta, 1) if eta is not None else None, "elapsed_seconds": round(seconds, 1)}

    def line(self, behind: int, *, clock: float | None = None) -> str:
        now = time.monotonic() if clock is None else clock
        seconds = now - self.started
        behind = max(behind, 0)
        worked = self.start_behind - behind
        if behind == 0:
            return "caught up"
        if seconds <= 0 or self.start_behind == 0:
            return f"{byte_size(behind)} behind"
        rate = worked / seconds
        done = f"{min(max(worked / self.start_behind, 0.0), 1.0):.0%} of {byte_size(self.start_behind)} done"
        if rate <= 0:
            return f"{byte_size(behind)} behind, {done}, not catching up (the server writes faster than we apply)"
        return f"{byte_size(behind)} behind, {done}, {byte_size(rate)}/s, ETA {behind / rate:.0f}s"


def count_line(done: int, total: int | None, seconds: float, unit: str, *, estimate: bool = False) -> str:
    """``1,200 rows of ~40,000 (3%), 600 rows/s, ETA 65s``: a count against a known (or, with ``estimate``,
    estimated) total; without a total only the count and the rate."""
    rate = done / seconds if seconds > 0 else 0.0
    line = f"{done:,} {unit}"
    if total:
        line += f" of {'~' if estimate else ''}{total:,} ({min(done / total, 1.0):.0%})"
    line += f", {rate:,.0f} {unit}/s"
    if total and total > done and rate > 0:
        line += f", ETA {(total - done) / rate:.0f}s"
    return line
