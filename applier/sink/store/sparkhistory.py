"""Spark's history commit: a history table's plan (applier.sink.history) as one idempotent MERGE
(delta-rs's is applier.sink.store.rshistory; the Spark store calls this one for what delta-rs declines).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from applier.sink.history import END_AT, END_LSN, KIND, START_LSN, HistoryPlan, history_app_id
from applier.sink.naming import quote_identifier as q
from applier.sink.store.sparkbase import idempotent_write
from applier.sink.store.sparkmerge import null_safe_all, source_frame

if TYPE_CHECKING:
    from pyspark.sql import Column, SparkSession

    from applier.sink.spec import TableSpec


def commit_history(spark: SparkSession, path: str, spec: TableSpec, plan: HistoryPlan, *, version: int,
                   description: str, app_id: str | None = None) -> int:
    """Write ``plan`` in one idempotent commit (``app_id``: the history's own, by default); returns the
    versions it wrote or changed."""
    import pyarrow as pa
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    app_id = app_id if app_id is not None else history_app_id(spec.source_name)
    names = list(spec.column_names)
    rows = [(*r, "U") for r in plan.updates] + [(*r, "I") for r in plan.inserts]
    source = source_frame(spark, rows, pa.schema([*spec.schema, pa.field(KIND, pa.string())]))
    key_names = list(spec.key_columns)
    cond = (F.col(f"s.{KIND}") == "U") & F.col(f"t.{END_LSN}").isNull() & \
        (F.col(f"t.{START_LSN}") == F.col(f"s.{START_LSN}")) & null_safe_all("t", "s", key_names)
    values: dict[str, str | Column] = {q(n): F.col(f"s.{q(n)}") for n in names}
    merge = (DeltaTable.forPath(spark, path).alias("t").merge(source.alias("s"), cond)
             .whenMatchedUpdate(set=values)
             .whenNotMatchedInsert(condition=F.col(f"s.{KIND}") == "I", values=values))
    if plan.truncate is not None:
        lsn, at = plan.truncate
        merge = merge.whenNotMatchedBySourceUpdate(
            condition=F.col(f"t.{END_LSN}").isNull(),
            set={END_LSN: F.lit(lsn), END_AT: F.lit(at).cast("timestamp")})
    with idempotent_write(spark, app_id, version, description):
        merge.execute()
    return len(rows)
