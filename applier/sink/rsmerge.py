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

from applier.infra.deltars import deltars_path
from applier.sink.merge import OP_COL, CommitResult, arrow_table, key_range
from applier.sink.plan import TablePlan

if TYPE_CHECKING:
    from pyspark.sql.types import StructType


def _q(name: str) -> str:
    """An identifier for delta-rs's SQL (DataFusion): double-quoted, quotes doubled."""
    return '"' + name.replace('"', '""') + '"'


def deltars_plan_ok(plan: TablePlan) -> bool:
    """Whether ``apply_plan_deltars`` takes this plan (see the module docstring)."""
    if plan.multiset or not plan.key_positions:
        return False
    for entry in plan.keyed.values():
        if entry.row is not None and entry.unresolved:
            return False
        key = entry.lookup_key if entry.row is None else tuple(entry.row[p] for p in plan.key_positions)
        if key is None or any(v is None for v in key):
            return False
    return True


def apply_plan_deltars(path: str, schema: StructType, plan: TablePlan, *, app_id: str, version: int,
                       description: str, may_be_empty: bool = True) -> CommitResult | None:
    """The one commit ``plan`` describes, through delta-rs; None when a value does not convert to
    Arrow exactly or the table has columns the source no longer has (the caller then takes the Spark
    path, which takes every value and fills such columns with NULL)."""
    from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
    from pyspark.sql.types import StringType, StructField
    from pyspark.sql.types import StructType as SparkStruct

    table = DeltaTable(deltars_path(path))
    done = table.transaction_version(app_id)
    if done is not None and int(done) >= version:  # what Spark's idempotent write does: nothing
        return CommitResult(0, 0, plan.truncated)
    names = [f.name for f in schema.fields]
    if [f.name for f in table.schema().fields] != names:
        return None  # columns dropped in the source stay in Delta: Spark fills them with NULL, delta-rs refuses
    properties = CommitProperties(app_transactions=[Transaction(app_id, version)],
                                  custom_metadata={"userMetadata": description})
    upserts = [e.row for e in plan.keyed.values() if e.row is not None]
    if plan.truncated or (may_be_empty and not table.file_uris()):
        data = arrow_table(upserts, schema)
        if data is None:
            return None
        write_deltalake(table, data, mode="overwrite" if plan.truncated else "append",
                        commit_properties=properties)
        return CommitResult(len(upserts), 0, plan.truncated)

    ncols = len(names)
    rows: list[tuple[Any, ...]] = []
    deletes = 0
    for entry in plan.keyed.values():
        if entry.row is None:
            deletes += 1
            row: list[Any] = [None] * ncols
            for p, v in zip(plan.key_positions, entry.lookup_key or (), strict=True):
                row[p] = v
            rows.append((*row, "D"))
        else:
            rows.append((*entry.row, "U"))
    source = arrow_table(rows, SparkStruct([*schema.fields, StructField(OP_COL, StringType(), False)]))
    if source is None:
        return None
    keys = [names[p] for p in plan.key_positions]
    predicate = " AND ".join(f"t.{_q(k)} = s.{_q(k)}" for k in keys)
    bounds = key_range([r[plan.key_positions[0]] for r in rows])
    if bounds is not None and all(type(b) is int for b in bounds):
        # lets delta-rs skip the files whose key statistics lie outside the batch (a catch-up's
        # changes touch recent keys: 0.4 s instead of 1.0-1.6 s for 1M rows into a 4M-row table)
        first = f"t.{_q(keys[0])}"
        predicate = f"{first} >= {bounds[0]} AND {first} <= {bounds[1]} AND {predicate}"
    assignments = {_q(n): f"s.{_q(n)}" for n in names}
    op = f"s.{_q(OP_COL)}"
    (table.merge(source, predicate=predicate, source_alias="s", target_alias="t", commit_properties=properties)
     .when_matched_delete(predicate=f"{op} = 'D'")
     .when_matched_update(updates=assignments, predicate=f"{op} = 'U'")
     .when_not_matched_insert(updates=assignments, predicate=f"{op} = 'U'")
     .execute())
    return CommitResult(len(upserts), deletes, False)
