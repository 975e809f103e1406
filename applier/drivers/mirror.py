"""``mirror``: snapshot the published tables into Delta, then follow the slot, exactly once.

Order of events and why:

1. The slot is created on a replication connection with an exported snapshot, the tables are copied
   under that snapshot (applier.sources.snapshot) and each copy is tagged with the slot's consistent point;
   only then does the state say "streaming". A crash before that keeps the tables whose copy
   finished and copies the others again under a temporary slot's snapshot (``ensure_snapshot``).
2. Changes stream in (START_REPLICATION, or SQL peek in ``read_mode: sql``), are assembled into
   committed transactions and applied in groups, exactly like ``replay``.
3. The server is told a position (standby status update, or ``pg_replication_slot_advance``) only
   after the Delta commits for every transaction up to it exist. A crash anywhere re-sends what was
   not confirmed, and Delta's transaction ids make re-applying it a no-op.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import psycopg

from applier.assembly.feeder import TransactionFeeder
from applier.config import MirrorConfig
from applier.drivers.initial_copy import CopyJob, InitialCopy
from applier.drivers.replay import PendingGroup
from applier.errors import ApplierError, SourceError, TransientSourceError
from applier.infra.crashpoints import crashpoint
from applier.infra.gcpolicy import after_group, collect_between_groups
from applier.lsn import format_lsn, parse_lsn
from applier.protocol.decoder import MessageDecoder
from applier.protocol.replication import PrimaryKeepalive, pg_now
from applier.sink.engine import DeltaApplier, record_messages
from applier.sources import sql_slot
from applier.sources.copy import arrow_types, plan_table
from applier.sources.failures import is_transient
from applier.sources.publication import PublishedTable, published_tables
from applier.sources.snapshot import describe_relation, open_snapshot
from applier.sources.walsender import WalSenderStream
from applier.state import StateDir
from applier.values import RowConverter, spark_schema_for

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


def _slot_row(conn: psycopg.Connection, slot: str) -> tuple[str, str | None] | None:
    row = conn.execute("SELECT plugin, confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                       (slot,)).fetchone()
    return (row[0], row[1]) if row else None


def slot_lost_error(slot: str, sqlstate: str | None, message: str) -> SourceError | None:
    """The error for a slot that was dropped (42704) or invalidated (55000, e.g. max_slot_wal_keep_size
    exceeded) under a running mirror, with the way back; None for other failures."""
    if sqlstate not in ("42704", "55000") or "slot" not in message:
        return None
    return SourceError(
        f"the replication slot can no longer be read ({message.splitlines()[0]}). The changes since the "
        f"last confirmed position are gone from the server, so the tables must be copied again: drop the "
        f"slot if it still exists (SELECT pg_drop_replication_slot('{slot}')) and run mirror again; it "
        "creates the slot, takes a new snapshot and replaces the tables, then follows the stream",
        slot=slot, sqlstate=sqlstate)


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
        self.feeder = TransactionFeeder.from_state(self.state, config.apply)
        self.applier = DeltaApplier(
            spark, config.target.path, tables=config.tables, apply=config.apply, types=self.feeder.types,
            on_schema_change=lambda name, evo: self.progress(
                f"{name}: schema changed (added {list(evo.added)}, widened {list(evo.widened)}, "
                f"dropped {list(evo.dropped)} kept as NULL)"))
        self.decoder = MessageDecoder()
        self.group = PendingGroup(config.apply)
        self.summary = MirrorSummary()
        self._group_since: float | None = None
        self._confirm_to: Callable[[int], None] = lambda _lsn: None  # set by the read mode
        self._last_commit_time: int | None = None  # PG clock, of the last applied transaction

    # --- snapshot -------------------------------------------------------------------------------

    def ensure_snapshot(self) -> None:
        """Create the slot and copy the tables, unless this target already follows the slot.

        A copy that died part-way is resumed when the slot is still at the point the copy was taken
        at: the tables whose final commit carries that point are kept; the others are copied again
        under a temporary slot's snapshot of their own, tagged with that slot's point, and the stream
        (from the main slot's point) skips for them every transaction that snapshot already holds,
        as PostgreSQL's table sync does with its per-table slots."""
        src = self.config.source
        saved = self.state.load("mirror") or {}
        resume_at: int | None = None
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            tables = [t for t in published_tables(conn, src.publication)
                      if self.config.tables.selected(t.qualified_name)]
            slot = _slot_row(conn, src.slot)
            if slot is not None and slot[0] != "pgoutput":
                raise SourceError(f"slot {src.slot!r} uses the {slot[0]!r} plugin, not pgoutput", slot=src.slot)
            if slot is not None and saved.get("slot") == src.slot and saved.get("phase") == "streaming":
                return
            if slot is None and saved.get("slot") == src.slot and saved.get("phase") == "streaming":
                self.progress(f"slot {src.slot} is gone (dropped): the changes after its last confirmed "
                              "position cannot be read any more; taking a new snapshot with a new slot (the "
                              "tables are replaced)")
            if slot is not None and saved.get("slot") == src.slot and saved.get("phase") == "snapshot":
                taken_at = saved.get("snapshot_lsn")
                if taken_at and slot[1] is not None and parse_lsn(slot[1]) == parse_lsn(taken_at):
                    resume_at = parse_lsn(taken_at)
                    self.progress(f"slot {src.slot}: the copy taken at {taken_at} did not finish; keeping the "
                                  "tables it finished and copying the others again")
                else:
                    self.progress(f"slot {src.slot}: the snapshot taken with it did not finish; dropping the "
                                  "slot and starting over")
                    conn.execute("SELECT pg_drop_replication_slot(%s)", (src.slot,))
            elif slot is not None:
                raise SourceError(
                    f"slot {src.slot!r} exists, but this target has no snapshot taken with it, so the Delta "
                    "tables would miss the rows written before the slot's position. Drop the slot "
                    f"(SELECT pg_drop_replication_slot('{src.slot}')) to let mirror create it and copy the "
                    "tables, or use another slot name", slot=src.slot, target=self.config.target.path)
            if src.two_phase and conn.info.server_version < 150000:
                raise SourceError("two_phase needs PostgreSQL 15 or later", slot=src.slot)
        if resume_at is None:
            self.state.save("mirror", {"slot": src.slot, "phase": "snapshot"})
        walsender = WalSenderStream(self.dsn)
        try:
            if resume_at is None:
                created = walsender.create_slot(src.slot, two_phase=src.two_phase, export_snapshot=True)
                # from here on a crash keeps the tables whose copy finished (see the docstring)
                self.state.save("mirror", {"slot": src.slot, "phase": "snapshot",
                                           "snapshot_lsn": format_lsn(created.consistent_point)})
                self.progress(f"slot {src.slot} created at {format_lsn(created.consistent_point)}; copying "
                              f"{len(tables)} tables under its snapshot")
                point = created.consistent_point
            else:
                point = resume_at
                created = walsender.create_slot(f"{src.slot[:50]}_copy_{os.getpid()}", two_phase=False,
                                                export_snapshot=True, temporary=True)
            assert created.snapshot_name is not None
            self._copy_tables(tables, created.snapshot_name, created.consistent_point, resume_at)
        finally:
            walsender.close()
        self.feeder.save(self.state)
        self.state.save("mirror", {"slot": src.slot, "phase": "streaming", "snapshot_lsn": format_lsn(point)})
        self.summary.snapshot_lsn = point

    def _copy_tables(self, tables: list[PublishedTable], snapshot_name: str, lsn: int,
                     resume_at: int | None) -> None:
        """Describe every table under the snapshot and copy the ones that need it (all, or on a resumed
        copy those without a finished copy at ``resume_at``) on ``snapshot.parallelism`` connections."""
        settings = self.config.snapshot
        jobs: list[CopyJob] = []
        with psycopg.connect(self.dsn, autocommit=True) as snap:
            open_snapshot(snap, snapshot_name)
            for table in tables:
                relation, types = describe_relation(snap, table)
                for typ in types:
                    self.feeder.catalog.update_type(typ)
                schema = self.feeder.catalog.update(relation)
                if resume_at is not None:
                    done = self.applier.snapshot_version(table.namespace, table.name)
                    if done is not None and done >= resume_at:
                        self.progress(f"snapshot: {table.qualified_name}: copied before, kept")
                        continue
                    self.progress(f"snapshot: {table.qualified_name}: copying again at {format_lsn(lsn)}")
                converter = RowConverter(schema, self.feeder.types, self.config.apply.special_values)
                plan = plan_table(snap, table, relation, chunk_mb=settings.chunk_mb)
                loader = self.applier.snapshot_loader(schema, lsn, commit_bytes=settings.commit_mb << 20,
                                                      large=plan.bytes >= settings.commit_mb << 20)
                fast = arrow_types(relation, self.feeder.types, spark_schema_for(schema, self.feeder.types))
                jobs.append(CopyJob(table, relation, plan, loader, converter, fast))
            snap.execute("COMMIT")
        copier = InitialCopy(self.dsn, snapshot_name, workers=settings.workers(), progress=self.progress,
                             progress_every=min(self.progress_every, 5.0))
        self.summary.snapshot_rows.update(copier.run(jobs))

    # --- applying -------------------------------------------------------------------------------

    def _feed(self, lsn: int, data: bytes) -> None:
        self.summary.messages += 1
        try:
            completed = self.feeder.feed_raw(self.decoder, lsn, None, data)
        except ApplierError:
            self.flush()  # the transactions before the bad one: every table ends as after the last good one
            raise
        for txn, batches in completed:
            self.group.add(txn, batches)
            self._last_commit_time = txn.commit_time
            if self._group_since is None:
                self._group_since = time.monotonic()
            if self.group.full():
                self.flush()

    def flush(self) -> int | None:
        """Apply the pending group; returns the end LSN now safe to confirm (None if nothing pending)."""
        group = self.group
        if not group.transactions:
            self.feeder.record_skipped(self.spark, self.state)  # a skipped transaction came last
            return None
        end = group.transactions[-1][0]
        self.applier.apply_group(group.transactions)
        if self.config.apply.messages_table:
            record_messages(self.spark, self.config.apply.messages_table, self.feeder.messages, end)
        self.feeder.messages.clear()
        self.feeder.record_skipped(self.spark, self.state)
        for txn in group.committed:
            self.feeder.applied(txn)
        self.summary.transactions += len(group.transactions)
        group.clear()
        self._group_since = None
        after_group()
        self.feeder.save(self.state)
        crashpoint("before_confirm")
        self._confirm_to(end)  # only now: every Delta commit up to ``end`` exists
        self.summary.confirmed_lsn = end
        return end

    def _group_due(self) -> bool:
        return (self._group_since is not None
                and time.monotonic() - self._group_since >= self.config.apply.max_group_seconds)

    def _lag(self, server_lsn: int) -> str:
        applied = self.summary.confirmed_lsn or 0
        behind = max(server_lsn - applied, 0)
        seconds = 0.0
        pending = self.group.transactions or self.feeder.assembler.open_transactions()
        if self._last_commit_time is not None and pending:
            seconds = max((pg_now() - self._last_commit_time) / 1e6, 0.0)
        return (f"applied {format_lsn(applied)}, server at {format_lsn(server_lsn)}: lag {behind} bytes, "
                f"{seconds:.1f}s; {self.summary.transactions} transactions, {self.summary.messages} messages")

    # --- streaming ------------------------------------------------------------------------------

    def run(self, *, once: bool) -> MirrorSummary:
        started = time.monotonic()
        try:
            with collect_between_groups():
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
                self._abandon_session()
                if self.stop.wait(delay):
                    self.summary.stopped_by = "stop requested"
                    return
                self.summary.reconnects += 1

    def _abandon_session(self) -> None:
        """Forget what the lost session delivered but did not get applied: the next session re-sends it
        (staged prepared transactions stay: their Prepare is not re-sent once confirmed)."""
        self.group.clear()  # their buffered changes were released when they joined the group
        self._group_since = None
        self.feeder.messages.clear()
        self.feeder.assembler.session_start()
        self.decoder.reset()
        self._confirm_to = lambda _lsn: None

    def _stream(self, once: bool) -> None:
        src = self.config.source
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            target = sql_slot.current_flush_lsn(conn) if once else None
        stream = WalSenderStream(self.dsn)
        self._confirm_to = stream.confirm
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
                    pending = bool(self.group.transactions)
                    frame = stream.read(0.0 if pending else 0.5)
                    if frame is not None and not isinstance(frame, PrimaryKeepalive):
                        self._feed(frame.wal_start, frame.payload)
                        if self._group_due():
                            self.flush()
                        continue
                    at_target = (target is not None and isinstance(frame, PrimaryKeepalive)
                                 and frame.wal_end >= target)
                    if frame is None or at_target or self._group_due():
                        self.flush()
                    idle = not self.group.transactions and not self.feeder.assembler.open_transactions()
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
                    self.progress(self._lag(stream.server_wal_end))
            else:
                self.summary.stopped_by = "stop requested"
            self.flush()
        finally:
            stream.close()

    def _poll_sql(self, once: bool, *, poll_seconds: float = 1.0, batch_changes: int = 10_000) -> None:
        src = self.config.source
        options = sql_slot.options_for(self.config.source)
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            def advance(end: int) -> None:
                sql_slot.advance(conn, src.slot, end)

            self._confirm_to = advance
            while not self.stop.is_set():
                target = sql_slot.current_flush_lsn(conn)
                committed_before = self.summary.transactions
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
                if self.summary.transactions > committed_before:
                    self.progress(self._lag(target))
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
