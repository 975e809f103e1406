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

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg

from applier.assembly.staging import PreparedStore
from applier.config import MirrorConfig
from applier.drivers.backlog import catch_up_eligibility, catch_up_on_executors, folds_on_driver
from applier.drivers.follow import FollowStats, ReplicationFollower, SlotFollower, SqlFollower
from applier.drivers.initial_copy import copy_tables, executor_chunks
from applier.drivers.resync import MAX_AUTOMATIC_RESYNCS, resync_after_schema_change, set_aside
from applier.drivers.tablesync import REPORT_EVERY_SECONDS, TableSync
from applier.errors import ApplierError, ConfigError, ResyncNeededError, SourceError, TransientSourceError
from applier.infra.progress import Progress
from applier.infra.stateformat import upgrade as upgrade_state
from applier.infra.stops import clear_stops, last_stops, record_mend, record_stop
from applier.loop import ApplyLoop
from applier.lsn import format_lsn, parse_lsn
from applier.sink.catalogs import CatalogRegistrations
from applier.sink.fold import FoldedTable
from applier.sink.identity import IdentityError
from applier.sink.parking import ParkedTables
from applier.sources import sql_slot
from applier.sources.catalog_lookup import LiveCatalog
from applier.sources.failures import is_transient
from applier.sources.publication import (
    PublishedTable,
    check_readable,
    check_rule_columns,
    partial_publication_note,
    published_tables,
    warn_unmatched_includes,
)
from applier.sources.serverneeds import check_server_serves
from applier.sources.slotcopy import FETCHED_BUDGET_DIVISOR, SlotCopyReader, SlotCopyUnavailable
from applier.sources.slothealth import read_slot_health
from applier.sources.slots import (
    check_usable,
    open_phrase,
    prepared_phrase,
    slot_creation_blockers,
    slot_info,
    standby_slot_wait,
)
from applier.sources.syncslot import SyncSlot
from applier.sources.walsender import CreatedSlot, WalSenderStream
from applier.spark.session import SparkLike, SparkProvider
from applier.state import StateDir

if TYPE_CHECKING:
    from applier.catalog.batches import GroupedTransactions
    from applier.infra.metrics import MetricsServer, MirrorMetrics
    from applier.sink.maintenance import MaintenanceSchedule

log = logging.getLogger(__name__)

#: creating the mirror's slot: the first line on what it waits for comes after this, then every
#: REPORT_EVERY_SECONDS (a slot normally exists within a second)
SLOT_FIRST_REPORT_SECONDS = 5.0


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


class UnrecordedSlotError(ConfigError, SourceError):
    """The configured slot exists but this target's state never snapshotted with it (another state
    directory, an old one restored, or a slot made by hand): exit 2, since a restart meets the same
    state and the same slot; the message says which setting or drop fixes it."""


class Mirror:
    """One mirror run: the snapshot when the target has none, then the stream."""

    def __init__(self, spark: SparkLike, config: MirrorConfig, *, progress: Progress | None = None,
                 stop: threading.Event | None = None, progress_every: float = 10.0) -> None:
        self.spark = SparkProvider.of(spark)  # started by the first operation that needs Spark
        self.config = config
        self.dsn = config.source.resolved_dsn()
        self.progress: Progress = progress or (lambda _m: None)
        self.stop = stop or threading.Event()
        self.progress_every = progress_every
        self.state = StateDir.for_target(config.target.path, config.target.state_dir)
        upgrade_state(self.state, "mirror")  # a no-op under target_writer; a newer state: exit 2 (stateformat.py)
        self.parked = ParkedTables(self.state)
        #: the numbers /metrics serves (metrics.port), made here and served by ``run``; None: not served
        self.metrics: MirrorMetrics | None = None
        if config.metrics.port is not None:
            from applier.infra.metrics import MirrorMetrics  # noqa: F811

            self.metrics = MirrorMetrics(stall_seconds=config.metrics.stall_seconds)
        #: the live catalog tells renames from new tables (the identity map asks it), and a stop's relations
        #: dropped since from live ones (``_gone_relations``); its one connection is closed when ``run`` ends
        self.live_catalog = LiveCatalog(self.dsn)
        # the loop's hooks are this mirror's own methods: they call the table sync and the maintenance,
        # which are made after the loop, from its applier and catalog
        self.loop = ApplyLoop(self.spark, config.target.path, apply=config.apply, tables=config.tables,
                              state=self.state, progress=self.progress, save_catalog_each_group=True,
                              lookup=self.live_catalog,
                              before_apply=self._before_apply, parked=self.parked, when_idle=self._idle,
                              metrics=self.metrics, registrations=CatalogRegistrations.for_settings(
                                  # the tables this mirror follows now: the table sync's, made after the loop
                                  self.spark, config.catalog, self.state,
                                  followed=lambda name: self.tablesync.follows(name)))
        self.feeder = self.loop.feeder
        self.applier = self.loop.applier
        self.summary = MirrorSummary()
        self.stats = FollowStats()
        self.tablesync = TableSync(self.spark, config, self.dsn, self.applier, self.feeder.catalog, self.state,
                                   self.progress, on_copy_rows=self.metrics.copied if self.metrics else None,
                                   on_waits=self.metrics.sync_waits if self.metrics else None)
        self.maintenance: MaintenanceSchedule | None = None
        if config.maintenance.every_minutes is not None:  # compaction, VACUUM, checkpoints while idle
            from applier.sink.maintenance import MaintenanceSchedule, TableMaintainer  # noqa: F811

            self.maintenance = MaintenanceSchedule(TableMaintainer(config.maintenance, self.spark,
                                                                   progress=self.progress),
                                                   config.target.path, config.maintenance.every_minutes * 60)
        self._snapshot_recorded = False
        self._includes_checked = False  # tables.include globs that match nothing: warned once per run
        self._snapshot_tables: list[str] = []  # what the initial copy covered (kept or copied)
        self.metrics_port: int | None = None  # where /metrics is served (metrics.port 0: the free port taken)

    def _before_apply(self, group: GroupedTransactions) -> None:
        """The loop's ``before_apply``: tables that joined the publication are copied first."""
        self.tablesync.before_apply(group)

    def _idle(self) -> None:
        """The loop's ``when_idle``: a table sync whose slot now exists, then maintenance when due."""
        self.tablesync.tick()
        if self.maintenance is not None:
            self.maintenance.tick()

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
            check_server_serves(conn, src)  # before any slot: protocol 4 on 15 is exit 2, not 3 at every start
            published = published_tables(conn, src.publication)
            if not self._includes_checked:  # once per run, not once per reconnection
                warn_unmatched_includes(published, src.publication, self.config.tables, log.warning)
                if (partial := partial_publication_note(conn, src.publication)) is not None:
                    log.warning("%s", partial)
                self._includes_checked = True
            tables = [t for t in published if self.config.tables.selected(t.qualified_name)]
            slot = slot_info(conn, src.slot)
            if slot is not None:
                check_usable(src.slot, slot)
            if src.failover:
                self._ensure_failover(conn, slot is not None)
            if slot is not None and saved.get("slot") == src.slot and saved.get("phase") == "streaming":
                return
            if slot is None and saved.get("slot") == src.slot and saved.get("phase") == "streaming":
                self.progress(f"slot {src.slot} is gone (dropped): the changes after its last confirmed "
                              "position cannot be read any more; taking a new snapshot with a new slot (the "
                              "tables are replaced)")
            old = saved.get("slot")
            if old and old != src.slot:
                held = slot_info(conn, str(old))
                log.warning("this target was mirrored with slot %s, and now slot %s is configured: every table is "
                            "copied again under the new slot%s", old, src.slot,
                            f"; slot {old} still exists and keeps WAL on the server for as long as it does: drop it "
                            f"if nothing else reads it (SELECT pg_drop_replication_slot('{old}'))"
                            if held is not None else "")
            if slot is not None and saved.get("slot") == src.slot and saved.get("phase") == "snapshot":
                taken_at = saved.get("snapshot_lsn")
                if taken_at and slot.confirmed_flush_lsn == parse_lsn(taken_at):
                    resume_at = parse_lsn(taken_at)
                    self.progress(f"slot {src.slot}: the copy taken at {taken_at} did not finish; keeping the "
                                  "tables it finished and copying the others again")
                else:
                    self.progress(f"slot {src.slot}: the snapshot taken with it did not finish; dropping the "
                                  "slot and starting over")
                    conn.execute("SELECT pg_drop_replication_slot(%s)", (src.slot,))
            elif slot is not None:
                raise UnrecordedSlotError(
                    f"slot {src.slot!r} exists, but the state directory this run uses ({self.state.root}) has no "
                    "record of a snapshot taken with it, so the Delta tables could miss the rows written before "
                    "the slot's position. If this target was mirrored with another state directory (target."
                    "state_dir; an s3:// or other object-store target keeps its state in a local directory of "
                    "the machine that ran it), point target.state_dir at that one. Otherwise drop the slot "
                    f"(SELECT pg_drop_replication_slot('{src.slot}')) to let mirror create it and copy the "
                    "tables, or use another slot name", slot=src.slot, target=self.config.target.path,
                    state_dir=str(self.state.root))
            check_rule_columns(conn, tables, self.config.tables)  # before any slot: a wrong rule is exit 2
            check_readable(conn, tables)  # and so is a table this role cannot read
            if src.two_phase and conn.info.server_version < 150000:
                raise SourceError("two_phase needs PostgreSQL 15 or later", slot=src.slot)
        if resume_at is None:
            self.state.save("mirror", {"slot": src.slot, "phase": "snapshot"})
        if resume_at is None:
            maker = SyncSlot(self.dsn, src.slot, temporary=False, two_phase=src.two_phase, failover=src.failover)
        else:
            maker = SyncSlot(self.dsn, f"{src.slot[:50]}_copy_{os.getpid()}")
        try:
            created = self._slot_created(maker)
            if resume_at is None:
                PreparedStore(self.state.staging_dir).cover(src.slot, created.consistent_point)  # issue 30 item 5
                # from here on a crash keeps the tables whose copy finished (see the docstring)
                self.state.save("mirror", {"slot": src.slot, "phase": "snapshot",
                                           "snapshot_lsn": format_lsn(created.consistent_point)})
                self.progress(f"slot {src.slot} created at {format_lsn(created.consistent_point)}; copying "
                              f"{len(tables)} tables under its snapshot")
                point = created.consistent_point
            else:
                point = resume_at
            assert created.snapshot_name is not None
            self._copy_tables(tables, created.snapshot_name, created.consistent_point, resume_at)
        finally:
            maker.close()  # a creation still waiting is cancelled: no walsender is left to block the next run
        # the copied tables hold exactly the source as of the snapshot: a reader has a cut before any group
        # (a table a resumed copy took at a later snapshot is ahead of it, and left out until a later cut;
        # a crash before the phase below is saved resumes the copy, which finds this cut recorded)
        self.loop.record_cut(point, None)
        self.feeder.save(self.state)
        self.state.save("mirror", {"slot": src.slot, "phase": "streaming", "snapshot_lsn": format_lsn(point)})
        self.summary.snapshot_lsn = point
        self._snapshot_tables = [t.qualified_name for t in tables]

    def _mend(self, error: ApplierError) -> bool:
        """A table that cannot follow the stream past this point, mended without a person where that is exact;
        False: the run stops on it. A relation Postgres has dropped since (the error's, or the one holding
        its path), whatever the error's class (a retype of a table dropped since, DroppedTypeChangeError, is
        no ResyncNeededError), has nothing to copy and its changes still in the stream are moot: it is set
        aside for good (its Delta table retired), whatever the policy but ``schema_changes: stop``, so that a
        gone table is never what blocks the others. Else only a table a fresh copy mends (ResyncNeededError,
        IdentityError): ``schema_changes: resync`` (the default) copies it again at a new position, and
        ``on_table_error: park`` parks it; any other error stops the run as it did. Each is logged as a
        warning, counted in the metrics, and recorded for ``applier status`` (applier.infra.stops.record_mend)."""
        settings, context = self.config.apply, error.context
        first_line = (str(error).splitlines()[0] if str(error) else type(error).__name__).split(". ")[0]
        gone = self._gone_relations(error) if settings.schema_changes != "stop" else {}
        if gone:
            self.loop.abandon_session()
            set_aside(self.tablesync, gone, first_line[:300], self.parked)
            how = "set aside: dropped in Postgres"
            kind = "set_aside"
        elif not isinstance(error, (ResyncNeededError, IdentityError)):
            return False
        elif settings.schema_changes == "resync" and (context.get("table") or context.get("relation_oid")):
            self.loop.abandon_session()
            resync_after_schema_change(self.tablesync, error)
            self.parked.reload()  # (a copy un-parks its table through a record of its own)
            how, kind = "copied again", "resync"
        elif settings.on_table_error == "park" and context.get("table"):
            self._park(str(context["table"]), error)
            return True  # (counted and said by _park)
        else:
            return False
        if self.loop.metrics is not None:
            self.loop.metrics.error(kind)
        names = ", ".join(f"{name} (relation OID {oid})" for name, oid in gone.items()) if gone \
            else self._named(context)
        record_mend(self.state, names, how, first_line)
        return True

    def _named(self, context: dict[str, Any]) -> str:
        """The table an error's ``context`` is about, as a mend record names it: ``schema.table (relation OID
        n)``, the OID from the bound identities when the error did not carry one, and left out when neither
        knows it (a record that says "relation OID None" sends a reader looking for a relation that never was)."""
        table, oid = context.get("table"), context.get("relation_oid")
        if oid is None and table and self.applier.identities is not None:
            bound = self.applier.identities.bound_by_name(str(table))
            oid = bound.oid if bound is not None else None
        if not table:
            return f"relation OID {oid}" if oid is not None else "a table the error does not name"
        return f"{table} (relation OID {oid})" if oid is not None else str(table)

    def _gone_relations(self, error: ApplierError) -> dict[str, int]:
        """Of the relations ``error`` names (its own, and one holding the Delta path it wants), those Postgres
        no longer has: name -> OID. Empty when Postgres cannot be asked (a stop for any error with a relation
        in its context asks, and an unreachable server must not hide the error itself behind its own)."""
        context = error.context
        oids: dict[int, str] = {}
        for key, name_key in (("relation_oid", "table"), ("held_by_oid", None)):
            oid = context.get(key)
            if oid is None:
                continue
            bound = self.applier.identities.bound(int(oid)) if self.applier.identities is not None else None
            name = (str(context.get(name_key)) if name_key and context.get(name_key) else None) \
                or (bound.name if bound is not None else str(oid))
            oids[int(oid)] = name
        if not oids:
            return {}
        try:
            exists = self.live_catalog.existing(oids)
        except psycopg.Error as e:  # the error stands as it is: the stop says what it is about, not this
            log.warning("could not ask Postgres whether %s still exist(s), so nothing is set aside: %s",
                        ", ".join(f"{name} (relation OID {oid})" for oid, name in oids.items()),
                        str(e).splitlines()[0] if str(e) else type(e).__name__)
            return {}
        return {name: oid for oid, name in oids.items() if oid not in exists}

    def _park(self, table: str, error: ApplierError) -> None:
        """apply.on_table_error: park - set ``table`` aside and go on with the others from the slot (the
        group that failed was not confirmed: its other tables' commits are recognised by their end LSN)."""
        oid = error.context.get("relation_oid")  # the relation the error is about, whatever its name is now
        if oid is None and self.applier.identities is not None:
            bound = self.applier.identities.bound_by_name(table)
            oid = bound.oid if bound is not None else None
        self.loop.abandon_session()
        self.parked.park(table, oid, error)
        log.warning("%s is PARKED (apply.on_table_error: park): %s. Its changes are left out from now on and the "
                    "other tables go on; `applier resync --table %s` copies it again and brings it back",
                    table, str(error).splitlines()[0], table)
        if self.loop.metrics is not None:
            self.loop.metrics.error("park")
            self.loop.metrics.parked.set(len(self.parked))

    def _slot_created(self, maker: SyncSlot) -> CreatedSlot:
        """Wait for ``maker``'s slot. Creating a logical slot waits for every transaction open on the server,
        prepared ones too, which may wait for a user for days: every ``REPORT_EVERY_SECONDS`` (and after the
        first few seconds) this says which ones; Ctrl-C (the mirror's stop) ends the wait, and the caller
        cancels the creation."""
        waited = 0.0
        while True:
            step = SLOT_FIRST_REPORT_SECONDS if waited == 0.0 else REPORT_EVERY_SECONDS
            # short waits: the stop flag (Ctrl-C) is looked at at least once a second
            deadline = time.monotonic() + step
            while time.monotonic() < deadline:
                created = maker.created(min(1.0, max(deadline - time.monotonic(), 0.0)))
                if created is not None:
                    return created
                if self.stop.is_set():  # as a second Ctrl-C would: the caller cancels the creation
                    self.progress(f"stopped while creating slot {maker.name}: nothing was created or copied")
                    raise KeyboardInterrupt
            waited += step
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                gids, running = slot_creation_blockers(conn)
                standby = standby_slot_wait(conn)  # a standby's slot waits for the primary's snapshot record
            what = "; ".join(filter(None, [
                f"{prepared_phrase(gids)}: COMMIT PREPARED or ROLLBACK PREPARED them" if gids else "",
                f"{open_phrase(running)} to end" if running else "", standby or ""])) \
                or "transactions that were open when it began"
            self.progress(f"creating slot {maker.name} has waited {waited:.0f}s for {what} (Ctrl-C stops)")

    def _ensure_failover(self, conn: psycopg.Connection, exists: bool) -> None:
        """``source.failover``: PostgreSQL 17+ only; a slot created without it is altered (no one reads
        it now: the mirror has not started the stream)."""
        src = self.config.source
        if conn.info.server_version < 170000:
            raise ConfigError(f"source.failover needs PostgreSQL 17 or later (failover slots); this server is "
                              f"{conn.info.server_version // 10000}: remove failover from the config",
                              slot=src.slot)
        health = read_slot_health(conn, src.slot) if exists else None
        if health is not None and health.failover is False:
            walsender = WalSenderStream(self.dsn)
            try:
                walsender.set_failover(src.slot, True)
            finally:
                walsender.close()
            self.progress(f"slot {src.slot}: failover enabled (standbys with sync_replication_slots keep a copy)")

    def _copy_tables(self, tables: list[PublishedTable], snapshot_name: str, lsn: int,
                     resume_at: int | None) -> None:
        """Describe every table under the snapshot and copy the ones that need it (all, or on a resumed
        copy those without a finished copy at ``resume_at``) on ``snapshot.parallelism`` connections."""
        def copied_before(table: PublishedTable) -> bool:
            if resume_at is None:
                return False
            done = self.applier.snapshot_version(table.namespace, table.name)
            if done is not None and done >= resume_at:
                self.progress(f"snapshot: {table.qualified_name}: copied before, kept")
                return True
            self.progress(f"snapshot: {table.qualified_name}: copying again at {format_lsn(lsn)}")
            return False

        metrics = self.loop.metrics
        rows = copy_tables(self.dsn, snapshot_name, tables, applier=self.applier, catalog=self.feeder.catalog,
                           lsn=lsn, settings=self.config.snapshot, special_values=self.config.apply.special_values,
                           progress=self.progress, progress_every=min(self.progress_every, 5.0), skip=copied_before,
                           on_rows=metrics.copied if metrics is not None else None,
                           executor_chunks=executor_chunks(self.config))
        self.summary.snapshot_rows.update(rows)

    # --- streaming ------------------------------------------------------------------------------

    def run(self, *, once: bool) -> MirrorSummary:
        started = time.monotonic()
        server = self._serve_metrics()
        try:
            with self.loop.running():
                try:
                    self._run_with_retries(once)
                    if self.loop.registrations is not None:  # a table synced with no group after it
                        self.loop.registrations.sync(self.applier)
                finally:
                    self.tablesync.close()  # a copy still waiting for its slot is left to the next run
        except KeyboardInterrupt:
            self.stats.stopped_by = "Ctrl-C"
        except Exception as e:
            runs = record_stop(self.state, e)
            if runs > 1:
                log.warning("this mirror has stopped on this error %d runs in a row (since %s): running it again "
                            "will not get past it; the error says what will", runs, last_stops(self.state)["since"])
            raise
        else:
            clear_stops(self.state)
        finally:
            # its connection would otherwise live as long as this object: one more a run in a process that runs
            # the mirror again (a test, a soak), where the collector is off during the loop (infra.gcpolicy)
            self.live_catalog.close()
            if server is not None:
                server.close()
            self.summary.messages = self.stats.messages
            self.summary.transactions = self.stats.transactions
            self.summary.confirmed_lsn = self.stats.confirmed_lsn
            self.summary.stopped_by = self.stats.stopped_by
        self.summary.rows = dict(self.applier.stats.rows)
        self.summary.synced_rows = dict(self.tablesync.synced)
        self.summary.seconds = time.monotonic() - started
        return self.summary

    def _serve_metrics(self) -> MetricsServer | None:
        """``metrics.port``: /metrics and /healthz for this run (applier.infra.metrics)."""
        settings = self.config.metrics
        if settings.port is None:
            return None
        from applier.infra.metrics import serve_metrics

        server = serve_metrics(settings.port, settings.host, self.progress, stall_seconds=settings.stall_seconds,
                               metrics=self.metrics, status=self._status_json)
        server.metrics.consecutive_stops.set(int(last_stops(self.state).get("count", 0)))
        server.metrics.parked.set(len(self.parked))
        self.metrics_port = server.port
        return server

    def _status_json(self) -> str:
        """The status page's data: ``applier status --json`` for this run's target and slot, with the
        tables it follows that a rule puts elsewhere (read on the server's thread: a binding made at that
        moment can fail one answer, which the page shows until its next refresh)."""
        from applier.checks.status import gather_status
        from applier.storage.paths import location

        src = self.config.source
        ids = self.applier.identities
        followed = [location(b.path) for b in ids.live()] if ids is not None else []
        return gather_status(str(self.config.target.path), self.state, dsn=self.dsn, slot=src.slot,
                             warn_below=src.wal_warning_bytes, paths=followed).as_json()

    def _run_with_retries(self, once: bool) -> None:
        """Snapshot (when needed) and follow the slot; after a dropped connection or a server restart,
        start a new decoding session from the slot's confirmed position, with backoff, up to
        ``source.max_retries`` attempts per outage. Nothing is lost: the server re-sends every
        transaction not confirmed, and those already in Delta are recognised by their end LSN."""
        attempt = resyncs = 0
        while True:
            connected_at = time.monotonic()
            try:
                self.ensure_snapshot()
                self._follow_publication()
                follower: SlotFollower
                if self.config.source.read_mode == "replication":
                    behind_bytes = round(self.config.distributed.follow_backlog_mb * (1 << 20))
                    follower = ReplicationFollower(self.dsn, self.config.source, self.loop, self.stats, self.stop,
                                                   self.progress, self.progress_every, catch_up=self._catch_up,
                                                   copy_catch_up=self._catch_up_from_copy,
                                                   follow_backlog_bytes=behind_bytes)
                else:
                    follower = SqlFollower(self.dsn, self.config.source, self.loop, self.stats, self.stop,
                                           self.progress, self.progress_every)
                follower.run(once)
                if once:  # the stream is drained: tables whose copy waits for its slot still hold changes
                    self.tablesync.wait_for_copies(self.stop, confirmed=self.stats.confirmed_lsn)
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
                if self.loop.metrics is not None:
                    self.loop.metrics.error("reconnect")
                if self.stop.wait(delay):
                    self.stats.stopped_by = "stop requested"
                    return
                self.summary.reconnects += 1
            except ApplierError as e:  # mended (see _mend), then on from the slot, as after a reconnect; else a stop
                resyncs += 1
                if resyncs > MAX_AUTOMATIC_RESYNCS or not self._mend(e):
                    raise

    def _catch_up(self, stream: WalSenderStream, flush: int, backlog: int,
                  feed: Callable[[int, bytes], None], *, following: bool = False,
                  until: float | None = None) -> bool:
        """A large backlog is caught up in ranges (applier.drivers.backlog), the rest of the stream
        followed on the driver; ``following``: the follower fell behind (distributed.follow_backlog_mb);
        ``until``: a round of the follower's, read as the stream brings it until that instant.
        False when the backlog is not one for ranges."""
        why_not = catch_up_eligibility(self.spark, self.config, self.loop, backlog, following=following)
        if why_not is not None:
            if self.config.distributed.mode == "on":
                log.warning("catching up on the driver, not on executors: %s", why_not)
            return False
        where, size = self._catch_up_phrases(backlog)
        what = f"{size} behind while following" if following else f"backlog of {size}"
        if until is None:
            self.progress(f"{what}: catching up to {format_lsn(flush)} {where}")
        else:
            self.progress(f"{what}: a round of up to {max(until - time.monotonic(), 0.0):.1f} s, read as the "
                          f"stream brings it, {where}")
        catch_up_on_executors(self.spark, self.config, self.loop, stream, flush, feed=feed,
                              may_commit=self._may_commit, progress=self.progress,
                              progress_every=self.progress_every, backlog=backlog, until=until)
        return True

    def _catch_up_phrases(self, backlog: int) -> tuple[str, str]:
        """Where a catch-up folds, and the backlog's size, for its first line (rounds go on from 64 kB)."""
        where = "in ranges folded on the driver" if folds_on_driver(self.config) else "on Spark's executors"
        size = f"{backlog >> 20} MiB" if backlog >= 1 << 20 else f"{backlog >> 10} kB"
        return where, size

    def _catch_up_from_copy(self, flush: int, backlog: int, feed: Callable[[int, bytes], None]) -> int | None:
        """The backlog at the start, before the walsender starts: read from a temporary copy of the slot
        (applier.sources.slotcopy; ``distributed.backlog_reader``) and caught up in ranges, then the slot
        advanced. Returns the slot's new position (every transaction committed before it is in Delta), or
        None when this backlog is not read this way (the walsender then reads it).

        The commits' confirmations are only recorded while it reads: the slot is not being read, and is
        advanced once, at the end (a crash before re-reads the backlog, and each table recognises what it
        applied by the end LSN its commits record). What the driver path was fed is applied first; a
        copy read to ``flush`` has left nothing open (no streaming: applier.sources.slotcopy), so the slot
        goes to ``flush`` itself, and a drain (``--once``) is done."""
        src = self.config.source
        if self.config.distributed.backlog_reader != "auto" or src.two_phase:
            return None
        why_not = catch_up_eligibility(self.spark, self.config, self.loop, backlog)
        if why_not is not None:
            return None  # (the walsender's catch-up says why, when it is asked)
        try:
            reader = SlotCopyReader(self.dsn, src.slot, sql_slot.options_for(src), target=flush,
                                    queued_bytes=(self.config.apply.memory_budget_mb << 20) // FETCHED_BUDGET_DIVISOR)
        except SlotCopyUnavailable as e:
            self.progress(f"reading the backlog from the walsender: {e}")
            return None
        where, size = self._catch_up_phrases(backlog)
        self.progress(f"backlog of {size}: catching up to {format_lsn(flush)} {where}, read from a temporary "
                      f"copy of slot {src.slot}")
        committed: list[int] = []
        self.loop.confirm = committed.append
        try:
            catch_up_on_executors(self.spark, self.config, self.loop, reader, flush, feed=feed,
                                  may_commit=self._may_commit, progress=self.progress,
                                  progress_every=self.progress_every, backlog=backlog)
            self.loop.flush()  # what the driver path was fed
            exhausted = reader.exhausted and self.loop.idle()
        finally:
            reader.close()
            self.loop.abandon_session()
        end = flush if exhausted else max(committed, default=None)
        if end is None:
            return None
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            sql_slot.advance(conn, src.slot, end)
        self.loop.confirmed_lsn = max(self.loop.confirmed_lsn or 0, end)
        return end

    def _may_commit(self, tables: list[FoldedTable]) -> str | None:
        return self.tablesync.must_sync([(t.schema.namespace, t.schema.relation.name, t.schema.relation.oid,
                                          t.schema.column_names) for t in tables])

    def _follow_publication(self) -> None:
        """Record what the snapshot copied (once), then copy tables published since (tablesync)."""
        if self.summary.snapshot_lsn is not None and not self._snapshot_recorded:
            self.tablesync.record_snapshot(self._snapshot_tables, self.summary.snapshot_lsn)
            self._snapshot_recorded = True
        self.tablesync.check_publication()
        self.summary.synced_rows = dict(self.tablesync.synced)

def mirror(spark: SparkLike, config: MirrorConfig, *, once: bool = False, progress: Progress | None = None,
           stop: threading.Event | None = None) -> MirrorSummary:
    """Run the mirror (see the module docstring); returns when ``once`` has drained the slot, or on stop.

    ``spark``: a started session, or a provider (applier.spark.session.SparkProvider) that starts one
    only when an operation needs Spark: a mirror whose tables delta-rs writes runs without a JVM."""
    return Mirror(spark, config, progress=progress, stop=stop).run(once=once)
