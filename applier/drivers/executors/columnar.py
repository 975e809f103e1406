"""Step 2's fast path: a range of plain transactions folded column by column (``apply.columnar_fold``).

A backlog is mostly plain transactions (Begin, Inserts, Updates and Deletes, Commit), and the fold of
a range of them is where a catch-up's CPU goes (bench/RESULTS.md: 5-10 us a change one message at a
time). Here the whole range is read at once: its messages' kinds and relations as numpy arrays
(applier.protocol.columnar), every column's values as one Arrow array converted by the copy's readers
(applier.sources.typedcopy), and each table's keys folded by a sort (applier.sink.columnfold).

It answers for a range only when every part of it is the plain case, and returns None otherwise,
before it has changed anything but the scratch feeder it was given; task.fold_range then folds the
range the reference way (message by message), which is also what reports any error. The plain case:
only Begin, Relation, Type, Insert, Update, Delete, Truncate and Commit messages, whole transactions, no commit
to skip, a Relation that changes nothing once its table's changes began, and for every selected
table a key the rows are merged on that is its replica identity, no excluded, metadata or soft-delete
columns, only text and NULL values of types the copy reads in bulk, old tuples that hold the key only.
tests/unit/sink/test_columnar_fold.py (captured streams, damaged messages) and
tests/integration/test_columnar_workload.py (a random workload of many types) hold both ways to the
same RangeFold on random ranges. A mirror's backlog on a local Spark runs the same fold_range in the
mirror's process (scheduler.fold_in_process), so this path is taken there too.
"""

from __future__ import annotations

from collections.abc import Sequence
from struct import error as StructError
from typing import TYPE_CHECKING, Any

from applier.catalog.batches import TableBatch
from applier.drivers.executors.ranges import FoldJob, RangeFold
from applier.errors import ApplierError
from applier.protocol.columnar import commit_fields, message_block, relation_oids, scan_row_messages, text_values
from applier.protocol.headers import BEGIN, COMMIT, DELETE, INSERT, OLD_KEY, RELATION, TRUNCATE, TYPE, UPDATE
from applier.protocol.messages import Relation, Truncate, Type
from applier.sink.columnfold import fold_keyed_columns
from applier.sink.fold import FoldedTable, table_spec
from applier.sink.plan import TablePlan
from applier.sink.zerocol import is_zero_column
from applier.sources.typedcopy import column_readers, text_column
from applier.values import arrow_schema_for

if TYPE_CHECKING:
    import numpy as np

    from applier.assembly.feeder import TransactionFeeder
    from applier.protocol.decoder import MessageDecoder


def fold_range_columnar(job: FoldJob, feeder: TransactionFeeder, decoder: MessageDecoder, lsns: Sequence[int],
                        datas: Sequence[bytes]) -> RangeFold | None:
    """The range's RangeFold made column by column, or None when the range is not the plain case (see
    the module). ``feeder`` and ``decoder`` are fresh, and spoiled for any other use afterwards."""
    if not job.apply.columnar_fold or not datas:
        return None
    try:
        return _fold(job, feeder, decoder, lsns, datas)
    except (ApplierError, StructError, ValueError, KeyError):  # the reference path says what is wrong
        return None


def _fold(job: FoldJob, feeder: TransactionFeeder, decoder: MessageDecoder, lsns: Sequence[int],
          datas: Sequence[bytes]) -> RangeFold | None:
    import numpy as np

    block = message_block(datas)
    kinds = block.kinds
    n = len(kinds)
    begins, commits = np.flatnonzero(kinds == BEGIN), np.flatnonzero(kinds == COMMIT)
    # whole transactions back to back: B ... C B ... C, nothing between a C and the next B
    if not begins.size or begins.size != commits.size or begins[0] != 0 or commits[-1] != n - 1 \
            or np.any(commits <= begins) or np.any(begins[1:] != commits[:-1] + 1):
        return None
    rows = (kinds == INSERT) | (kinds == UPDATE) | (kinds == DELETE)
    described = (kinds == RELATION) | (kinds == TYPE)
    truncating = kinds == TRUNCATE
    if np.count_nonzero(rows | described | truncating) + 2 * begins.size != n:
        return None
    truncates = _truncates(decoder, lsns, datas, np.flatnonzero(truncating).tolist())
    if truncates is None:
        return None
    fields = commit_fields(block, begins, commits)
    if fields is None:
        return None
    commit_lsns, end_lsns, commit_times = fields
    skip = feeder.assembler.skip_lsns
    if skip and np.isin(commit_lsns, np.fromiter(skip, dtype=np.uint64, count=len(skip))).any():
        return None
    ends, times = end_lsns.tolist(), commit_times.tolist()
    row_index = np.flatnonzero(rows)
    oids = relation_oids(block, row_index)
    first_change = _first_change(oids, row_index, truncates)
    if not _described(feeder, decoder, lsns, datas, np.flatnonzero(described).tolist(), first_change):
        return None
    result = RangeFold(job.range.index, transactions=int(begins.size), last_end_lsn=ends[-1],
                       last_commit_time=times[-1], columnar=True)
    txn_of = np.searchsorted(begins, row_index, side="right") - 1
    folded: list[tuple[int, FoldedTable]] = []
    paths: set[str] = set()
    for oid in first_change:
        mine = oids == oid
        cleared = _Truncated.of(truncates.get(oid, []), begins)
        table = _fold_table(job, feeder, block, oid, row_index[mine], txn_of[mine], end_lsns, times, cleared)
        if table is None:
            return None
        if table is _UNSELECTED:
            continue
        first, fold = table
        if fold.path in paths:  # two relations into one table: the reference path lays them out
            return None
        paths.add(fold.path)
        folded.append((first, fold))
    result.folded = [fold for _first, fold in sorted(folded, key=lambda f: f[0])]
    return result


def _first_change(oids: np.ndarray, row_index: np.ndarray,
                  truncates: dict[int, list[tuple[int, Truncate]]]) -> dict[int, int]:
    """Each relation's first change, a row's or a TRUNCATE's (message index), in the order the range
    first meets them."""
    import numpy as np

    unique, at = np.unique(oids, return_index=True)
    first = dict(zip(unique.tolist(), row_index[at].tolist(), strict=True))
    for oid, listed in truncates.items():
        first[oid] = min(first.get(oid, listed[0][0]), listed[0][0])
    return dict(sorted(first.items(), key=lambda kv: kv[1]))


def _truncates(decoder: MessageDecoder, lsns: Sequence[int], datas: Sequence[bytes],
               at: list[int]) -> dict[int, list[tuple[int, Truncate]]] | None:
    """Each relation's TRUNCATEs in the range (message index, message), or None for a message that
    does not decode as one (the reference path says what is wrong)."""
    out: dict[int, list[tuple[int, Truncate]]] = {}
    for k in at:
        msg = decoder.decode(datas[k], lsns[k])
        if not isinstance(msg, Truncate):
            return None
        for oid in dict.fromkeys(msg.relation_oids):
            out.setdefault(oid, []).append((k, msg))
    return out


class _Truncated:
    """One relation's TRUNCATEs in a range: where each is and in which transaction (the reference
    fold clears the plan at each, and ORs their options)."""

    __slots__ = ("at", "messages", "txn_of")

    def __init__(self, at: np.ndarray, messages: list[Truncate], txn_of: np.ndarray) -> None:
        self.at, self.messages, self.txn_of = at, messages, txn_of

    @classmethod
    def of(cls, listed: list[tuple[int, Truncate]], begins: np.ndarray) -> _Truncated:
        import numpy as np

        at = np.array([k for k, _msg in listed], dtype=np.int64)
        return cls(at, [msg for _k, msg in listed], np.searchsorted(begins, at, side="right") - 1)

    def after(self, done: int, end_lsns: np.ndarray) -> _Truncated:
        """Those in transactions past ``done`` (what the table applied before is not folded again)."""
        import numpy as np

        keep = end_lsns[self.txn_of] > np.uint64(done)
        return _Truncated(self.at[keep], [m for m, k in zip(self.messages, keep.tolist(), strict=True) if k],
                          self.txn_of[keep])


def _described(feeder: TransactionFeeder, decoder: MessageDecoder, lsns: Sequence[int], datas: Sequence[bytes],
               at: list[int], first_change: dict[int, int]) -> bool:
    """The Relation and Type messages into the catalog, as the assembler takes them; False when a
    Relation changes a table whose changes in this range began before it (two schema versions)."""
    catalog = feeder.catalog
    for k in at:
        msg = decoder.decode(datas[k], lsns[k])
        if isinstance(msg, Type):
            catalog.update_type(msg)
            continue
        if not isinstance(msg, Relation):
            return False
        before = catalog.get(msg.oid) if msg.oid in catalog else None
        if catalog.update(msg) is not before and first_change.get(msg.oid, k) < k:
            return False
    return all(oid in catalog for oid in first_change)


#: A relation whose table the configuration leaves out (or which has nothing after what is applied).
_UNSELECTED: Any = object()


def _fold_table(job: FoldJob, feeder: TransactionFeeder, block: Any, oid: int, index: np.ndarray,
                txn_of: np.ndarray, end_lsns: np.ndarray, times: list[int],
                cleared: _Truncated) -> tuple[int, FoldedTable] | Any | None:
    """One relation's changes folded: (its first message, the FoldedTable), _UNSELECTED, or None when
    they are not the plain case. A TRUNCATE in them makes the plan an overwrite with the rows after
    the last one (every row is still read and its keys checked, as the reference fold does)."""
    import numpy as np
    import pyarrow as pa

    schema = feeder.catalog.get(oid)
    rel = schema.relation
    if not job.tables.selected(f"{schema.namespace}.{rel.name}"):
        return _UNSELECTED
    path = job.paths.get((schema.namespace, rel.name))
    if path is None or job.misbound(path, oid, f"{schema.namespace}.{rel.name}") is not None:
        return None  # (the reference fold says why)
    done = job.done.get(path)
    if done is not None:
        keep = end_lsns[txn_of] > np.uint64(done)
        index, txn_of = index[keep], txn_of[keep]
        cleared = cleared.after(done, end_lsns)
    if not index.size and not cleared.at.size:
        return _UNSELECTED
    last = max(int(txn_of[-1]) if index.size else -1, int(cleared.txn_of[-1]) if cleared.at.size else -1)
    batch = TableBatch(oid, schema.namespace, rel.name, schema, 0, int(end_lsns[last]), (), times[last])
    types = feeder.types
    spec = table_spec(batch, job.tables, types)
    names = spec.column_names
    if spec.extra is not None or is_zero_column(spec) or not spec.key_columns or spec.floating_point_key \
            or spec.postgres_column_names != tuple(c.name for c in rel.columns):
        return None
    key_positions = tuple(names.index(k) for k in spec.key_columns)
    if key_positions != tuple(schema.key_indexes):
        return None
    readers = column_readers(rel, types, arrow_schema_for(schema, types))
    if not index.size:  # only TRUNCATEs
        return int(cleared.at[0]), FoldedTable(path, spec, schema, _truncated(
            TablePlan(tuple(names), key_positions), cleared))
    spans = scan_row_messages(block, index, len(rel.columns)) if readers is not None else None
    if spans is None or np.any((spans.old_tags != 0) & (spans.old_tags != OLD_KEY)):
        return None
    removes, sets = spans.old_tags == OLD_KEY, spans.ops != DELETE
    new_rows = []
    for column, reader in enumerate(readers):  # type: ignore[arg-type]  # (None refused above)
        values = _column(block, spans.new, column, spans.new_rows, len(index), reader)
        if values is None:
            return None
        new_rows.append(values)
    old_keys = []
    for column in key_positions:
        values = _column(block, spans.old, column, spans.old_rows, len(index), readers[column])  # type: ignore[index]
        if values is None:
            return None
        old_keys.append(values)
    plan = fold_keyed_columns(names, key_positions, removes, sets, old_keys, new_rows)
    if plan is None:
        return None
    first = int(index[0])
    if cleared.at.size:  # the rows after the last TRUNCATE, over a table it emptied
        first = min(first, int(cleared.at[0]))
        kept = index > cleared.at[-1]
        where = pa.array(np.flatnonzero(kept))
        after = fold_keyed_columns(names, key_positions, removes[kept], sets[kept],
                                   [k.take(where) for k in old_keys], [c.take(where) for c in new_rows])
        if after is None:
            return None
        after.changes = plan.changes + len(cleared.messages)
        plan = _truncated(after, cleared)
    return first, FoldedTable(path, spec, schema, plan)


def _truncated(plan: TablePlan, cleared: _Truncated) -> TablePlan:
    plan.truncated = True
    plan.restart_identity = any(m.restart_identity for m in cleared.messages)
    plan.cascade = any(m.cascade for m in cleared.messages)
    if not plan.changes:
        plan.changes = len(cleared.messages)
    return plan


def _column(block: Any, spans: Any, column: int, rows: np.ndarray, length: int, reader: Any) -> Any | None:
    """Column ``column`` of the tuples ``spans`` (of the changes ``rows``), typed, laid out over all
    ``length`` changes (NULL elsewhere); None when a value is not plain text or NULL, or must take the
    per-value path."""
    import numpy as np
    import pyarrow as pa

    raw = text_values(block, spans, column)
    typed = None if raw is None else text_column(raw, reader)
    if typed is None:
        return None
    if len(rows) == length:  # every change has this tuple (rows is then 0..length-1): no copy to lay out
        return typed
    where = np.full(length, -1, dtype=np.int64)
    where[rows] = np.arange(len(rows))
    return typed.take(pa.array(where, mask=where < 0))
