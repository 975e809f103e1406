"""``replay``: rebuild (or bring up to date) Delta tables from a stored raw log.

raw log rows -> MessageDecoder -> TransactionAssembler -> DeltaApplier, in log order. Progress is
reported on long runs; the summary says how many transactions were applied or found already
applied, the rows per table and the LSN reached. Re-running on the same log writes no new Delta
versions: each table's Delta log records the end LSN of the last transaction applied to it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from applier.assembly import CommittedTransaction, TransactionAssembler
from applier.assembly.feeder import TransactionFeeder
from applier.config import ApplySettings, ReplayConfig
from applier.errors import ApplierError
from applier.infra.gcpolicy import after_group, collect_between_groups
from applier.lsn import format_lsn
from applier.protocol.decoder import MessageDecoder
from applier.sink.engine import DeltaApplier, TableBatch, approximate_bytes, record_messages
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


class PendingGroup:
    """Committed transactions waiting to be applied together (grouping: 'transaction' means one)."""

    def __init__(self, settings: ApplySettings) -> None:
        self.settings = settings
        self.transactions: list[tuple[int, list[TableBatch]]] = []
        self.committed: list[CommittedTransaction] = []
        self.rows = 0
        self.bytes = 0

    def add(self, txn: CommittedTransaction, batches: list[TableBatch]) -> None:
        # The batches hold every value the apply needs: the decoded messages would only double the
        # group's memory (and keep spill files) until it is applied. A crash before then re-reads the
        # transaction from the slot or the log; a prepared one's staged copy stays until it is applied.
        TransactionAssembler.release(txn)
        self.transactions.append((txn.end_lsn, batches))
        self.committed.append(txn)
        self.rows += sum(len(b.changes) for b in batches)
        self.bytes += sum(approximate_bytes(b) for b in batches)

    def full(self) -> bool:
        if self.settings.grouping == "transaction":
            return True
        return (len(self.transactions) >= self.settings.max_group_transactions
                or self.rows >= self.settings.max_group_rows
                or self.bytes >= self.settings.max_group_bytes_mb << 20)

    def clear(self) -> None:
        self.transactions, self.committed, self.rows, self.bytes = [], [], 0, 0


def replay_log(spark: SparkSession, config: ReplayConfig, *, progress: Callable[[str], None] | None = None,
               progress_every: float = 10.0, dry_run: Callable[[str], None] | None = None) -> ReplaySummary:
    """Apply the raw log; with ``dry_run``, describe each commit to it and write nothing (no state either)."""
    started = time.monotonic()
    state = StateDir.for_target(config.target.path, config.target.state_dir)
    feeder = TransactionFeeder.from_state(state, config.apply)
    applier = DeltaApplier(spark, config.target.path, tables=config.tables, apply=config.apply,
                           types=feeder.types,
                           on_schema_change=lambda name, evo: progress and progress(
                               f"{name}: schema changed (added {list(evo.added)}, widened {list(evo.widened)}, "
                               f"dropped {list(evo.dropped)} kept as NULL)"),
                           dry_run=dry_run)
    decoder = MessageDecoder()
    summary = ReplaySummary()
    last_report = started
    group = PendingGroup(config.apply)

    def flush() -> None:
        applier.apply_group(group.transactions)
        if group.transactions:  # messages after the last transaction wait for the next one's LSN
            if config.apply.messages_table and dry_run is None:
                record_messages(spark, config.apply.messages_table, feeder.messages, group.transactions[-1][0])
            feeder.messages.clear()
        if dry_run is None:
            feeder.record_skipped(spark, state)
            for txn in group.committed:
                feeder.applied(txn)
        group.clear()
        after_group()

    with collect_between_groups():
        for raw in read_raw_log(config.source_log):
            summary.messages += 1
            try:
                completed = feeder.feed_raw(decoder, raw.lsn, raw.xid, raw.data)
            except ApplierError:
                if dry_run is None:
                    flush()  # the transactions before the bad one: every table ends as after the last good one
                raise
            for txn, batches in completed:
                group.add(txn, batches)
                if group.full():
                    flush()
            if progress is not None and time.monotonic() - last_report >= progress_every:
                last_report = time.monotonic()
                progress(f"{summary.messages} messages, {applier.stats.transactions} transactions, "
                         f"at LSN {format_lsn(raw.lsn)}")
        flush()
    if dry_run is None:
        feeder.save(state)
    stats = applier.stats
    summary.transactions = stats.transactions
    summary.applied = stats.applied
    summary.already_applied = stats.transactions - stats.applied
    summary.rows = dict(stats.rows)
    summary.tables = set(stats.tables)
    summary.last_end_lsn = stats.last_end_lsn
    summary.seconds = time.monotonic() - started
    summary.dry_run = dry_run is not None
    return summary
