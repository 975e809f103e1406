"""Decoded messages -> per-table batches of row images, one group per committed transaction.

Joins the assembler (transactions), the values layer (TupleData -> values) and the origin filter,
and hands the engine what it applies: ``(end_lsn, [TableBatch, ...])`` in commit order.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from applier.assembly import CommittedTransaction, PreparedStore, TransactionAssembler
from applier.assembly.order import OrderChecker
from applier.assembly.rowimage import RowImage, row_images
from applier.assembly.transactions import SkippedTransaction
from applier.catalog import RelationCache, SchemaVersion  # noqa: F401
from applier.config import ApplySettings
from applier.errors import ApplierError, DecodeError
from applier.infra.crashpoints import crashpoint
from applier.infra.fastobj import fast_constructor
from applier.lsn import format_lsn, parse_lsn
from applier.protocol.decoder import MessageDecoder
from applier.protocol.messages import LogicalMessage, Message, TupleData
from applier.sink.engine import TableBatch, TableChange
from applier.state import StateDir
from applier.values import RowConverter

log = logging.getLogger(__name__)


class TransactionFeeder:
    def __init__(self, catalog: RelationCache, assembler: TransactionAssembler, settings: ApplySettings) -> None:
        self.catalog = catalog
        self.assembler = assembler
        self.settings = settings
        self._converters: dict[int, RowConverter] = {}  # id(SchemaVersion) -> converter
        self._keep: list[SchemaVersion] = []  # keeps ids stable
        self.messages: list[tuple[int, LogicalMessage]] = []
        self.skipped_by_origin = 0
        self.skipped: list[SkippedTransaction] = []  # skipped since the last save, for the audit table
        self.order = OrderChecker()  # refuses swapped, reordered or doubled messages (order.py)
        assembler.on_session_start = self.order.session_start

    @classmethod
    def from_state(cls, state: StateDir, settings: ApplySettings, *,
                   catalog_json: dict[str, Any] | None = None) -> TransactionFeeder:
        """A feeder whose catalog is ``catalog_json`` (a RelationCache.to_json) or the state's saved one.

        The transactions to skip are the configured ones plus every one skipped before (the state's
        ``skipped`` list), so a replay from the start of a log leaves them out again."""
        saved = catalog_json if catalog_json is not None else state.load("catalog")
        catalog = RelationCache.from_json(saved) if saved else RelationCache()
        skip = {parse_lsn(v) for v in settings.skip_transactions}
        skip |= {parse_lsn(v) for v in state.load("skipped") or []}
        feeder: TransactionFeeder
        assembler = TransactionAssembler(
            catalog, prepared=PreparedStore(state.staging_dir),
            memory_budget_bytes=settings.memory_budget_mb << 20, spill_dir=state.spill_dir,
            on_message=lambda m, lsn: feeder.messages.append((lsn, m)),
            skip_lsns=frozenset(skip), on_skip=lambda s: feeder._skipped(s))
        feeder = cls(catalog, assembler, settings)
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

    def record_skipped(self, spark: Any, state: StateDir) -> None:
        """Write the skips since the last call to the audit table and the state (before the
        transactions after them are confirmed to the server)."""
        if not self.skipped:
            return
        from applier.sink.audit import record_skips

        record_skips(spark, str(state.skipped_table), self.skipped)
        done = set(state.load("skipped") or []) | {format_lsn(s.commit_lsn) for s in self.skipped}
        state.save("skipped", sorted(done, key=parse_lsn))
        self.skipped.clear()

    def feed_raw(self, decoder: MessageDecoder, lsn: int, xid: int | None,
                 data: bytes) -> list[tuple[CommittedTransaction, list[TableBatch]]]:
        """Decode one raw message and feed it. Bytes that do not decode are held against their
        transaction (it stops the run at its commit, with its commit LSN, unless it aborts or is
        listed to skip) or raised at once when they break the stream's framing."""
        in_stream = decoder.in_stream
        if problems := self.order.check(lsn, data):
            raise problems[0].error()
        try:
            msg = decoder.decode(data, lsn)
        except DecodeError as e:
            e.add_context(xid=xid or None, relation=self._relation_named_in(data, in_stream))
            self.assembler.feed_error(lsn, e)
            return []
        crashpoint("decode")
        return list(self.feed(lsn, msg))

    def _relation_named_in(self, data: bytes, in_stream: bool) -> str | None:
        """The relation a (possibly damaged) I/U/D message names, when its OID is readable and known."""
        if data[:1] not in (b"I", b"U", b"D"):
            return None
        at = 5 if in_stream else 1
        if len(data) < at + 4:
            return None
        oid = int.from_bytes(data[at:at + 4], "big")
        if oid not in self.catalog:
            return f"OID {oid}"
        return self.catalog.get(oid).qualified_name

    def _convert(self, schema: SchemaVersion, tup: TupleData) -> tuple[Any, ...]:
        conv = self._converters.get(id(schema))
        if conv is None:
            conv = RowConverter(schema, self.catalog.types, self.settings.special_values)
            self._converters[id(schema)] = conv
            self._keep.append(schema)
        return conv.convert(tup)

    def feed(self, lsn: int, msg: Message) -> Iterator[tuple[CommittedTransaction, list[TableBatch]]]:
        """Committed transactions completed by this message, with their batches. Call
        ``applied(txn)`` once the transaction's Delta commits exist (drops staged prepares)."""
        for txn in self.assembler.feed(lsn, msg):
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
        by_table: dict[int, list[RowImage]] = {}
        for change in txn.changes:
            if isinstance(change.message, LogicalMessage):
                self.messages.append((change.lsn, change.message))
                continue
            try:
                for image in row_images(change, self._convert):
                    by_table.setdefault(image.schema.relation.oid, []).append(image)
            except ApplierError as e:  # a value the values layer refused: say where it is in the stream
                relation = change.schemas[0].qualified_name if change.schemas else None
                e.add_context(lsn=change.lsn, xid=txn.xid, commit_lsn=txn.commit_lsn, relation=relation)
                raise
        return [b for oid, images in by_table.items() for b in _batches_of(oid, images)]


def _batches_of(oid: int, images: list[RowImage]) -> list[TableBatch]:
    """One batch per run of images decoded with the same schema version (the engine aligns runs)."""
    out: list[TableBatch] = []
    run: list[TableChange] = []
    schema = images[0].schema
    for im in images:
        if im.schema is not schema:
            out.append(TableBatch(oid, schema.namespace, schema.relation.name, schema, run))
            run, schema = [], im.schema
        run.append(_table_change(im))
    out.append(TableBatch(oid, schema.namespace, schema.relation.name, schema, run))
    return out


_make_table_change = fast_constructor(TableChange)


def _table_change(im: RowImage) -> TableChange:
    if im.op == "T":
        return _make_table_change("T", None, None, None, im.restart_identity, im.cascade)
    if im.old_kind == "full":
        return _make_table_change(im.op, None, im.old, im.new)
    return _make_table_change(im.op, im.identity_key, None, im.new)
