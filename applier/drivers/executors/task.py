"""Step 2, on an executor: one range decoded, assembled and folded, and the fold (un)pickled for
the trip back to the driver. Spark ships ``fold_pickled`` and ``collect`` by reference (module
path): this module must stay importable on an executor, without a SparkSession.
"""

from __future__ import annotations

import pickle
import shutil
import tempfile
import time
from collections.abc import Iterable
from typing import Any

from applier.changes import OP_TRUNCATE
from applier.drivers.executors.ranges import FoldJob, RangeFold, range_columns
from applier.errors import ApplierError, SinkError
from applier.infra.gcpolicy import after_group, collect_between_groups
from applier.sink.fold import FoldedTable, fold_table, key_runs, table_spec
from applier.sink.plan import _NO_COLUMNS, KeyedRow, TablePlan
from applier.state import StateDir
from applier.storage.options import put_in_force


def fold_range(job: FoldJob) -> RangeFold:
    """Decode, assemble and fold one range, exactly as the driver path would (see applier.drivers.executors)."""
    from applier.drivers.executors.columnar import fold_range_columnar
    from applier.protocol.decoder import MessageDecoder

    started, cpu_started = time.monotonic(), time.thread_time()
    for options in job.storage:
        put_in_force(options)
    result = RangeFold(job.range.index)
    scratch = tempfile.mkdtemp(prefix="applier-fold-")
    try:
        lsns, xids, datas = range_columns(job.range)
        columnar = fold_range_columnar(job, _feeder(job, scratch), MessageDecoder(), lsns, datas)
        if columnar is not None:
            columnar.seconds = time.monotonic() - started
            columnar.cpu_seconds = time.thread_time() - cpu_started
            return columnar
        feeder = _feeder(job, scratch)
        feeder.messages = result.messages
        feeder.skipped = result.skipped
        decoder = MessageDecoder()
        per_path: dict[str, list[Any]] = {}
        truncate_error = job.apply.truncate == "error"
        tables = job.tables
        for txn, batches in feeder.feed_range(decoder, lsns, xids, datas):
            result.transactions += 1
            result.last_end_lsn = txn.end_lsn
            result.last_commit_time = txn.commit_time
            for batch in batches:
                qualified = batch.qualified_name
                if not tables.selected(qualified):
                    continue
                if truncate_error and any(c.op == OP_TRUNCATE for c in batch.changes):
                    raise SinkError("TRUNCATE received and apply.truncate is 'error'", table=qualified,
                                    end_lsn=txn.end_lsn)
                path = job.paths[(batch.namespace, batch.name)]
                misbound = job.misbound(path, batch.relation_oid, qualified)
                if misbound is not None:
                    raise SinkError(misbound, table=qualified, end_lsn=txn.end_lsn)
                done = job.done.get(path)
                if done is None or txn.end_lsn > done:
                    per_path.setdefault(path, []).append(batch)
            feeder.assembler.release(txn)
            feeder.applied(txn)
        types = feeder.types
        for path, batches in per_path.items():
            if len(key_runs(list(enumerate(batches)), tables)) > 1:
                raise SinkError("the table's merge key changes inside this range (a key added or dropped, "
                                "REPLICA IDENTITY set to or from FULL): it is folded on the driver, one part "
                                "per key", table=batches[-1].qualified_name)
            spec = table_spec(batches[-1], tables, types)
            result.folded.append(FoldedTable(path, spec, batches[-1].schema, fold_table(spec, batches)))
    except ApplierError as e:
        result = RangeFold(job.range.index, error=str(e))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    result.seconds = time.monotonic() - started
    result.cpu_seconds = time.thread_time() - cpu_started
    return result


def _feeder(job: FoldJob, scratch: str) -> Any:
    """A fresh feeder with the catalog at the range's start."""
    from applier.assembly.feeder import TransactionFeeder

    return TransactionFeeder.from_state(StateDir(scratch), job.apply, catalog_json=job.range.catalog,
                                        check_order=False)


def imported(_: object) -> bytes:
    """The warm-up task (scheduler.warm_up): the modules a range's fold needs, imported."""
    import applier.assembly.feeder  # noqa: F401
    import applier.drivers.executors.columnar  # noqa: F401
    import applier.protocol.decoder  # noqa: F401

    return b""


def fold_pickled(job: FoldJob) -> bytes:
    """The task: a range's fold, pickled for the driver, with the automatic garbage collector off as in
    the driver path's loop (applier.infra.gcpolicy: it would scan the range's objects again and again)."""
    with collect_between_groups():
        fold = fold_range(job)
        packed = [(t.path, t.spec, t.schema, _packed(t.plan)) for t in fold.folded]
        fold.folded = []
        payload = pickle.dumps((fold, packed), protocol=pickle.HIGHEST_PROTOCOL)
        del fold, packed
        after_group()
    return payload


def unpickled_fold(payload: bytes) -> RangeFold:
    fold, packed = pickle.loads(payload)
    fold.folded = [FoldedTable(path, spec, schema, _unpacked(plan)) for path, spec, schema, plan in packed]
    assert isinstance(fold, RangeFold)
    return fold


def _packed(plan: TablePlan) -> tuple[Any, ...]:
    """A plan as lists and tuples: pickled ten times faster than its KeyedRow objects (a fold of a
    range holds one per key), which made (un)pickling a third of the work. Columnar entries stay
    Arrow columns (pickled as Arrow buffers)."""
    plan_fields = (plan.columns, plan.key_positions, plan.truncated, plan.restart_identity, plan.cascade,
                   plan.counts, plan.images, plan.changes, plan.soft_delete, plan.external)
    if plan.columnar is not None:
        return plan_fields, plan.columnar
    keyed = plan.keyed
    rows = [e.row for e in keyed.values()]
    special = [(i, e.unresolved, e.lookup_key) for i, e in enumerate(keyed.values())
               if e.unresolved or e.lookup_key is not None]
    return plan_fields, list(keyed), rows, special


def _unpacked(packed: tuple[Any, ...]) -> TablePlan:
    plan_fields = packed[0]
    columns, key_positions, truncated, restart_identity, cascade, counts, images, changes, soft, external = plan_fields
    plan = TablePlan(columns, key_positions, truncated, restart_identity, cascade, counts=counts, images=images,
                     changes=changes, soft_delete=soft, external=external)
    if len(packed) == 2:
        plan.columnar = packed[1]
        return plan
    _, keys, rows, special = packed
    entries = [KeyedRow(row, _NO_COLUMNS, None) for row in rows]
    for i, unresolved, lookup in special:
        entries[i] = KeyedRow(rows[i], unresolved, lookup)
    plan.keyed = dict(zip(keys, entries, strict=True))
    return plan


def collect(iterator: Iterable[bytes]) -> list[bytes]:
    return list(iterator)
