"""delta-rs first, Spark where it declines: the one object the picker hands out for a table delta-rs
writes (or reads), so that no caller writes the fallback itself.

Why: delta-rs declines some operations it cannot make exactly as Spark would (``None`` from ``merge``,
``merge_history``, ``rows_by_key``, ``evolve``, ``replace_empty``, ``fill_columns``, ``optimize``),
and Spark's store then makes them. That was written by hand at every call site, each asking which
class its store was; here it is written once. Spark's store is built only when delta-rs declines
(its session, a provider, is started by the operation that needs it).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from applier.sink.store.base import CommitResult, CommitTag, WriteMode
from applier.sink.store.deltars import DeltaRsStore
from applier.sink.store.spark import SparkStore

if TYPE_CHECKING:
    import pyarrow as pa

    from applier.sink.history import HistoryPlan
    from applier.sink.plan import TablePlan
    from applier.sink.spec import Renames, RewritePolicy, SchemaEvolution, TableOptions, TableSpec
    from applier.spark.session import SparkLike


class FallbackStore:
    """``preferred`` (delta-rs) for every operation; Spark's store (on ``spark``) for one it declines.
    ``why``: what starting Spark for a declined operation is logged as (None: the operation's own)."""

    name = "delta-rs"
    #: whether its operations may need Spark even when nothing is declined (no: delta-rs's)
    uses_spark = False

    def __init__(self, preferred: DeltaRsStore, spark: SparkLike | None, *, why: str | None = None) -> None:
        self.preferred = preferred
        self.spark = spark
        self.why = why

    def fallback(self) -> SparkStore:
        """Spark's store, which makes every change Delta makes: what delta-rs declines goes to it."""
        return SparkStore(self.spark, why=self.why)

    # --- reading: delta-rs's ----------------------------------------------------------------------

    def exists(self, path: str) -> bool:
        return self.preferred.exists(path)

    def applied_version(self, path: str, app_id: str) -> int | None:
        return self.preferred.applied_version(path, app_id)

    def version(self, path: str) -> int:
        return self.preferred.version(path)

    def columns(self, path: str) -> tuple[str, ...]:
        return self.preferred.columns(path)

    def schema_fields(self, path: str) -> list[dict[str, Any]]:
        return self.preferred.schema_fields(path)

    def configuration(self, path: str) -> dict[str, str]:
        return self.preferred.configuration(path)

    def reader_protocol(self, path: str) -> tuple[int, tuple[str, ...]]:
        return self.preferred.reader_protocol(path)

    def is_empty(self, path: str) -> bool:
        return self.preferred.is_empty(path)

    def scan(self, path: str, columns: Sequence[str], *, unless: str | None = None) -> Iterator[tuple[Any, ...]]:
        return self.preferred.scan(path, columns, unless=unless)

    def table_id(self, path: str) -> str | None:
        return self.preferred.table_id(path)

    def rows_by_key(self, path: str, schema: pa.Schema, key_columns: Sequence[str],
                    keys: Sequence[tuple[Any, ...]] | None, *, open_only: str | None = None,
                    unless: str | None = None) -> dict[object, list[Any]]:
        rows = self.preferred.rows_by_key(path, schema, key_columns, keys, open_only=open_only, unless=unless)
        if rows is None:  # not read as Spark reads it
            rows = self.fallback().rows_by_key(path, schema, key_columns, keys, open_only=open_only, unless=unless)
        return rows

    # --- writing: delta-rs's, Spark's where delta-rs declines -----------------------------------------

    def create(self, path: str, spec: TableSpec, options: TableOptions, properties: Mapping[str, str]) -> None:
        self.preferred.create(path, spec, options, properties)

    def set_properties(self, path: str, properties: Mapping[str, str], *,
                       carry: tuple[str, int] | None = None) -> None:
        self.preferred.set_properties(path, properties, carry=carry)

    def write_arrow(self, path: str, table: Any, *, mode: WriteMode, tag: CommitTag | None,
                    schema: pa.Schema | None = None) -> None:
        self.preferred.write_arrow(path, table, mode=mode, tag=tag, schema=schema)

    def evolve(self, path: str, spec: TableSpec, renames: Renames | None, *,
               rename: RewritePolicy | None = None) -> SchemaEvolution:
        evolution = self.preferred.evolve(path, spec, renames, rename=rename)
        if evolution is None:  # a rename, a retype, a feature: Spark makes every change Delta makes
            evolution = self.fallback().evolve(path, spec, renames, rename=rename)
        return evolution

    def merge(self, path: str, schema: pa.Schema, plan: TablePlan, *, app_id: str, version: int,
              description: str, may_be_empty: bool = True) -> CommitResult:
        result = self.preferred.merge(path, schema, plan, app_id=app_id, version=version, description=description,
                                      may_be_empty=may_be_empty)
        if result is None:
            result = self.fallback().merge(path, schema, plan, app_id=app_id, version=version,
                                           description=description, may_be_empty=may_be_empty)
        return result

    def merge_history(self, path: str, spec: TableSpec, plan: HistoryPlan, *, app_id: str, version: int,
                      description: str) -> int:
        written = self.preferred.merge_history(path, spec, plan, app_id=app_id, version=version,
                                               description=description)
        if written is None:
            written = self.fallback().merge_history(path, spec, plan, app_id=app_id, version=version,
                                                    description=description)
        return written

    def replace_empty(self, path: str, spec: TableSpec) -> bool:
        replaced = self.preferred.replace_empty(path, spec)
        return self.fallback().replace_empty(path, spec) if replaced is None else replaced

    def fill_columns(self, path: str, spec: TableSpec, values: Mapping[str, object]) -> bool:
        filled = self.preferred.fill_columns(path, spec, values)
        return self.fallback().fill_columns(path, spec, values) if filled is None else filled

    def optimize(self, path: str, z_order: list[str], target_size: int | None) -> Mapping[str, Any]:
        metrics = self.preferred.optimize(path, z_order, target_size)
        return self.fallback().optimize(path, z_order, target_size) if metrics is None else metrics

    def vacuum(self, path: str, retention_hours: int | None, *, dry_run: bool, enforce_retention: bool) -> int | None:
        return self.preferred.vacuum(path, retention_hours, dry_run=dry_run, enforce_retention=enforce_retention)
