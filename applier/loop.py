"""The one apply loop: raw messages in, Delta commits out, a position confirmed after them.

raw message -> MessageDecoder -> TransactionAssembler (via TransactionFeeder: committed transactions
with their TableBatches) -> PendingGroup -> DeltaApplier (one commit per table per group) -> the
records that go with a group (logical decoding messages, skipped transactions) -> release of what
the group held -> garbage collection -> state save -> confirm.

Every driver (replay of a stored log, the live mirror, the Structured Streaming sink) supplies raw
messages and, where there is a server to tell, a confirm function; what happens to a transaction
and after a group is decided here and only here, in that order, because the order is what makes a
crash anywhere safe: nothing is confirmed before its Delta commits exist, and a transaction that is
applied again after a crash is recognised by the end LSN each table recorded with its commit.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any

from applier.assembly import CommittedTransaction, TransactionAssembler
from applier.assembly.feeder import PiecedBatches, TransactionFeeder
from applier.catalog import TypeCache
from applier.catalog.batches import GroupedTransactions, TableBatch
from applier.changes import SkippedTransaction
from applier.config import ApplySettings, TablesSettings
from applier.errors import ApplierError
from applier.infra.crashpoints import crashpoint
from applier.infra.gcpolicy import after_group, collect_between_groups
from applier.infra.progress import Progress
from applier.lsn import format_lsn, parse_lsn
from applier.protocol.decoder import MessageDecoder
from applier.protocol.messages import LogicalMessage, pg_time_to_datetime
from applier.sink.audit import record_skips
from applier.sink.cuts import Cut, CutRecorder
from applier.sink.engine import CommitCounters, DeltaApplier
from applier.sink.fold import FoldedTable, approximate_bytes
from applier.sink.identity import CatalogLookup, TableIdentities
from applier.sink.messages import record_messages
from applier.sink.parking import ParkedTables
from applier.sink.spec import SchemaEvolution
from applier.sink.store import StorePicker
from applier.spark.session import SparkLike, SparkProvider
from applier.state import StateDir

if TYPE_CHECKING:
    from applier.catalog import RelationCache
    from applier.infra.metrics import MirrorMetrics
    from applier.sink.catalogs import CatalogRegistrations

Confirm = Callable[[int], None]

#: State key: end LSNs of the transactions being applied in pieces (``ApplyLoop._apply_pieced``)
PIECES_KEY = "pieced_transactions"
#: What a row change costs while a piece is converted, folded and merged (measured: about 1.2 KB for a
#: row of three columns), and the fewest row changes a piece holds
PIECE_ROW_BYTES = 1024
PIECE_MIN_ROWS = 1000


def piece_rows(apply: ApplySettings) -> int:
    """The row changes of one piece of a large transaction: ``apply.piece_rows``, or about
    ``apply.memory_budget_mb`` of them."""
    if apply.piece_rows is not None:
        return apply.piece_rows
    return max(PIECE_MIN_ROWS, (apply.memory_budget_mb << 20) // PIECE_ROW_BYTES)


@dataclass(frozen=True, slots=True)
class ApplyStats:
    """What a driver's run applied: its result, for whichever command started it to report (``replay``
    builds its ReplaySummary from it; the mirror's catch-up on executors reads ``ranges``)."""

    messages: int = 0  # raw messages read
    transactions: int = 0  # transactions applied, or found applied already (a re-run)
    applied: int = 0  # of them, applied by this run
    rows: Mapping[str, int] = field(default_factory=dict)  # row changes per source table
    tables: frozenset[tuple[str, str]] = frozenset()  # (namespace, name) of every table written
    last_end_lsn: int | None = None  # end LSN of the last transaction
    ranges: int = 0  # ranges folded on Spark's executors (0: the driver path did it all)

    @property
    def already_applied(self) -> int:
        return self.transactions - self.applied

    @classmethod
    def of(cls, counters: CommitCounters, *, messages: int, ranges: int = 0) -> ApplyStats:
        """From a DeltaApplier's counters (``ApplyLoop.applier.stats``)."""
        return cls(messages=messages, transactions=counters.transactions, applied=counters.applied,
                   rows=dict(counters.rows), tables=frozenset(counters.tables), last_end_lsn=counters.last_end_lsn,
                   ranges=ranges)


class PendingGroup:
    """Committed transactions waiting to be applied together (grouping 'transaction' means one)."""

    def __init__(self, settings: ApplySettings) -> None:
        self.settings = settings
        self.transactions: list[tuple[int, list[TableBatch]]] = []
        self.committed: list[CommittedTransaction] = []
        self.rows = 0
        self.bytes = 0
        self.since: float | None = None  # monotonic time the oldest transaction joined

    @staticmethod
    def measure(batches: list[TableBatch]) -> tuple[int, int]:
        """A transaction's row changes and the approximate bytes of their row images (``add``, ``past``)."""
        return sum(len(b.changes) for b in batches), sum(approximate_bytes(b) for b in batches)

    def add(self, txn: CommittedTransaction, batches: list[TableBatch],
            measured: tuple[int, int] | None = None) -> None:
        # The batches hold every value the apply needs: the decoded messages would only double the
        # group's memory (and keep spill files) until it is applied. A crash before then re-reads the
        # transaction from the slot or the log; a prepared one's staged copy stays until it is applied.
        TransactionAssembler.release(txn)
        self.transactions.append((txn.end_lsn, batches))
        self.committed.append(txn)
        rows, size = measured if measured is not None else self.measure(batches)
        self.rows += rows
        self.bytes += size
        if self.since is None:
            self.since = time.monotonic()

    def __bool__(self) -> bool:
        return bool(self.transactions)

    def full(self) -> bool:
        if self.settings.grouping == "transaction":
            return True
        return self.settings.reached(len(self.transactions), self.rows, self.bytes)

    def past(self, measured: tuple[int, int]) -> bool:
        """Whether a transaction of ``measured`` (rows, bytes) would take the group past a limit: the group
        is then applied first, and a group holds more only when one transaction alone does (it is then a
        group of its own)."""
        rows, size = measured
        return bool(self.transactions) and self.settings.passed(len(self.transactions) + 1, self.rows + rows,
                                                                self.bytes + size)

    def due(self) -> bool:
        """Held for ``max_group_seconds`` already (a live source applies it even if more may come)."""
        return self.since is not None and time.monotonic() - self.since >= self.settings.max_group_seconds

    def clear(self) -> None:
        self.transactions, self.committed, self.rows, self.bytes, self.since = [], [], 0, 0, None


@dataclass
class _Dispatched:
    """A group handed to the Delta side, with what is recorded alongside it."""

    transactions: list[tuple[int, list[TableBatch]]]
    committed: list[CommittedTransaction]
    messages: list[tuple[int, LogicalMessage]]
    skipped: list[SkippedTransaction]
    future: Future[None] | None = None

    @property
    def end(self) -> int:
        return self.transactions[-1][0]


class ApplyLoop:
    """Owns decoder, feeder, pending group and Delta applier for one run over one target.

    ``dry_run``: describe each commit to it and write nothing (no state, no records, no confirm).
    ``save_catalog_each_group``: save the catalog with every group (a live source resumes from the
    slot's confirmed position, where the Relation messages before it are not re-sent); a stored log
    is read from its start and saves once at the end (``save()``).
    ``check_order``: check each message's place in the sequence (protocol/order.py) as it is fed; for
    sources that do not guarantee it and were not checked whole (the streaming sink).
    ``on_applied``: what to do with a transaction once its commits exist (default: let the assembler
    drop its staged prepared copy; the streaming sink defers that by one batch).
    ``apply.overlap_groups``: a full group's Delta commits (and its message and skip records) run on
    a thread of their own while the next group is decoded; what follows them (release, state save,
    confirm) still happens on the caller's thread, in order, once they exist. At most one group is
    in flight: dispatching the next one first waits for it.
    ``catalog_json``: the catalog to start from (a RelationCache.to_json; default: the state's saved one).
    ``stores``: which store writes each table (default: delta-rs where it can, else Spark; a picker with
    an ``InMemoryStore`` runs the loop without a JVM or files, in tests).
    ``lookup``: the source catalog the identity map asks when a name alone cannot say which table is which
    (applier.sink.identity; the mirror's live catalog, a stored log's recorded one; None: none to ask).
    ``before_apply``: called with each group just before it is applied (the mirror copies tables that
    joined the publication there, so that their copy's position is known before their changes apply).
    ``parked``: tables set aside (apply.on_table_error: park): their changes are left out of every group.
    ``when_idle``: called by a live source's follower while the stream is idle, with nothing in flight
    (the mirror makes a table sync whose slot now exists there, and runs maintenance; see ``tick``).
    ``metrics``: the mirror's Prometheus metrics (metrics.port), told of each applied group; None: not served.
    """

    def __init__(self, spark: SparkLike, target_dir: str, *, apply: ApplySettings, tables: TablesSettings,
                 state: StateDir, catalog_json: dict[str, Any] | None = None, progress: Progress | None = None,
                 dry_run: Progress | None = None, save_catalog_each_group: bool = False, check_order: bool = False,
                 on_applied: Callable[[CommittedTransaction], None] | None = None,
                 stores: StorePicker | None = None, lookup: CatalogLookup | None = None,
                 before_apply: Callable[[GroupedTransactions], None] | None = None,
                 parked: ParkedTables | None = None, when_idle: Callable[[], None] | None = None,
                 metrics: MirrorMetrics | None = None, registrations: CatalogRegistrations | None = None) -> None:
        self.spark = SparkProvider.of(spark)  # started by the first write that needs it (issue 31 item 2)
        self.settings = apply
        self.state = state
        self.progress: Progress = progress or (lambda _m: None)
        self.dry_run = dry_run
        # The applier and the feeder's catalog share the types; the catalog tells the applier's identity map
        # of columns gone and new as Relations are read (renamed columns are decided then), so the applier
        # comes first, with the types the catalog fills from the saved one.
        types = TypeCache()
        self.applier = DeltaApplier(self.spark, target_dir, tables=tables, apply=apply, types=types,
                                    on_schema_change=self._schema_changed, dry_run=dry_run,
                                    identities=None if dry_run is not None else partial(TableIdentities, state,
                                                                                         lookup=lookup),
                                    stores=stores)
        ids = self.applier.identities
        # a transaction of more row changes than piece_rows is applied in pieces (see _apply_pieced)
        self.feeder = TransactionFeeder.from_state(state, apply, catalog_json=catalog_json, check_order=check_order,
                                                   types=types, piece_rows=piece_rows(apply),
                                                   columns_changed=ids.columns_changed if ids is not None else None)
        if dry_run is None:
            self.applier.pieced_ends.update(parse_lsn(e) for e in state.load(PIECES_KEY) or [])
        self.decoder = MessageDecoder()
        self.group = PendingGroup(apply)
        self.confirm: Confirm = lambda _lsn: None
        self.save_catalog_each_group = save_catalog_each_group
        self.on_applied = on_applied or self.feeder.applied
        self.before_apply = before_apply
        self.parked = parked
        self.when_idle = when_idle
        self.metrics = metrics
        self.messages = 0  # raw messages fed
        self.received = 0  # committed transactions completed by what was fed
        self.transactions = 0  # transactions applied (or found applied) by this loop
        self.confirmed_lsn: int | None = None
        self.last_commit_time: int | None = None  # PG clock (µs since 2000), of the newest transaction fed
        self._executor = (ThreadPoolExecutor(1, thread_name_prefix="applier-apply")
                          if apply.overlap_groups and dry_run is None else None)
        self._in_flight: _Dispatched | None = None
        self._folded_transactions = 0  # in groups folded elsewhere, committed and not yet counted
        #: a consistent cut after each group (applier.sink.cuts); none for a dry run or the in-memory store
        self.cuts = (CutRecorder(self.applier, target_dir, parked)
                     if dry_run is None and (stores is None or stores.only is None) else None)
        self.last_cut: Cut | None = None  # the newest this loop recorded
        #: the tables' names in a catalog (catalog: in the config), brought in step after each cut
        self.registrations = registrations if dry_run is None else None

    # --- feeding --------------------------------------------------------------------------------

    @contextmanager
    def running(self) -> Iterator[None]:
        """The block in which the loop runs: automatic garbage collection off, one pass per group
        (applier.infra.gcpolicy says why); a group still in flight when it ends is waited for (its
        commits land, unconfirmed: the next run recognises them by their end LSN)."""
        try:
            with collect_between_groups():
                yield
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)

    def feed(self, lsn: int, xid: int | None, data: bytes) -> None:
        """Decode and assemble one raw message; apply the group when it is full. On bad data the
        transactions before the bad one are applied first, so every table ends as after the last
        good transaction, then the error propagates."""
        self.messages += 1
        before = len(self.feeder.messages)
        try:
            completed = self.feeder.feed_raw(self.decoder, lsn, xid, data)
        except ApplierError:
            if self.dry_run is None:
                self.flush()
            raise
        for txn, batches in completed:
            self.received += 1
            self.last_commit_time = txn.commit_time
            if isinstance(batches, PiecedBatches):
                self._apply_pieced(txn, batches)
                continue
            measured = PendingGroup.measure(batches)
            if self.group.past(measured):  # the group without it first
                ours = self.feeder.messages[before:]  # the logical decoding messages it completed with
                del self.feeder.messages[before:]
                self._dispatch(wait=False)
                self.feeder.messages.extend(ours)
                before = 0
            self.group.add(txn, batches, measured)
            if self.group.full():
                self._dispatch(wait=False)
                before = 0

    def _apply_pieced(self, txn: CommittedTransaction, pieces: PiecedBatches) -> None:
        """A transaction of more row changes than one fold should hold, applied a piece at a time as it is
        read back from its spill (memory holds one piece): the groups before it first, then each piece but
        the last as a group of its own, committed with piece markers (``DeltaApplier.apply_group``,
        ``piece``) and neither counted nor confirmed, then the last piece, with what the pieces left for
        the whole (tables with history or change feed tables, merge keys changing inside), as the
        transaction's own group: its commits carry its end LSN, and only then is it confirmed. Readers
        of a table see the transaction's pieces land one commit at a time. The transaction's end LSN is
        in the state (``PIECES_KEY``) from before the first piece until its group is applied, so that a
        run after a crash leaves out what the pieces committed, however it cuts the transaction."""
        self.flush()
        end = txn.end_lsn
        if self.dry_run is None and end not in self.applier.pieced_ends:
            self.applier.pieced_ends.add(end)
            self._save_pieced()
        deferred: list[TableBatch] = []
        count = 0
        for batches, last in pieces:
            if last:
                self.group.add(txn, deferred + batches)
                self._dispatch(wait=True)
                break
            count += 1
            rows = sum(len(b.changes) for b in batches)
            self.progress(f"transaction xid {txn.xid} (end LSN {format_lsn(end)}): applying piece {count} "
                          f"({rows:,} row changes)")
            work: list[tuple[int, list[TableBatch]]] = [(end, batches)]
            if self.parked is not None and self.dry_run is None:
                self.parked.leave_out(work)
            if self.before_apply is not None and self.dry_run is None:
                self.before_apply(work)
            deferred.extend(self.applier.apply_group(work, piece=True))
            crashpoint("piece_committed")
        if self.dry_run is None and end not in self.applier.pieced_ends:
            self._save_pieced()

    def _save_pieced(self) -> None:
        self.state.save(PIECES_KEY, sorted(format_lsn(e) for e in self.applier.pieced_ends))

    def tick(self) -> None:
        """The source has nothing to read just now: run ``when_idle`` unless a group is in flight (its
        commits and what ``when_idle`` writes must not overlap)."""
        if self.when_idle is not None and self._in_flight is None and self.dry_run is None:
            self.when_idle()

    def idle(self) -> bool:
        """Nothing received that is not applied: no pending or in-flight group, no open transaction."""
        return not self.group and self._in_flight is None and not self.feeder.assembler.open_transactions()

    # --- after a group --------------------------------------------------------------------------

    def flush(self) -> int | None:
        """Apply the pending group and everything that goes with it, and wait for it (and for a
        group still in flight); returns the end LSN now safe to confirm (None when nothing was
        pending)."""
        return self._dispatch(wait=True)

    def dispatch(self) -> int | None:
        """Hand the pending group to the Delta side and return at once (``apply.overlap_groups``; without
        it this is ``flush``): a live source keeps reading while the group commits. What it returns
        and confirms is the previous group's end, once that group's commits are done."""
        return self._dispatch(wait=False)

    def _dispatch(self, *, wait: bool) -> int | None:
        finished = self._finish_in_flight()
        group = self.group
        if not group:
            if self.dry_run is None:
                self._record_skips(self._take_skips())  # a skipped transaction came last
                self._record_lone_messages()
            return finished
        work = _Dispatched(group.transactions, group.committed, self._take_messages(), self._take_skips())
        self.group = PendingGroup(self.settings)
        if self.parked is not None and self.dry_run is None:
            self.parked.leave_out(work.transactions)
        self.applier.note_split_transactions(work.transactions)  # before the column fills: they look at it
        if self.before_apply is not None and self.dry_run is None:
            self.before_apply(work.transactions)
        if self._executor is None or wait:
            self._commit(work)
            return self._finish(work)
        work.future = self._executor.submit(self._commit, work)
        self._in_flight = work
        return finished

    def _take_messages(self) -> list[tuple[int, LogicalMessage]]:
        messages = list(self.feeder.messages)  # messages after the last transaction wait for the next one's LSN
        self.feeder.messages.clear()
        return messages

    def _record_lone_messages(self) -> None:
        """Non-transactional messages that no committed transaction followed (their own transaction may
        have rolled back): recorded now, before a confirm of an idle stream moves the slot past them,
        tagged with the last one's LSN (messages and commits arrive in WAL order, so the tags still
        grow, and a re-delivery is recognised as for a group)."""
        if self.settings.messages_table and self.feeder.messages:
            messages = self._take_messages()
            record_messages(self.applier.stores, self.settings.messages_table, messages, messages[-1][0])

    def _take_skips(self) -> list[SkippedTransaction]:
        skipped = list(self.feeder.skipped)
        self.feeder.skipped.clear()
        return skipped

    def _commit(self, work: _Dispatched) -> None:
        """The Delta side of a group: its tables' commits, then its messages and skips (each an
        idempotent write keyed by the group's end LSN, so the order of groups is kept)."""
        started = time.monotonic()
        self.applier.apply_group(work.transactions)
        if self.dry_run is not None:
            return
        self._records(work.messages, work.skipped, work.end, len(work.transactions), started)

    def _records(self, messages: list[tuple[int, LogicalMessage]], skipped: list[SkippedTransaction],
                 end: int | None, transactions: int, started: float) -> None:
        """What goes with a group's commits: its logical decoding messages (none without a transaction to
        end the group), its skips, and the metrics."""
        if self.settings.messages_table and end is not None:
            record_messages(self.applier.stores, self.settings.messages_table, messages, end)
        self._record_skips(skipped)
        if self.metrics is not None:
            if transactions:
                self.metrics.group_applied(time.monotonic() - started, transactions, self.applier.stats.rows)
            self.metrics.skipped.inc(len(skipped))

    def _finish_in_flight(self) -> int | None:
        work, self._in_flight = self._in_flight, None
        if work is None:
            return None
        assert work.future is not None
        work.future.result()  # its error, if any, is raised here, before anything after it is confirmed
        return self._finish(work)

    def _finish(self, work: _Dispatched) -> int | None:
        """What follows a group's commits, on the caller's thread: release what it held, collect
        garbage, save state, confirm."""
        self.transactions += len(work.transactions)
        if self.dry_run is not None:
            after_group()
            return None
        for txn in work.committed:
            self.on_applied(txn)
        last = work.committed[-1].commit_time if work.committed else None
        self.record_cut(work.end, pg_time_to_datetime(last) if last is not None else None)
        after_group()
        if self.save_catalog_each_group:
            self.save()
        crashpoint("before_confirm")
        end = work.end
        self.confirm(end)  # only now: every Delta commit up to ``end`` exists
        self.confirmed_lsn = end
        return end

    # --- groups folded elsewhere (Spark's executors: applier.drivers.executors) -----------------------

    def commit_folded(self, folded: Sequence[FoldedTable], end: int | None, transactions: int,
                      messages: list[tuple[int, LogicalMessage]], skipped: list[SkippedTransaction], *,
                      commit_time: int | None = None) -> None:
        """The Delta side of a group folded elsewhere, as ``_commit`` is of the loop's own groups: its
        tables' commits (each tagged with ``end``, the end LSN of the group's last transaction; None when
        it holds none), then its messages, skips and metrics. The caller may run it on a thread of its
        own, one group at a time and in log order. Its consistent cut is recorded once its commits exist
        (``commit_time``: of its last transaction, PG clock); nothing is counted, saved or confirmed for
        it before ``folded_applied``."""
        started = time.monotonic()
        if end is not None:
            self.applier.apply_folded(folded, end, transactions)
            self._folded_transactions += transactions
        self._records(messages, skipped, end, transactions, started)
        if end is not None:
            self.record_cut(end, pg_time_to_datetime(commit_time) if commit_time is not None else None)

    def folded_applied(self, *, catalog: RelationCache | None = None) -> int | None:
        """Once the commits of every group ``commit_folded`` was given exist, what follows them, as
        ``_finish`` follows a group's: counted, the catalog saved (``catalog``, the one as at the end of
        what was folded, becomes the loop's: None when the loop goes on from an earlier place, with the
        catalog there), then the end of the last group committed confirmed. Returns that end (None:
        nothing committed yet)."""
        self.transactions += self._folded_transactions
        self._folded_transactions = 0
        if catalog is not None:
            self.feeder.catalog.replace_with(catalog)
            self.save()
        end = self.applier.stats.last_end_lsn
        if end is not None:  # (its cut was recorded after its group's commits: commit_folded)
            crashpoint("before_confirm")
            self.confirm(end)  # every Delta commit up to ``end`` exists
            self.confirmed_lsn = end
        return end

    def record_cut(self, end: int, commit_time: datetime | None) -> None:
        """Once every table of the groups up to ``end`` has committed (or been copied as of ``end``: the
        mirror's initial copy), and before ``end`` is confirmed: the cut at ``end`` (a crash before it
        leaves the previous cut the newest; the run after it re-applies nothing and records this one)."""
        if self.cuts is not None:
            crashpoint("before_cut")
            cut = self.cuts.record(end, commit_time)
            if cut is not None:
                self.last_cut = cut
                if self.metrics is not None:
                    self.metrics.cut_recorded(cut.lsn, cut.commit_time)
        if self.registrations is not None:
            self.registrations.sync(self.applier)

    def save(self) -> None:
        if self.dry_run is None:
            self.feeder.save(self.state)

    def abandon_session(self) -> None:
        """Forget what a lost decoding session delivered but did not get applied: the next session
        re-sends it (staged prepared transactions stay: their Prepare is not re-sent once confirmed).
        A group already in flight is waited for: its commits land, unconfirmed."""
        self.confirm = lambda _lsn: None
        try:
            self._finish_in_flight()
        finally:
            self._in_flight = None
        self.group.clear()  # their buffered changes were released when they joined the group
        self.feeder.messages.clear()
        self.feeder.assembler.session_start()
        self.decoder.reset()
        self.confirm = lambda _lsn: None

    def _record_skips(self, skipped: list[SkippedTransaction]) -> None:
        """Write skips to the audit table and the state, before the transactions after them are
        confirmed to the server."""
        if not skipped:
            return
        record_skips(self.applier.stores, str(self.state.skipped_table), skipped)
        done = set(self.state.load("skipped") or []) | {format_lsn(s.commit_lsn) for s in skipped}
        self.state.save("skipped", sorted(done, key=parse_lsn))

    def _schema_changed(self, name: str, evolution: SchemaEvolution) -> None:
        self.progress(f"{name}: schema changed (added {list(evolution.added)}, widened {list(evolution.widened)}, "
                      f"dropped {list(evolution.dropped)} kept as NULL)")
