"""``replay``: rebuild (or bring up to date) Delta tables from a stored raw log.

raw log rows -> the apply loop (applier.loop), in log order. Progress is
reported on long runs; the summary says how many transactions were applied or found already
applied, the rows per table and the LSN reached. Re-running on the same log writes no new Delta
versions: each table's Delta log records the end LSN of the last transaction applied to it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from applier.config import ReplayConfig
from applier.loop import ApplyLoop
from applier.lsn import format_lsn
from applier.sources.rawlog import read_raw_log
from applier.state import StateDir

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass
class ReplaySummary:
    messages: int = 0
    transactions: int = 0
    applied: int = 0
    already_applied: int = 0
    rows: dict[str, int] = field(default_factory=dict)
    tables: set[tuple[str, str]] = field(default_factory=set)
    last_end_lsn: int | None = None
    seconds: float = 0.0
    dry_run: bool = False

    def lines(self) -> list[str]:
        applied = ("dry run: nothing written" if self.dry_run
                   else f"applied {self.applied}, already applied {self.already_applied}")
        out = [f"messages: {self.messages}", f"transactions: {self.transactions} ({applied})",
               f"LSN reached: {format_lsn(self.last_end_lsn) if self.last_end_lsn is not None else '-'}",
               f"time: {self.seconds:.1f}s"]
        out += [f"  {name}: {n} row changes" for name, n in sorted(self.rows.items())]
        return out


def replay_log(spark: SparkSession, config: ReplayConfig, *, progress: Callable[[str], None] | None = None,
               progress_every: float = 10.0, dry_run: Callable[[str], None] | None = None) -> ReplaySummary:
    """Apply the raw log; with ``dry_run``, describe each commit to it and write nothing (no state either)."""
    started = time.monotonic()
    state = StateDir.for_target(config.target.path, config.target.state_dir)
    loop = ApplyLoop(spark, config.target.path, apply=config.apply, tables=config.tables, state=state,
                     progress=progress, dry_run=dry_run)
    last_report = started
    with loop.running():
        for raw in read_raw_log(config.source_log):
            loop.feed(raw.lsn, raw.xid, raw.data)
            if progress is not None and time.monotonic() - last_report >= progress_every:
                last_report = time.monotonic()
                progress(f"{loop.messages} messages, {loop.applier.stats.transactions} transactions, "
                         f"at LSN {format_lsn(raw.lsn)}")
        loop.flush()
    loop.save()
    stats = loop.applier.stats
    return ReplaySummary(
        messages=loop.messages, transactions=stats.transactions, applied=stats.applied,
        already_applied=stats.transactions - stats.applied, rows=dict(stats.rows), tables=set(stats.tables),
        last_end_lsn=stats.last_end_lsn, seconds=time.monotonic() - started, dry_run=dry_run is not None)
