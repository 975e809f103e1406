"""Compare mirrored Delta tables with their PostgreSQL tables.

Both sides are brought to the same Python values: Postgres rows are read in text format and go
through the values layer exactly like pgoutput 't' columns do; Delta rows come back from Spark.
Each row becomes a canonical string; a table matches when the row counts and an order-independent
checksum (sum of 64-bit row digests) are equal. On a mismatch, the rows present on one side only
are listed (by key when there is one), limited to a few.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.abc import Buffer
from psycopg.adapt import Loader

from applier.sink.naming import quote_identifier
from applier.sources.sql_slot import pin_session
from applier.values import SpecialValuePolicy

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from applier.config import TablesSettings


def canonical(value: Any) -> str:
    """One deterministic text per value; equal values (as the mirror defines equality) give equal text."""
    if value is None:
        return "\\N"
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        return repr(value)
    if isinstance(value, Decimal):
        if value.is_nan():
            return "NaN"
        return format(value.normalize(), "f") if value.is_finite() else str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "\\x" + bytes(value).hex()
    if isinstance(value, datetime):
        if value.tzinfo is not None:  # instants compare in UTC
            value = value.astimezone(UTC).replace(tzinfo=None)
        return str(value.isoformat())
    if isinstance(value, (date, time)):
        return value.isoformat()
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(canonical(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{canonical(k)}:{canonical(v)}" for k, v in sorted(value.items())) + "}"
    return str(value).replace("\\", "\\\\")


def row_digest(row: Iterable[Any]) -> tuple[str, int]:
    text = "\x1f".join(canonical(v) for v in row)
    return text, int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big")


@dataclass
class TableComparison:
    source_name: str
    source_rows: int = 0
    target_rows: int = 0
    source_checksum: int = 0
    target_checksum: int = 0
    only_in_source: list[str] = field(default_factory=list)
    only_in_target: list[str] = field(default_factory=list)

    @property
    def equal(self) -> bool:
        return self.source_rows == self.target_rows and self.source_checksum == self.target_checksum


def _checksum(rows: Iterator[tuple[Any, ...]], keep: Counter[str] | None) -> tuple[int, int]:
    total, count = 0, 0
    for row in rows:
        text, digest = row_digest(row)
        total = (total + digest) % (1 << 64)
        count += 1
        if keep is not None:
            keep[text] += 1
    return count, total


class _RawText(Loader):
    """Hands back the type's output-function text as bytes (what pgoutput 't' columns carry).

    A ``::text`` cast is not the same: bool casts to 'true', char(n) loses its padding.
    """

    def load(self, data: Buffer) -> bytes:
        return bytes(data)


def postgres_rows(conn: psycopg.Connection, namespace: str, table: str, columns: list[tuple[str, int, int]],
                  converters: list[Any]) -> Iterator[tuple[Any, ...]]:
    """Rows of ``namespace.table`` as Python values, via text output and the given per-column converters."""
    pin_session(conn)
    cols = ", ".join(_pg_ident(c[0]) for c in columns)
    rel = f"{_pg_ident(namespace)}.{_pg_ident(table)}"
    with conn.transaction(), conn.cursor(name="applier_verify") as cur:  # server-side: constant memory
        for _name, oid, _typmod in columns:
            cur.adapters.register_loader(oid, _RawText)
        cur.execute(f"SELECT {cols} FROM {rel}")  # identifiers quoted; no values in the SQL
        for raw in cur:
            yield tuple(None if v is None else conv(v) for v, conv in zip(raw, converters, strict=True))


def _pg_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def delta_rows(spark: SparkSession, path: str, columns: list[str],
               soft_deleted: str | None = None) -> Iterator[tuple[Any, ...]]:
    """The Delta table's rows in ``columns``; with ``soft_deleted`` (the flag column of a table that
    keeps deleted rows) only the rows Postgres still has."""
    from datetime import datetime, timedelta

    from pyspark.sql import functions as F
    from pyspark.sql.types import TimestampType

    df = spark.read.format("delta").load(path)
    if soft_deleted is not None:
        from applier.sink.extras import live_rows

        df = live_rows(df, soft_deleted)
    df = df.select(*[quote_identifier(c) for c in columns])
    # PySpark hands TimestampType values back as naive datetimes in this process's local time zone,
    # which fails for the earliest instants (a clamped '-infinity' is 0001-01-01 UTC: year 0 in a
    # zone west of UTC). Read them as microseconds since the epoch and build UTC datetimes instead.
    instants = [isinstance(f.dataType, TimestampType) for f in df.schema.fields]
    if not any(instants):
        for row in df.toLocalIterator():
            yield tuple(row)
        return
    df = df.select(*[F.unix_micros(F.col(quote_identifier(c))).alias(c) if flag else F.col(quote_identifier(c))
                     for c, flag in zip(columns, instants, strict=True)])
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    for row in df.toLocalIterator():
        yield tuple(epoch + timedelta(microseconds=v) if flag and v is not None else v
                    for v, flag in zip(row, instants, strict=True))


def compare(source_name: str, pg_rows: Iterator[tuple[Any, ...]], delta: Iterator[tuple[Any, ...]],
            *, show: int = 10, detail: bool = True) -> TableComparison:
    """Compare two row streams as multisets; with ``detail`` keep row texts to list differences."""
    result = TableComparison(source_name)
    src_texts: Counter[str] | None = Counter() if detail else None
    tgt_texts: Counter[str] | None = Counter() if detail else None
    result.source_rows, result.source_checksum = _checksum(pg_rows, src_texts)
    result.target_rows, result.target_checksum = _checksum(delta, tgt_texts)
    if not result.equal and src_texts is not None and tgt_texts is not None:
        result.only_in_source = list((src_texts - tgt_texts).elements())[:show]
        result.only_in_target = list((tgt_texts - src_texts).elements())[:show]
    return result


def postgres_columns(conn: psycopg.Connection, namespace: str, table: str) -> list[tuple[str, int, int]]:
    """(name, type oid, typmod) of the table's live columns that pgoutput can send, in column order:
    generated columns only where PostgreSQL 18+ publishes them (stored ones, when the publication
    says so: a publication's column list then narrows this further)."""
    generated = "a.attgenerated IN ('', 's')" if conn.info.server_version >= 180000 else "a.attgenerated = ''"
    rows = conn.execute(
        "SELECT a.attname, a.atttypid::int, a.atttypmod FROM pg_attribute a "
        "JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
        f"WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped AND {generated} "
        "ORDER BY a.attnum", (namespace, table)).fetchall()
    return [(r[0], int(r[1]), int(r[2])) for r in rows]


def _type_cache_from_postgres(conn: psycopg.Connection) -> Any:
    """A TypeCache filled from pg_type for user types (what 'Y' messages would have told the decoder: for a
    domain, the namespace and name of its base type, as logicalrep_write_typ and describe_relation send)."""
    from applier.catalog import TypeCache
    from applier.protocol.messages import Type

    types = TypeCache()
    for oid, nsp, name in conn.execute(
            "WITH RECURSIVE b(oid, cur) AS (SELECT oid, oid FROM pg_type WHERE oid >= 10000 AND typtype IN "
            "('e', 'd', 'c') UNION ALL SELECT b.oid, t.typbasetype FROM b JOIN pg_type t ON t.oid = b.cur "
            "WHERE t.typbasetype <> 0) "
            "SELECT b.oid::int, n.nspname, t.typname FROM b JOIN pg_type t ON t.oid = b.cur "
            "JOIN pg_namespace n ON n.oid = t.typnamespace WHERE t.typbasetype = 0"):
        types.update(Type(None, oid, nsp, name))
    return types


def postgres_table_rows(conn: psycopg.Connection, namespace: str, table: str,
                        keep: Callable[[str], bool] | None = None,
                        policy: SpecialValuePolicy = "error") -> tuple[list[str], Iterator[tuple[Any, ...]]]:
    """Column names and rows of a Postgres table as the mirror's Python values (through the values
    layer, under the mirror's special-value ``policy``); ``keep`` chooses the columns (default: all
    live ones)."""
    from functools import partial

    from applier.protocol.messages import COL_TEXT
    from applier.values import convert_value

    cols = [c for c in postgres_columns(conn, namespace, table) if keep is None or keep(c[0])]
    types = _type_cache_from_postgres(conn)
    converters = [partial(convert_value, COL_TEXT, type_oid=oid, typmod=typmod, types=types, column=name,
                          policy=policy) for name, oid, typmod in cols]
    return [c[0] for c in cols], postgres_rows(conn, namespace, table, cols, converters)


def verify_table(spark: SparkSession, conn: psycopg.Connection, path: str, namespace: str, table: str,
                 *, detail: bool = True, exclude: Iterable[str] = (),
                 only: Iterable[str] | None = None, policy: SpecialValuePolicy = "error",
                 soft_deleted: str | None = None) -> TableComparison:
    """Compare one Delta table with its Postgres table, on the columns Postgres has now, less those
    the mirror leaves out (``exclude``: a config's exclude_columns; ``only``: a publication's column
    list), with Postgres' values converted under the mirror's special-value ``policy`` (a mirror that
    clamps ``infinity`` holds the clamped value: verify compares with exactly that)."""
    excluded, kept = set(exclude), None if only is None else set(only)
    names, rows = postgres_table_rows(conn, namespace, table,
                                      lambda c: c not in excluded and (kept is None or c in kept), policy)
    return compare(f"{namespace}.{table}", rows, delta_rows(spark, path, names, soft_deleted), detail=detail)


def verify_against_postgres(spark: SparkSession, conn: psycopg.Connection, target_dir: str,
                            tables: Iterable[tuple[str, str]], settings: TablesSettings | None = None,
                            publication: str | None = None,
                            policy: SpecialValuePolicy = "error") -> list[TableComparison]:
    """Compare each (schema, table) with its Delta table, found and projected as ``settings`` (a
    config's tables section) and the publication's column lists say the mirror writes it."""
    from applier.config import TablesSettings
    from applier.sink.extras import ExtraColumns
    from applier.sink.targets import TableTargets
    from applier.sources.publication import published_selection

    targets = TableTargets(spark, target_dir, settings or TablesSettings())
    column_lists: dict[tuple[str, str], Any] = {}
    if publication is not None:
        column_lists = {(t.namespace, t.name): t.columns
                        for t in published_selection(conn, publication, targets.tables)}
    settings = targets.tables

    def soft_deleted(ns: str, name: str) -> str | None:
        extra = ExtraColumns.for_table(settings, f"{ns}.{name}")
        return extra.deleted if extra is not None else None

    return [verify_table(spark, conn, targets.path_for(ns, name), ns, name,
                         exclude=targets.excluded_columns(ns, name), only=column_lists.get((ns, name)),
                         policy=policy, soft_deleted=soft_deleted(ns, name))
            for ns, name in sorted(tables)]
