"""``replay``: rebuild (or bring up to date) Delta tables from a stored raw log.

raw log rows -> the apply loop (applier.loop), in log order. Progress is
reported on long runs; the summary says how many transactions were applied or found already
applied, the rows per table and the LSN reached. Re-running on the same log writes no new Delta
versions: each table's Delta log records the end LSN of the last transaction applied to it.

A log written by ``applier capture`` carries, on each Relation row, what the live catalog said of that
relation as it was stored (applier.sources.catalog_lookup.CatalogNote). The driver path feeds those
notes, in log order, to a ``RecordedCatalog`` that answers the sink's questions as the live catalog
answers a mirror's (was the table that held this name renamed or dropped, which column was renamed),
so the log replays exactly through renames, reused names and drops. A log whose notes show such a
change is replayed on the driver path only (executors.eligibility): there the notes are read in log
order. A log without notes has no catalog to ask, and stops where it cannot tell, as it always did.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from applier.config import ReplayConfig
from applier.drivers.executors.commit import replay_on_executors
from applier.drivers.executors.eligibility import eligibility, log_messages
from applier.drivers.executors.ranges import LogRange, range_messages
from applier.drivers.executors.survey import BackgroundSurvey
from applier.infra.progress import Progress, ProgressReport, count_fields, count_line
from applier.loop import ApplyLoop, ApplyStats
from applier.lsn import format_lsn
from applier.sink.catalogs import CatalogRegistrations
from applier.sources.catalog_lookup import CatalogNote, RecordedCatalog
from applier.sources.rawlog import RawMessage, read_raw_log
from applier.spark.session import SparkLike, SparkProvider, session_of
from applier.state import StateDir

log = logging.getLogger(__name__)


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
    ranges: int = 0  # ranges of the log folded on executors (0: the driver path did it all)

    @classmethod
    def of(cls, stats: ApplyStats) -> ReplaySummary:
        """What the drivers applied, for ``replay`` to report (its time and dry run are its own)."""
        return cls(messages=stats.messages, transactions=stats.transactions, applied=stats.applied,
                   already_applied=stats.already_applied, rows=dict(stats.rows), tables=set(stats.tables),
                   last_end_lsn=stats.last_end_lsn, ranges=stats.ranges)

    def lines(self) -> list[str]:
        applied = ("dry run: nothing written" if self.dry_run
                   else f"applied {self.applied}, already applied {self.already_applied}")
        out = [f"messages: {self.messages}", f"transactions: {self.transactions} ({applied})",
               f"LSN reached: {format_lsn(self.last_end_lsn) if self.last_end_lsn is not None else '-'}",
               f"time: {self.seconds:.1f}s"]
        if self.ranges:
            out.append(f"folded on executors: {self.ranges} ranges of the log")
        out += [f"  {name}: {n} row changes" for name, n in sorted(self.rows.items())]
        return out


def replay_log(spark: SparkLike, config: ReplayConfig, *, progress: Progress | None = None,
               progress_every: float = 10.0, dry_run: Progress | None = None) -> ReplaySummary:
    """Apply the raw log; with ``dry_run``, describe each commit to it and write nothing (no state either).

    Large logs are decoded and folded on Spark's executors (``distributed``, see
    applier.drivers.executors); the rest, and every log that needs it, go through the driver path.
    ``spark``: a started session, or a provider that starts one only when an operation needs it."""
    started = time.monotonic()
    state = StateDir.for_target(config.target.path, config.target.state_dir)
    why_not = on_executors(spark, config, state) if dry_run is None else "--dry-run"
    if why_not is None:
        stats = _replay_on_executors(spark, config, state, progress=progress, progress_every=progress_every)
    else:
        if config.distributed.mode == "on":
            log.warning("replaying on the driver, not on executors: %s", why_not)
        recorded = RecordedCatalog() if dry_run is None else None
        loop = _loop(spark, config, state, progress=progress, dry_run=dry_run, lookup=recorded)
        total = log_messages(config.source_log) if progress is not None else None
        stats = _drive(loop, read_raw_log(config.source_log), recorded, progress=progress,
                       progress_every=progress_every, total=total)
    summary = ReplaySummary.of(stats)
    summary.seconds = time.monotonic() - started
    summary.dry_run = dry_run is not None
    return summary


def on_executors(spark: SparkLike, config: ReplayConfig, state: StateDir) -> str | None:
    """None when the log is to be replayed on executors, else why not (for a log line). Spark's cores
    are asked last: a provider is started only for a log that is otherwise one for executors."""
    settings = config.distributed
    if settings.mode == "off":
        return "distributed.mode is 'off'"
    if settings.mode == "auto" and log_messages(config.source_log) < settings.min_messages:
        return f"the log has fewer than distributed.min_messages ({settings.min_messages}) messages"
    unfit = eligibility(config, state)
    if unfit is not None:
        return unfit
    if settings.mode == "auto" and session_of(spark, "a large log to replay on executors (distributed.mode)") \
            .sparkContext.defaultParallelism < 2:
        return "Spark has one core (distributed.mode 'on' uses executors anyway)"
    return None


def _loop(spark: SparkLike, config: ReplayConfig, state: StateDir, *, progress: Progress | None,
          dry_run: Progress | None = None, catalog: dict[str, Any] | None = None,
          lookup: RecordedCatalog | None = None) -> ApplyLoop:
    """The apply loop over the target; ``lookup``: the catalog the log's notes are recorded into as
    ``_drive`` reads them (None: a loop that reads no notes, or a dry run)."""
    registrations = CatalogRegistrations.for_settings(SparkProvider.of(spark), config.catalog, state)
    return ApplyLoop(spark, config.target.path, apply=config.apply, tables=config.tables, state=state,
                     progress=progress, dry_run=dry_run, catalog_json=catalog, lookup=lookup,
                     registrations=registrations)


def _drive(loop: ApplyLoop, messages: Iterable[RawMessage], recorded: RecordedCatalog | None, *,
           progress: Progress | None, progress_every: float, total: int | None = None) -> ApplyStats:
    """The driver path: every message through the one apply loop, the catalog saved at the end.
    ``total``: the log's messages, for a done fraction and an ETA in the progress lines. A message's
    catalog note is recorded (in ``recorded``, the loop's identity map's lookup; until the log's first
    note it knows nothing) before it is decoded (its Relation's column change is proven against it), and
    its attnums become the relation's baseline once it is."""
    started = last_report = time.monotonic()
    ids = loop.applier.identities
    with loop.running():
        for raw in messages:
            note = CatalogNote.from_json(raw.catalog) if raw.catalog is not None and ids is not None else None
            if note is not None and recorded is not None:
                recorded.record(note)
            loop.feed(raw.lsn, raw.xid, raw.data)
            if note is not None and note.attnums is not None and ids is not None:
                ids.described(note.oid, note.attnums)
            if progress is not None and time.monotonic() - last_report >= progress_every:
                last_report = time.monotonic()
                seconds = last_report - started
                progress(ProgressReport(
                    f"{count_line(loop.messages, total, seconds, 'messages')}, "
                    f"{loop.applier.stats.transactions} transactions, at LSN {format_lsn(raw.lsn)}",
                    {**count_fields("replay", loop.messages, total, seconds, "messages"),
                     "transactions": loop.applier.stats.transactions, "lsn": format_lsn(raw.lsn)}))
        loop.flush()
    loop.save()
    return ApplyStats.of(loop.applier.stats, messages=loop.messages)


def _replay_on_executors(spark: SparkLike, config: ReplayConfig, state: StateDir, *,
                         progress: Progress | None, progress_every: float) -> ApplyStats:
    if progress is not None:
        progress("folding the log on executors while the driver surveys it (order check, catalog, ranges)")
    loop = _loop(spark, config, state, progress=progress)
    ids = loop.applier.identities
    apply = config.apply
    surveying = BackgroundSurvey(config.source_log, state.load("catalog"),
                                 partition_messages=min(config.distributed.partition_messages, apply.max_group_rows),
                                 columns_changed=ids.columns_changed if ids is not None else None,
                                 max_transactions=apply.max_group_transactions,
                                 max_bytes=apply.max_group_bytes_mb << 20)

    def drive(ranges: list[LogRange]) -> ApplyStats:
        recorded = RecordedCatalog()
        rest = _loop(spark, config, state, progress=progress, catalog=ranges[0].catalog, lookup=recorded)
        messages = (raw for r in ranges for raw in range_messages(r))
        return _drive(rest, messages, recorded, progress=progress, progress_every=progress_every)

    session = session_of(spark, "replaying a large log on executors")
    return replay_on_executors(session, config, loop, surveying, progress=progress, progress_every=progress_every,
                               drive=drive)
