"""One table's copy: where its rows come from, how they are converted and where they go; what the
driver's copy workers (``applier.drivers.initial_copy``) and Spark's executors
(``applier.drivers.executor_copy``) are both given."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from applier.sources.copy import CopyPlan, arrow_types, plan_table
from applier.values import RowConverter, SpecialValuePolicy, arrow_schema_for

if TYPE_CHECKING:
    import psycopg

    from applier.catalog import SchemaVersion, TypeCache
    from applier.config import SnapshotSettings
    from applier.protocol.messages import Relation
    from applier.sink.bulkload import SnapshotLoader, TeeLoader
    from applier.sink.engine import DeltaApplier
    from applier.sources.publication import PublishedTable


@dataclass
class CopyJob:
    """One table's copy: where its rows come from, how they are converted and where they go."""

    table: PublishedTable
    relation: Relation
    plan: CopyPlan
    loader: SnapshotLoader | TeeLoader
    converter: RowConverter
    arrow_types: list[Any] | None  # None: every chunk takes the per-value path
    chunks_left: int = 0
    started: float | None = None
    finished: float | None = None
    rows: int = field(default=0)
    per_value_chunks: int = 0  # chunks of a fast-path table copied per value (special values in them)


def copy_job(snap: psycopg.Connection, table: PublishedTable, relation: Relation, schema: SchemaVersion, *,
             applier: DeltaApplier, types: TypeCache, lsn: int, settings: SnapshotSettings,
             special_values: SpecialValuePolicy) -> CopyJob:
    """How one table is copied under the snapshot ``snap`` holds, its copy tagged with ``lsn``: the one
    way both the mirror's first copy and a table sync (a table added later, or copied again) read a
    table, so both take the typed fast path and commit alike."""
    converter = RowConverter(schema, types, special_values)
    plan = plan_table(snap, table, relation, chunk_mb=settings.chunk_mb)
    loader = applier.snapshot_loader(schema, lsn, commit_bytes=settings.commit_mb << 20,
                                     large=plan.bytes >= settings.commit_mb << 20)
    fast = arrow_types(relation, types, arrow_schema_for(schema, types))
    return CopyJob(table, relation, plan, loader, converter, fast)
