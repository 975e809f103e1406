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
from applier.errors import SourceError, TransientSourceError
from applier.loop import ApplyLoop
from applier.lsn import format_lsn
from applier.protocol.replication import PrimaryKeepalive, pg_now
from applier.sources import sql_slot
from applier.sources.failures import is_transient
from applier.sources.publication import published_tables
from applier.sources.slots import slot_info, slot_lost_error
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

    # --- applying -------------------------------------------------------------------------------

    def flush(self) -> int | None:
        """Apply the pending group (see applier.loop); returns the end LSN now confirmed, if any."""
        end = self.loop.flush()
        self.summary.transactions = self.loop.transactions
        if end is not None:
            self.summary.confirmed_lsn = end
        return end

    def _feed(self, lsn: int, data: bytes) -> None:
        try:
            self.loop.feed(lsn, None, data)
        finally:
            self.summary.messages = self.loop.messages
            self.summary.transactions = self.loop.transactions
            if self.loop.confirmed_lsn is not None:
                self.summary.confirmed_lsn = self.loop.confirmed_lsn

    def _lag(self, server_lsn: int, confirmed_lsn: int | None) -> str:
        """The progress line: what the server has, what it was told, and how far behind that is.
        ``confirmed_lsn`` is the slot's position as this run knows it (applied groups, and idle
        confirmations of WAL that carries nothing for us), so a caught-up mirror says 0."""
        applied = max(confirmed_lsn or 0, self.loop.confirmed_lsn or 0)
        self.summary.confirmed_lsn = applied or None
        behind = max(server_lsn - applied, 0) if applied else None
        seconds = 0.0
        if self.loop.last_commit_time is not None and not self.loop.idle():
            seconds = max((pg_now() - self.loop.last_commit_time) / 1e6, 0.0)
        lag = f"{behind} bytes" if behind is not None else "unknown (nothing confirmed yet)"
        return (f"applied {format_lsn(applied)}, server at {format_lsn(server_lsn)}: lag {lag}, "
                f"{seconds:.1f}s; {self.summary.transactions} transactions, {self.summary.messages} messages")

    # --- streaming ------------------------------------------------------------------------------

    def run(self, *, once: bool) -> MirrorSummary:
        started = time.monotonic()
        try:
            with self.loop.running():
                self._run_with_retries(once)
        except KeyboardInterrupt:
            self.summary.stopped_by = "Ctrl-C"
        self.summary.rows = dict(self.applier.stats.rows)
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
                if self.config.source.read_mode == "replication":
                    self._stream(once)
                else:
                    self._poll_sql(once)
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
                    self.summary.stopped_by = "stop requested"
                    return
                self.summary.reconnects += 1

    def _stream(self, once: bool) -> None:
        src = self.config.source
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            target = sql_slot.current_flush_lsn(conn) if once else None
        stream = WalSenderStream(self.dsn)
        self.loop.confirm = stream.confirm
        try:
            try:
                stream.start(src.slot, sql_slot.options_for(self.config.source))
            except SourceError as e:
                raise slot_lost_error(src.slot, e.sqlstate, str(e)) or e from None
            if target is not None:
                self.progress(f"draining up to {format_lsn(target)}")
            last_report = time.monotonic()
            while not self.stop.is_set():
                try:
                    # With a group pending, only take what has already arrived: when nothing more has,
                    # the backlog is drained and the group is applied at once. So a group holds what
                    # arrived while the previous one was being applied: it grows with the load (and
                    # keeps up with it) and a transaction waits about one apply, not a fixed time.
                    # Not keepalives: under a steady load the walsender sends one each time it catches
                    # up, i.e. after nearly every transaction, even while a backlog is still buffered;
                    # a flush per keepalive made groups of one transaction that fell behind.
                    pending = bool(self.loop.group)
                    frame = stream.read(0.0 if pending else 0.5)
                    if frame is not None and not isinstance(frame, PrimaryKeepalive):
                        self._feed(frame.wal_start, frame.payload)
                        if self.loop.group.due():
                            self.flush()
                        continue
                    at_target = (target is not None and isinstance(frame, PrimaryKeepalive)
                                 and frame.wal_end >= target)
                    if frame is None or at_target or self.loop.group.due():
                        self.flush()
                    idle = self.loop.idle()
                    if idle and frame is not None:
                        stream.confirm(max(stream.confirmed, frame.wal_end))  # nothing of ours is before it
                    if target is not None and idle and isinstance(frame, PrimaryKeepalive) \
                            and frame.wal_end >= target:
                        self.summary.stopped_by = f"--once: reached {format_lsn(target)}"
                        break
                    if frame is None and not pending:  # idle for 0.5 s
                        stream.send_status(reply_requested=True)
                except KeyboardInterrupt:
                    self.flush()
                    raise
                if time.monotonic() - last_report >= self.progress_every:
                    last_report = time.monotonic()
                    self.progress(self._lag(stream.server_wal_end, stream.confirmed))
            else:
                self.summary.stopped_by = "stop requested"
            self.flush()
        finally:
            stream.close()

    def _poll_sql(self, once: bool, *, poll_seconds: float = 1.0, batch_changes: int = 10_000) -> None:
        """Peek, apply, advance. When a peek drained the slot up to the server's flush position and
        nothing is pending (no group, no open streamed transaction), the slot is advanced to that
        position even if nothing in it was ours, as the walsender path confirms keepalives: otherwise
        an idle slot holds back WAL that other databases and unpublished tables keep writing."""
        src = self.config.source
        options = sql_slot.options_for(self.config.source)
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            info = slot_info(conn, src.slot)
            confirmed = info.confirmed_flush_lsn if info is not None else None

            def advance(end: int) -> None:
                nonlocal confirmed
                if confirmed is None or end > confirmed:
                    confirmed = sql_slot.advance(conn, src.slot, end)

            self.loop.confirm = advance
            while not self.stop.is_set():
                target = sql_slot.current_flush_lsn(conn)
                committed_before = self.loop.transactions
                self.feeder.assembler.session_start()  # every peek is a new decoding session
                try:
                    # the peek's rows are fetched before anything is applied (one statement at a time)
                    try:
                        peeked = list(sql_slot.peek(conn, src.slot, options, upto_lsn=target,
                                                    upto_nchanges=batch_changes))
                    except (psycopg.Error, SourceError) as e:
                        lost = slot_lost_error(src.slot, e.sqlstate, str(e))
                        if lost is None:
                            raise
                        raise lost from None
                    for message in peeked:
                        self._feed(message.lsn, message.data)
                finally:
                    self.flush()
                if len(peeked) < batch_changes and self.loop.idle():
                    advance(target)  # drained: nothing of ours is before ``target``
                self.summary.confirmed_lsn = confirmed
                if self.loop.transactions > committed_before:
                    self.progress(self._lag(target, confirmed))
                else:
                    if once:
                        self.summary.stopped_by = f"--once: reached {format_lsn(target)}"
                        return
                    self.stop.wait(poll_seconds)
            self.summary.stopped_by = "stop requested"


def mirror(spark: SparkSession, config: MirrorConfig, *, once: bool = False, progress: Progress | None = None,
           stop: threading.Event | None = None) -> MirrorSummary:
    """Run the mirror (see the module docstring); returns when ``once`` has drained the slot, or on stop."""
    return Mirror(spark, config, progress=progress, stop=stop).run(once=once)
