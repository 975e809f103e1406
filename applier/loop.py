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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from applier.assembly import CommittedTransaction, TransactionAssembler
from applier.assembly.feeder import TransactionFeeder
from applier.changes import GroupedTransactions, TableBatch
from applier.config import ApplySettings, TablesSettings
from applier.errors import ApplierError
from applier.infra.crashpoints import crashpoint
from applier.infra.gcpolicy import after_group, collect_between_groups
from applier.lsn import format_lsn, parse_lsn
from applier.protocol.decoder import MessageDecoder
from applier.sink.audit import record_skips
from applier.sink.engine import DeltaApplier, approximate_bytes
from applier.sink.messages import record_messages
from applier.sink.schema import SchemaEvolution
from applier.state import StateDir

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

Progress = Callable[[str], None]
Confirm = Callable[[int], None]


class PendingGroup:
    """Committed transactions waiting to be applied together (grouping 'transaction' means one)."""

    def __init__(self, settings: ApplySettings) -> None:
        self.settings = settings
        self.transactions: list[tuple[int, list[TableBatch]]] = []
        self.committed: list[CommittedTransaction] = []
        self.rows = 0
        self.bytes = 0
        self.since: float | None = None  # monotonic time the oldest transaction joined

    def add(self, txn: CommittedTransaction, batches: list[TableBatch]) -> None:
        # The batches hold every value the apply needs: the decoded messages would only double the
        # group's memory (and keep spill files) until it is applied. A crash before then re-reads the
        # transaction from the slot or the log; a prepared one's staged copy stays until it is applied.
        TransactionAssembler.release(txn)
        self.transactions.append((txn.end_lsn, batches))
        self.committed.append(txn)
        self.rows += sum(len(b.changes) for b in batches)
        self.bytes += sum(approximate_bytes(b) for b in batches)
        if self.since is None:
            self.since = time.monotonic()

    def __bool__(self) -> bool:
        return bool(self.transactions)

    def full(self) -> bool:
        if self.settings.grouping == "transaction":
            return True
        return (len(self.transactions) >= self.settings.max_group_transactions
                or self.rows >= self.settings.max_group_rows
                or self.bytes >= self.settings.max_group_bytes_mb << 20)

    def due(self) -> bool:
        """Held for ``max_group_seconds`` already (a live source applies it even if more may come)."""
        return self.since is not None and time.monotonic() - self.since >= self.settings.max_group_seconds

    def clear(self) -> None:
        self.transactions, self.committed, self.rows, self.bytes, self.since = [], [], 0, 0, None


class ApplyLoop:
    """Owns decoder, feeder, pending group and Delta applier for one run over one target.

    ``dry_run``: describe each commit to it and write nothing (no state, no records, no confirm).
    ``save_catalog_each_group``: save the catalog with every group (a live source resumes from the
    slot's confirmed position, where the Relation messages before it are not re-sent); a stored log
    is read from its start and saves once at the end (``save()``).
    ``on_applied``: what to do with a transaction once its commits exist (default: let the assembler
    drop its staged prepared copy; the streaming sink defers that by one batch).
    """

    def __init__(self, spark: SparkSession, target_dir: str, *, apply: ApplySettings, tables: TablesSettings,
                 state: StateDir, feeder: TransactionFeeder | None = None, progress: Progress | None = None,
                 dry_run: Progress | None = None, save_catalog_each_group: bool = False,
                 on_applied: Callable[[CommittedTransaction], None] | None = None) -> None:
        self.spark = spark
        self.settings = apply
        self.state = state
        self.progress: Progress = progress or (lambda _m: None)
        self.dry_run = dry_run
        self.feeder = feeder or TransactionFeeder.from_state(state, apply)
        self.applier = DeltaApplier(spark, target_dir, tables=tables, apply=apply, types=self.feeder.types,
                                    on_schema_change=self._schema_changed, dry_run=dry_run)
        self.decoder = MessageDecoder()
        self.group = PendingGroup(apply)
        self.confirm: Confirm = lambda _lsn: None
        self.save_catalog_each_group = save_catalog_each_group
        self.on_applied = on_applied or self.feeder.applied
        #: Called with each group just before it is applied (the mirror copies tables that joined the
        #: publication there, so that their copy's position is known before their changes apply).
        self.before_apply: Callable[[GroupedTransactions], None] | None = None
        self.messages = 0  # raw messages fed
        self.transactions = 0  # transactions applied (or found applied) by this loop
        self.confirmed_lsn: int | None = None
        self.last_commit_time: int | None = None  # PG clock (µs since 2000), of the newest transaction fed

    # --- feeding --------------------------------------------------------------------------------

    @contextmanager
    def running(self) -> Iterator[None]:
        """The block in which the loop runs: automatic garbage collection off, one pass per group
        (applier.infra.gcpolicy says why)."""
        with collect_between_groups():
            yield

    def feed(self, lsn: int, xid: int | None, data: bytes) -> None:
        """Decode and assemble one raw message; apply the group when it is full. On bad data the
        transactions before the bad one are applied first, so every table ends as after the last
        good transaction, then the error propagates."""
        self.messages += 1
        try:
            completed = self.feeder.feed_raw(self.decoder, lsn, xid, data)
        except ApplierError:
            if self.dry_run is None:
                self.flush()
            raise
        for txn, batches in completed:
            self.group.add(txn, batches)
            self.last_commit_time = txn.commit_time
            if self.group.full():
                self.flush()

    def idle(self) -> bool:
        """Nothing received that is not applied: no pending group, no open transaction."""
        return not self.group and not self.feeder.assembler.open_transactions()

    # --- after a group --------------------------------------------------------------------------

    def flush(self) -> int | None:
        """Apply the pending group and everything that goes with it; returns the end LSN now safe to
        confirm (None when nothing was pending)."""
        group = self.group
        if not group:
            if self.dry_run is None:
                self._record_skips()  # a skipped transaction came last
            return None
        end = group.transactions[-1][0]
        if self.before_apply is not None and self.dry_run is None:
            self.before_apply(group.transactions)
        self.applier.apply_group(group.transactions)
        self.transactions += len(group.transactions)
        if self.dry_run is not None:
            self.feeder.messages.clear()
            group.clear()
            after_group()
            return None
        if self.settings.messages_table:
            record_messages(self.spark, self.settings.messages_table, self.feeder.messages, end)
        self.feeder.messages.clear()  # messages after the last transaction wait for the next one's LSN
        self._record_skips()
        for txn in group.committed:
            self.on_applied(txn)
        group.clear()
        after_group()
        if self.save_catalog_each_group:
            self.save()
        crashpoint("before_confirm")
        self.confirm(end)  # only now: every Delta commit up to ``end`` exists
        self.confirmed_lsn = end
        return end

    def save(self) -> None:
        if self.dry_run is None:
            self.feeder.save(self.state)

    def abandon_session(self) -> None:
        """Forget what a lost decoding session delivered but did not get applied: the next session
        re-sends it (staged prepared transactions stay: their Prepare is not re-sent once confirmed)."""
        self.group.clear()  # their buffered changes were released when they joined the group
        self.feeder.messages.clear()
        self.feeder.assembler.session_start()
        self.decoder.reset()
        self.confirm = lambda _lsn: None

    def _record_skips(self) -> None:
        """Write the skips since the last call to the audit table and the state, before the
        transactions after them are confirmed to the server."""
        skipped = self.feeder.skipped
        if not skipped:
            return
        record_skips(self.spark, str(self.state.skipped_table), skipped)
        done = set(self.state.load("skipped") or []) | {format_lsn(s.commit_lsn) for s in skipped}
        self.state.save("skipped", sorted(done, key=parse_lsn))
        skipped.clear()

    def _schema_changed(self, name: str, evolution: SchemaEvolution) -> None:
        self.progress(f"{name}: schema changed (added {list(evolution.added)}, widened {list(evolution.widened)}, "
                      f"dropped {list(evolution.dropped)} kept as NULL)")
