"""Execute a keyed :class:`TablePlan` through delta-rs instead of Spark, when that gives the same commit.

Why: a Spark MERGE costs seconds per commit on a small machine whatever its size (a job, the
JVM's first Delta log read, 300 k rows in about 5 s on 2 cores), while delta-rs merges the fold's
Arrow table in the Python process (500 k rows in about 0.5 s, bench/RESULTS.md). The commit is
the same Delta commit: the same rows, the applied version as the same ``txn`` action Spark's
idempotent writes record, the same ``userMetadata``; Spark, delta-rs and every other reader see
one table.

Which plans: keyed tables whose fold resolved every unchanged-TOAST value itself (no lookup in the
target) and whose keys hold no NULL, i.e. the common case. A multiset (key-less) table, a plan that
must read TOAST values from the target, and a table delta-rs cannot write (type widening, column
mapping, a path holding ``%``) go through Spark (applier.sink.merge). The caller decides per table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from applier.sink.store.arrow import OP_COL, arrow_table
from applier.sink.store.base import CommitResult

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

    from applier.sink.plan import TablePlan
    from applier.sink.store.deltars import DeltaRsStore


def _q(name: str) -> str:
    """An identifier for delta-rs's SQL (DataFusion): double-quoted, quotes doubled."""
    return '"' + name.replace('"', '""') + '"'


def apply_plan_deltars(store: DeltaRsStore, path: str, schema: StructType, plan: TablePlan, *, app_id: str,
                       version: int, description: str, may_be_empty: bool = True) -> CommitResult | None:
    """The one commit ``plan`` describes, through delta-rs; None when delta-rs would not make the same
    commit (the caller then takes the Spark path): a key-less plan, a row that must take unchanged
    TOAST values from the target, a NULL key, a value that does not convert to Arrow exactly, or a
    table with columns the source no longer has (Spark fills them with NULL, delta-rs refuses)."""
    import pyarrow.compute as pc
    from deltalake import CommitProperties, Transaction, write_deltalake
    from pyspark.sql.types import StringType, StructField
    from pyspark.sql.types import StructType as SparkStruct

    if plan.multiset:
        return None
    names = [f.name for f in schema.fields]
    ncols = len(names)
    rows: list[tuple[Any, ...]] = []
    upserts = deletes = 0
    for entry in plan.keyed.values():  # one pass: the checks cost nothing extra on a million keys
        if entry.row is None:
            deletes += 1
            row: list[Any] = [None] * ncols
            for p, v in zip(plan.key_positions, entry.lookup_key or (), strict=True):
                row[p] = v
            rows.append((*row, "D"))
        elif entry.unresolved:
            return None
        else:
            upserts += 1
            rows.append((*entry.row, "U"))
    source = arrow_table(rows, SparkStruct([*schema.fields, StructField(OP_COL, StringType(), False)]))
    if source is None or any(source.column(p).null_count for p in plan.key_positions):
        return None

    table = store.open(path)
    done = table.transaction_version(app_id)
    if done is not None and int(done) >= version:  # what Spark's idempotent write does: nothing
        return CommitResult(0, 0, plan.truncated)
    if [f.name for f in table.schema().fields] != names:
        return None
    properties = CommitProperties(app_transactions=[Transaction(app_id, version)],
                                  custom_metadata={"userMetadata": description})
    if plan.truncated or (may_be_empty and not table.file_uris()):
        upserted = source.filter(pc.equal(source.column(ncols), "U")).drop_columns([OP_COL])
        write_deltalake(table, upserted, mode="overwrite" if plan.truncated else "append",
                        commit_properties=properties)
        return CommitResult(upserts, 0, plan.truncated)

    keys = [names[p] for p in plan.key_positions]
    predicate = " AND ".join(f"t.{_q(k)} = s.{_q(k)}" for k in keys)
    first = source.column(plan.key_positions[0])
    if _integer_type(first.type) and len(first):
        # lets delta-rs skip the files whose key statistics lie outside the batch (a catch-up's
        # changes touch recent keys: 0.4 s instead of 1.0-1.6 s for 1M rows into a 4M-row table)
        bounds = pc.min_max(first)
        column = f"t.{_q(keys[0])}"
        predicate = (f"{column} >= {int(bounds['min'].as_py())} AND {column} <= {int(bounds['max'].as_py())} "
                     f"AND {predicate}")
    assignments = {_q(n): f"s.{_q(n)}" for n in names}
    op = f"s.{_q(OP_COL)}"
    (table.merge(source, predicate=predicate, source_alias="s", target_alias="t", commit_properties=properties)
     .when_matched_delete(predicate=f"{op} = 'D'")
     .when_matched_update(updates=assignments, predicate=f"{op} = 'U'")
     .when_not_matched_insert(updates=assignments, predicate=f"{op} = 'U'")
     .execute())
    return CommitResult(upserts, deletes, False)


def _integer_type(t: Any) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_integer(t))
