"""``mirror``: snapshot the published tables into Delta, then follow the slot, exactly once.

Order of events and why:

1. The slot is created on a replication connection with an exported snapshot, the tables are copied
   under that snapshot (applier.sources.snapshot) and each copy is tagged with the slot's consistent point;
   only then does the state say "streaming". A crash before that drops the slot (nothing consumed
   it) and starts over.
2. Changes stream in (START_REPLICATION, or SQL peek in ``read_mode: sql``), are assembled into
   committed transactions and applied in groups, exactly like ``replay``.
3. The server is told a position (standby status update, or ``pg_replication_slot_advance``) only
   after the Delta commits for every transaction up to it exist. A crash anywhere re-sends what was
   not confirmed, and Delta's transaction ids make re-applying it a no-op.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import psycopg

from applier.config import MirrorConfig
from applier.drivers.follow import FollowStats, ReplicationFollower, SqlFollower
from applier.drivers.tablesync import TableSync
from applier.errors import SourceError, TransientSourceError
from applier.loop import ApplyLoop
from applier.lsn import format_lsn
from applier.sources.failures import is_transient
from applier.sources.publication import published_tables
from applier.sources.slots import slot_info
from applier.sources.snapshot import copy_rows, describe_relation, open_snapshot
from applier.sources.walsender import WalSenderStream
from applier.state import StateDir
from applier.values import RowConverter

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

Progress = Callable[[str], None]


@dataclass
class MirrorSummary:
    snapshot_lsn: int | None = None
    snapshot_rows: dict[str, int] = field(default_factory=dict)
    messages: int = 0
    transactions: int = 0
    rows: dict[str, int] = field(default_factory=dict)
    confirmed_lsn: int | None = None
    seconds: float = 0.0
    stopped_by: str = "end"
    reconnects: int = 0
    synced_rows: dict[str, int] = field(default_factory=dict)  # tables copied after joining the publication

    def lines(self) -> list[str]:
        out = []
        if self.snapshot_lsn is not None:
            out.append(f"snapshot at {format_lsn(self.snapshot_lsn)}: "
                       f"{sum(self.snapshot_rows.values())} rows in {len(self.snapshot_rows)} tables")
        out += [f"messages: {self.messages}", f"transactions applied: {self.transactions}",
                f"confirmed to the server: {format_lsn(self.confirmed_lsn) if self.confirmed_lsn else '-'}",
                f"time: {self.seconds:.1f}s", f"stopped: {self.stopped_by}"]
        if self.reconnects:
            out.append(f"reconnects: {self.reconnects}")
        out += [f"table sync: {name}: {n} rows copied" for name, n in sorted(self.synced_rows.items())]
        out += [f"  {name}: {n} row changes" for name, n in sorted(self.rows.items())]
        return out


class Mirror:
    """One mirror run: the snapshot when the target has none, then the stream."""

    def __init__(self, spark: SparkSession, config: MirrorConfig, *, progress: Progress | None = None,
                 stop: threading.Event | None = None, progress_every: float = 10.0) -> None:
        self.spark = spark
        self.config = config
        self.dsn = config.source.resolved_dsn()
        self.progress: Progress = progress or (lambda _m: None)
        self.stop = stop or threading.Event()
        self.progress_every = progress_every
        self.state = StateDir.for_target(config.target.path, config.target.state_dir)
        self.loop = ApplyLoop(spark, config.target.path, apply=config.apply, tables=config.tables, state=self.state,
                              progress=self.progress, save_catalog_each_group=True)
        self.feeder = self.loop.feeder
        self.applier = self.loop.applier
        self.summary = MirrorSummary()
        self.stats = FollowStats()
        self.tablesync = TableSync(spark, config, self.dsn, self.applier, self.feeder.catalog, self.state,
                                   self.progress)
        self.loop.before_apply = self.tablesync.before_apply
        self._snapshot_recorded = False

    # --- snapshot -------------------------------------------------------------------------------

    def ensure_snapshot(self) -> None:
        """Create the slot and copy the tables, unless this target already follows the slot."""
        src = self.config.source
        saved = self.state.load("mirror") or {}
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            tables = [t for t in published_tables(conn, src.publication)
                      if self.config.tables.selected(t.qualified_name)]
            slot = slot_info(conn, src.slot)
            if slot is not None and slot.plugin != "pgoutput":
                raise SourceError(f"slot {src.slot!r} uses the {slot.plugin!r} plugin, not pgoutput", slot=src.slot)
            if slot is not None and saved.get("slot") == src.slot and saved.get("phase") == "streaming":
                return
            if slot is None and saved.get("slot") == src.slot and saved.get("phase") == "streaming":
                self.progress(f"slot {src.slot} is gone (dropped): the changes after its last confirmed "
                              "position cannot be read any more; taking a new snapshot with a new slot (the "
                              "tables are replaced)")
            if slot is not None and saved.get("slot") == src.slot and saved.get("phase") == "snapshot":
                self.progress(f"slot {src.slot}: the snapshot taken with it did not finish; dropping the slot "
                              "and starting over")
                conn.execute("SELECT pg_drop_replication_slot(%s)", (src.slot,))
            elif slot is not None:
                raise SourceError(
                    f"slot {src.slot!r} exists, but this target has no snapshot taken with it, so the Delta "
                    "tables would miss the rows written before the slot's position. Drop the slot "
                    f"(SELECT pg_drop_replication_slot('{src.slot}')) to let mirror create it and copy the "
                    "tables, or use another slot name", slot=src.slot, target=self.config.target.path)
            if src.two_phase and conn.info.server_version < 150000:
                raise SourceError("two_phase needs PostgreSQL 15 or later", slot=src.slot)
        self.state.save("mirror", {"slot": src.slot, "phase": "snapshot"})
        walsender = WalSenderStream(self.dsn)
        try:
            created = walsender.create_slot(src.slot, two_phase=src.two_phase, export_snapshot=True)
            assert created.snapshot_name is not None
            self.progress(f"slot {src.slot} created at {format_lsn(created.consistent_point)}; copying "
                          f"{len(tables)} tables under its snapshot")
            with psycopg.connect(self.dsn, autocommit=True) as snap:
                open_snapshot(snap, created.snapshot_name)
                for table in tables:
                    relation, types = describe_relation(snap, table)
                    for typ in types:
                        self.feeder.catalog.update_type(typ)
                    schema = self.feeder.catalog.update(relation)
                    converter = RowConverter(schema, self.feeder.types, self.config.apply.special_values)
                    chunks = ([converter.convert(t) for t in batch] for batch in copy_rows(snap, table, relation))
                    n = self.applier.load_snapshot(schema, chunks, created.consistent_point)
                    self.summary.snapshot_rows[table.qualified_name] = n
                    self.progress(f"snapshot: {table.qualified_name}: {n} rows")
                snap.execute("COMMIT")
        finally:
            walsender.close()
        self.feeder.save(self.state)
        self.state.save("mirror", {"slot": src.slot, "phase": "streaming",
                                   "snapshot_lsn": format_lsn(created.consistent_point)})
        self.summary.snapshot_lsn = created.consistent_point

    # --- streaming ------------------------------------------------------------------------------

    def run(self, *, once: bool) -> MirrorSummary:
        started = time.monotonic()
        try:
            with self.loop.running():
                self._run_with_retries(once)
        except KeyboardInterrupt:
            self.stats.stopped_by = "Ctrl-C"
        finally:
            self.summary.messages = self.stats.messages
            self.summary.transactions = self.stats.transactions
            self.summary.confirmed_lsn = self.stats.confirmed_lsn
            self.summary.stopped_by = self.stats.stopped_by
        self.summary.rows = dict(self.applier.stats.rows)
        self.summary.synced_rows = dict(self.tablesync.synced)
        self.summary.seconds = time.monotonic() - started
        return self.summary

    def _run_with_retries(self, once: bool) -> None:
        """Snapshot (when needed) and follow the slot; after a dropped connection or a server restart,
        start a new decoding session from the slot's confirmed position, with backoff, up to
        ``source.max_retries`` attempts per outage. Nothing is lost: the server re-sends every
        transaction not confirmed, and those already in Delta are recognised by their end LSN."""
        attempt = 0
        while True:
            connected_at = time.monotonic()
            try:
                self.ensure_snapshot()
                self._follow_publication()
                kind = ReplicationFollower if self.config.source.read_mode == "replication" else SqlFollower
                kind(self.dsn, self.config.source, self.loop, self.stats, self.stop, self.progress,
                     self.progress_every).run(once)
                return
            except (TransientSourceError, psycopg.OperationalError) as e:
                if not isinstance(e, TransientSourceError) and not is_transient(
                        e.sqlstate, True, str(e)):
                    raise SourceError(f"connection failed: {e}", sqlstate=e.sqlstate) from None
                if time.monotonic() - connected_at > 60:
                    attempt = 0  # a new outage
                attempt += 1
                if attempt > self.config.source.max_retries:
                    raise SourceError(f"giving up after {attempt - 1} reconnect attempts: {e}") from None
                delay = min(2.0 ** (attempt - 1), 30.0)
                self.progress(f"connection lost ({str(e).splitlines()[0]}); reconnecting in {delay:.0f}s "
                              f"(attempt {attempt} of {self.config.source.max_retries})")
                self.loop.abandon_session()
                if self.stop.wait(delay):
                    self.stats.stopped_by = "stop requested"
                    return
                self.summary.reconnects += 1

    def _follow_publication(self) -> None:
        """Record what the snapshot copied (once), then copy tables published since (tablesync)."""
        if self.summary.snapshot_lsn is not None and not self._snapshot_recorded:
            self.tablesync.record_snapshot(list(self.summary.snapshot_rows), self.summary.snapshot_lsn)
            self._snapshot_recorded = True
        self.tablesync.check_publication()
        self.summary.synced_rows = dict(self.tablesync.synced)

def mirror(spark: SparkSession, config: MirrorConfig, *, once: bool = False, progress: Progress | None = None,
           stop: threading.Event | None = None) -> MirrorSummary:
    """Run the mirror (see the module docstring); returns when ``once`` has drained the slot, or on stop."""
    return Mirror(spark, config, progress=progress, stop=stop).run(once=once)
