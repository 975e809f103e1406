"""Decoded messages -> per-table batches of row images, one group per committed transaction.

Joins the assembler (transactions), the values layer (TupleData -> values) and the origin filter,
and hands the engine what it applies: ``(end_lsn, [TableBatch, ...])`` in commit order.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence, Sized
from struct import error as StructError
from typing import Any

from applier.assembly import CommittedTransaction, PreparedStore, TransactionAssembler
from applier.assembly.rowchanges import row_change, row_changes
from applier.assembly.shortrows import ShortRowReader
from applier.assembly.transactions import Change
from applier.catalog import PerSchemaVersion, RelationCache, SchemaVersion, TypeCache
from applier.catalog.batches import TableBatch
from applier.catalog.relations import ColumnsChanged
from applier.changes import SkippedTransaction, TableChange
from applier.config import ApplySettings
from applier.errors import ApplierError, DecodeError
from applier.infra.crashpoints import crashpoint
from applier.lsn import format_lsn, parse_lsn
from applier.protocol.decoder import MessageDecoder
from applier.protocol.headers import BEGIN, COMMIT, change_relation_oid, end_of_row_changes, kind_of, plain_change_oid
from applier.protocol.messages import Begin, Commit, LogicalMessage, Message, TupleData
from applier.protocol.order import OrderChecker
from applier.state import StateDir
from applier.values import RowConverter

log = logging.getLogger(__name__)


class TransactionFeeder:
    def __init__(self, catalog: RelationCache, assembler: TransactionAssembler, settings: ApplySettings, *,
                 check_order: bool = True, piece_rows: int | None = None) -> None:
        self.catalog = catalog
        self.assembler = assembler
        self.settings = settings
        self._converters: PerSchemaVersion[RowConverter] = PerSchemaVersion(
            lambda schema: RowConverter(schema, catalog.types, settings.special_values))
        self._short_rows: PerSchemaVersion[ShortRowReader] = PerSchemaVersion(
            lambda schema: ShortRowReader(self._converters[schema].text_parsers, schema.key_indexes))
        self.messages: list[tuple[int, LogicalMessage]] = []
        #: A committed transaction of more row changes than this comes as ``PiecedBatches`` (None: whole,
        #: always; the apply loop's feeder has applier.loop's ``piece_rows``)
        self.piece_rows = piece_rows
        self.skipped_by_origin = 0
        self.skipped: list[SkippedTransaction] = []  # skipped since the last save, for the audit table
        # Refuses swapped, reordered or doubled messages (protocol/order.py): for messages from a
        # stored log read in pieces (the streaming sink). Off where the order is already guaranteed:
        # a live slot (the server sends commit order), or a raw log read_raw_log checked whole.
        self.order = OrderChecker() if check_order else None
        if self.order is not None:
            assembler.on_session_start = self.order.session_start

    @classmethod
    def from_state(cls, state: StateDir, settings: ApplySettings, *, catalog_json: dict[str, Any] | None = None,
                   check_order: bool = True, types: TypeCache | None = None,
                   columns_changed: ColumnsChanged | None = None, piece_rows: int | None = None) -> TransactionFeeder:
        """A feeder whose catalog is ``catalog_json`` (a RelationCache.to_json) or the state's saved one.

        ``types``: the TypeCache the catalog fills and shares (one the applier holds already), and
        ``columns_changed``: what the catalog tells of columns gone and new (RelationCache). The
        transactions to skip are the configured ones plus every one skipped before (the state's
        ``skipped`` list), so a replay from the start of a log leaves them out again."""
        saved = catalog_json if catalog_json is not None else state.load("catalog")
        catalog = (RelationCache.from_json(saved, types=types, columns_changed=columns_changed) if saved
                   else RelationCache(types, columns_changed=columns_changed))
        skip = {parse_lsn(v) for v in settings.skip_transactions}
        skip |= {parse_lsn(v) for v in state.load("skipped") or []}
        feeder: TransactionFeeder
        assembler = TransactionAssembler(
            catalog, prepared=PreparedStore(state.staging_dir),
            memory_budget_bytes=settings.memory_budget_mb << 20, spill_dir=state.spill_dir,
            on_message=lambda m, lsn: feeder.messages.append((lsn, m)),
            skip_lsns=frozenset(skip), on_skip=lambda s: feeder._skipped(s))
        feeder = cls(catalog, assembler, settings, check_order=check_order, piece_rows=piece_rows)
        return feeder

    @property
    def types(self) -> Any:
        return self.catalog.types

    def save(self, state: StateDir) -> None:
        state.save("catalog", self.catalog.to_json())

    def _skipped(self, skipped: SkippedTransaction) -> None:
        log.warning("skipped transaction xid %s with commit LSN %s as configured (%s)", skipped.xid,
                    format_lsn(skipped.commit_lsn), skipped.reason)
        self.skipped.append(skipped)

    def feed_raw(self, decoder: MessageDecoder, lsn: int, xid: int | None,
                 data: bytes) -> list[tuple[CommittedTransaction, Batches]]:
        """Decode one raw message and feed it. Bytes that do not decode are held against their
        transaction (it stops the run at its commit, with its commit LSN, unless it aborts or is
        listed to skip) or raised at once when they break the stream's framing."""
        in_stream = decoder.in_stream
        if self.order is not None and (problems := self.order.check(lsn, data)):
            raise problems[0].error()
        try:
            msg = decoder.decode(data, lsn)
        except DecodeError as e:
            e.add_context(xid=xid or None, relation=self._relation_named_in(data, in_stream))
            self.assembler.feed_error(lsn, e)
            return []
        crashpoint("decode")
        return list(self.feed(lsn, msg))

    def feed_range(self, decoder: MessageDecoder, lsns: Sequence[int], xids: Sequence[int | None] | None,
                   datas: Sequence[bytes]) -> Iterator[tuple[CommittedTransaction, list[TableBatch]]]:
        """Every message of a range held in memory, fed as ``feed_raw`` would one by one; a plain
        transaction (Begin, only Inserts, Updates and Deletes, Commit) goes the short way, see
        :meth:`_plain`. For folds of ranges (applier.drivers.executors), where a message costs
        about 10 us and the assembler's buffering was a third of it."""
        n = len(datas)
        i = 0
        while i < n:
            data = datas[i]
            if kind_of(data) == BEGIN and self.order is None and not decoder.in_stream \
                    and self.assembler.between_transactions:
                j = end_of_row_changes(datas, i + 1)
                if j < n and kind_of(datas[j]) == COMMIT \
                        and (done := self._plain(decoder, lsns, datas, i, j)) is not None:
                    yield done
                    i = j + 1
                    continue
            for txn, batches in self.feed_raw(decoder, lsns[i], xids[i] if xids is not None else None, data):
                assert isinstance(batches, list)  # (a feeder of ranges has no piece_rows)
                yield txn, batches
            i += 1

    def _plain(self, decoder: MessageDecoder, lsns: Sequence[int], datas: Sequence[bytes], begin_at: int,
               commit_at: int) -> tuple[CommittedTransaction, list[TableBatch]] | None:
        """The transaction ``datas[begin_at:commit_at + 1]`` (Begin, Inserts, Updates and Deletes, Commit),
        its row changes made straight from the messages: no buffer (it is in memory already, whole),
        no Change objects, and the common shapes of row change read from their bytes by
        applier.assembly.shortrows without decoded message objects (others are decoded and converted
        as always). The result equals the long way's. Anything unusual (a message that
        does not decode, an unknown relation, a value the values layer refuses, a commit listed to
        skip) returns None before any state changed, and the caller feeds the transaction message
        by message, which raises or holds the error exactly as always."""
        try:
            begin = decoder.decode(datas[begin_at], lsns[begin_at])
            commit = decoder.decode(datas[commit_at], lsns[commit_at])
            if not isinstance(begin, Begin) or not isinstance(commit, Commit) \
                    or commit.commit_lsn in self.assembler.skip_lsns:
                return None
            get, decode, oid_of = self.catalog.get, decoder.decode, plain_change_oid
            # No Relation message inside: one schema version per relation OID for the whole transaction.
            tables: dict[int, _PlainTable] = {}
            for k in range(begin_at + 1, commit_at):
                data = datas[k]
                oid = oid_of(data)  # an I/U/D outside a stream block (checked by the caller)
                table = tables.get(oid)
                if table is None:
                    schema = get(oid)
                    table = tables[oid] = (schema, self._converters[schema].convert, self._short_rows[schema].read, [])
                schema, convert, read, rows = table
                change = read(data, k - begin_at - 1)
                if change is None:  # not a shape the short reader takes: the long way, the reference
                    msg = decode(data, lsns[k])
                    change = row_change(msg, schema, k - begin_at - 1, convert)  # type: ignore[arg-type]
                rows.append(change)
        except (ApplierError, StructError):  # (too short to name its relation: message by message reports it)
            return None
        txn = self.assembler.committed_whole(begin, commit)
        return txn, [TableBatch(schema.relation.oid, schema.namespace, schema.relation.name, schema, txn.commit_lsn,
                                txn.end_lsn, rows, txn.commit_time)
                     for schema, _convert, _read, rows in tables.values()]

    def _relation_named_in(self, data: bytes, in_stream: bool) -> str | None:
        """The relation a (possibly damaged) I/U/D message names, when its OID is readable and known."""
        oid = change_relation_oid(data, in_stream)
        if oid is None:
            return None
        if oid not in self.catalog:
            return f"OID {oid}"
        return self.catalog.get(oid).qualified_name

    def _convert(self, schema: SchemaVersion, tup: TupleData) -> tuple[Any, ...]:
        return self._converters[schema].convert(tup)

    def feed(self, lsn: int, msg: Message) -> Iterator[tuple[CommittedTransaction, Batches]]:
        """Committed transactions completed by this message, with their batches. Call
        ``applied(txn)`` once the transaction's Delta commits exist (drops staged prepares)."""
        for txn in self.assembler.feed(lsn, msg):
            if (self.piece_rows is not None and isinstance(txn.changes, Sized)
                    and len(txn.changes) > self.piece_rows and not self._skip(txn)):
                yield txn, PiecedBatches(self, txn, self.piece_rows)
            else:
                yield txn, self.batches(txn)

    def applied(self, txn: CommittedTransaction) -> None:
        self.assembler.finished(txn)

    def _skip(self, txn: CommittedTransaction) -> bool:
        if txn.origin is None:
            return False
        return self.settings.skip_any_origin or txn.origin in self.settings.skip_origins

    def batches(self, txn: CommittedTransaction) -> list[TableBatch]:
        if self._skip(txn):
            self.skipped_by_origin += 1
            return []
        by_table: dict[int, list[tuple[SchemaVersion, TableChange]]] = {}
        for schema, row in self.row_changes(txn):
            by_table.setdefault(schema.relation.oid, []).append((schema, row))
        return _table_batches(by_table, txn)

    def row_changes(self, txn: CommittedTransaction) -> Iterator[tuple[SchemaVersion, TableChange]]:
        """The row changes of ``txn``, in order, each with the schema version it was decoded with (its
        logical decoding messages go to ``messages``); a large one with progress lines."""
        changes: Iterable[Change] = txn.changes
        total = len(txn.changes) if isinstance(txn.changes, Sized) else 0
        if total >= LARGE_TRANSACTION_CHANGES:  # read back from disk, converted: say so meanwhile
            changes = _reported(txn, total)
        for change in changes:
            if isinstance(change.message, LogicalMessage):
                self.messages.append((change.lsn, change.message))
                continue
            try:
                yield from row_changes(change, self._convert)
            except ApplierError as e:  # a value the values layer refused: say where it is in the stream
                relation = change.schemas[0].qualified_name if change.schemas else None
                e.add_context(lsn=change.lsn, xid=txn.xid, commit_lsn=txn.commit_lsn, relation=relation)
                raise


class PiecedBatches:
    """A committed transaction of more row changes than one fold should hold (``TransactionFeeder.
    piece_rows``): its TableBatches in pieces of at most ``rows`` row changes, read from its spill as they
    are asked for, each with whether it is the last. The apply loop applies each piece as it comes
    (applier.loop, ``ApplyLoop._apply_pieced``), so memory holds one piece, not the transaction."""

    def __init__(self, feeder: TransactionFeeder, txn: CommittedTransaction, rows: int) -> None:
        self.feeder = feeder
        self.txn = txn
        self.rows = rows

    def __iter__(self) -> Iterator[tuple[list[TableBatch], bool]]:
        by_table: dict[int, list[tuple[SchemaVersion, TableChange]]] = {}
        held = 0
        for schema, row in self.feeder.row_changes(self.txn):
            if held >= self.rows:
                yield _table_batches(by_table, self.txn), False
                by_table, held = {}, 0
            by_table.setdefault(schema.relation.oid, []).append((schema, row))
            held += 1
        yield _table_batches(by_table, self.txn), True


#: A committed transaction's batches: all of them, or a large one's in pieces
Batches = list[TableBatch] | PiecedBatches

#: A transaction of this many changes is converted with progress lines (it takes seconds to minutes)
LARGE_TRANSACTION_CHANGES = 100_000
REPORT_SECONDS = 10.0


def _reported(txn: CommittedTransaction, total: int) -> Iterator[Change]:
    """The ``total`` changes of ``txn``, with a line when they start and every ``REPORT_SECONDS`` after."""
    log.info("transaction xid %s (commit LSN %s): converting its %s changes", txn.xid, format_lsn(txn.commit_lsn),
             f"{total:,}")
    started = last = time.monotonic()
    for done, change in enumerate(txn.changes, 1):
        if not done % 4096 and (now := time.monotonic()) - last >= REPORT_SECONDS:
            last = now
            log.info("transaction xid %s: %s of %s changes converted (%.0fs)", txn.xid, f"{done:,}", f"{total:,}",
                     now - started)
        yield change


#: Per relation OID in a plain transaction: its schema version, converter, short reader and row changes.
_PlainTable = tuple[SchemaVersion, Callable[[TupleData], tuple[Any, ...]], Callable[[bytes, int], TableChange | None],
                    list[TableChange]]


def _table_batches(by_table: dict[int, list[tuple[SchemaVersion, TableChange]]],
                   txn: CommittedTransaction) -> list[TableBatch]:
    """Each relation's row changes of ``txn`` (or of a piece of it) as its batches (``_batches_of``)."""
    return [b for oid, rows in by_table.items() for b in _batches_of(oid, rows, txn)]


def _batches_of(oid: int, rows: list[tuple[SchemaVersion, TableChange]],
                txn: CommittedTransaction) -> list[TableBatch]:
    """One batch per run of changes decoded with the same schema version (the sink aligns runs)."""
    out: list[TableBatch] = []
    run: list[TableChange] = []
    schema = rows[0][0]
    same = {id(schema)}  # objects of the run's version: a spill reads each chunk's back as objects of its own
    for version, row in rows:
        if id(version) not in same:
            if version == schema:
                same.add(id(version))
            else:
                out.append(TableBatch(oid, schema.namespace, schema.relation.name, schema, txn.commit_lsn,
                                      txn.end_lsn, run, txn.commit_time))
                run, schema, same = [], version, {id(version)}
        run.append(row)
    out.append(TableBatch(oid, schema.namespace, schema.relation.name, schema, txn.commit_lsn, txn.end_lsn, run,
                          txn.commit_time))
    return out
