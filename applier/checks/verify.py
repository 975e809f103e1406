"""Compare mirrored Delta tables with their PostgreSQL tables.

Both sides are brought to the same Python values: Postgres rows are read in text format and go
through the values layer exactly like pgoutput 't' columns do; Delta rows come from the store that
reads the table (``applier.sink.store.picker.scanner``: delta-rs without a JVM where it reads the table
as Spark does, else Spark), as a Spark row holds them. Each row becomes a canonical string; a table
matches when the row counts and an order-independent checksum (sum of 64-bit row digests) are equal.
Both sides are streamed, and no row text is kept (issue 77): each row leaves a 16-byte digest of its
text (applier.checks.rowdigests, bounded memory, spilled to disk past a budget). On a mismatch the two
multisets of digests are compared, and a second pass over each side (or over the texts spooled to disk,
for a stream that cannot be read twice) finds the first few rows present on one side only.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time
from decimal import Decimal
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

import psycopg
from psycopg.abc import Buffer
from psycopg.adapt import Loader

from applier.checks.rowdigests import DEFAULT_BUDGET, DIGEST_BYTES, DigestSpool, Excess, TextSpool, first_differences
from applier.sink.int96 import int96_advice, int96_files_at
from applier.sink.naming import safe_column_name
from applier.sink.spec import PROP_COLUMN_NAMES
from applier.sink.store.picker import scanner
from applier.sources.sql_slot import pin_session
from applier.values import SpecialValuePolicy

if TYPE_CHECKING:
    from applier.config import TablesSettings
    from applier.spark.session import SparkLike


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


def row_text(row: Iterable[Any]) -> str:
    """A row's canonical text: its values' canonical texts joined by the unit separator."""
    return "\x1f".join(canonical(v) for v in row)


def _digest(encoded: bytes) -> bytes:
    return hashlib.blake2b(encoded, digest_size=DIGEST_BYTES).digest()


Rows = Iterator[tuple[Any, ...]] | Iterable[tuple[Any, ...]] | Callable[[], Iterator[tuple[Any, ...]]]
"""Rows to compare: a one-pass iterator, a collection, or a function that reads them afresh each call."""


@dataclass
class TableComparison:
    source_name: str
    source_rows: int = 0
    target_rows: int = 0
    source_checksum: int = 0
    target_checksum: int = 0
    only_in_source: list[str] = field(default_factory=list)
    only_in_target: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # differences beyond rows: no table, missing columns

    @property
    def equal(self) -> bool:
        return (not self.problems and self.source_rows == self.target_rows
                and self.source_checksum == self.target_checksum)


class _Side:
    """One side of a comparison: its rows for the first pass, and a way to read their texts again for
    the second (the function called again, the collection iterated again, else the texts spooled to a
    temporary file as the one-pass iterator went by)."""

    def __init__(self, rows: Rows, detail: bool, budget: int) -> None:
        self.again: Callable[[], Iterator[tuple[Any, ...]]] | None
        if callable(rows):
            self.again = rows
        elif iter(rows) is not rows:  # a collection: read again as it is
            self.again = lambda: iter(rows)
        else:
            self.again = None
        self.given = rows
        self.digests = DigestSpool(budget) if detail else None
        self.texts = TextSpool() if detail and self.again is None else None

    def first_pass(self) -> tuple[int, int]:
        """The row count and the checksum (sum of the digests' first 8 bytes, mod 2**64)."""
        total, count = 0, 0
        digests, texts = self.digests, self.texts
        for row in self.given() if callable(self.given) else self.given:
            encoded = row_text(row).encode("utf-8", "surrogatepass")
            digest = _digest(encoded)
            total += int.from_bytes(digest[:8], "big")
            count += 1
            if digests is not None:
                digests.add(digest)
            if texts is not None:
                texts.add(encoded)
        return count, total % (1 << 64)

    def examples(self, wanted: list[Excess], show: int) -> list[str]:
        """The texts of the ``wanted`` digests' rows, each as many times as it is in excess, in the order
        of their first rows, at most ``show``."""
        need = {e.digest for e in wanted}
        found: dict[bytes, str] = {}
        if need:
            if self.texts is not None:
                encoded: Iterator[bytes] = self.texts.texts()
            else:
                assert self.again is not None
                encoded = (row_text(r).encode("utf-8", "surrogatepass") for r in self.again())
            try:
                for text in encoded:
                    digest = _digest(text)
                    if digest in need and digest not in found:
                        found[digest] = text.decode("utf-8", "surrogatepass")
                        if len(found) == len(need):
                            break
            finally:
                close = getattr(encoded, "close", None)
                if close is not None:
                    close()  # a Postgres cursor stops here
        out = [text for e in wanted if e.digest in found for text in [found[e.digest]] * e.count]
        return out[:show]

    def close(self) -> None:
        if self.digests is not None:
            self.digests.close()
        if self.texts is not None:
            self.texts.close()


class _RawText(Loader):
    """Hands back the type's output-function text as bytes (what pgoutput 't' columns carry).

    A ``::text`` cast is not the same: bool casts to 'true', char(n) loses its padding.
    """

    def load(self, data: Buffer) -> bytes:
        return bytes(data)


def postgres_rows(conn: psycopg.Connection, namespace: str, table: str, columns: list[tuple[str, int, int]],
                  converters: list[Any], row_filter: str | None = None) -> Iterator[tuple[Any, ...]]:
    """Rows of ``namespace.table`` as Python values, via text output and the given per-column converters;
    with ``row_filter`` (a publication's WHERE clause, SQL over the table's columns, as PostgreSQL
    itself prints it in ``pg_publication_tables.rowfilter``) only the rows it passes, the rows a
    mirror of that publication holds."""
    pin_session(conn)
    cols = ", ".join(_pg_ident(c[0]) for c in columns)
    rel = f"{_pg_ident(namespace)}.{_pg_ident(table)}"
    kind = conn.execute("SELECT c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                        "WHERE n.nspname = %s AND c.relname = %s", (namespace, table)).fetchone()
    if kind is None or kind[0] != "p":
        # pgoutput sends an inheritance parent's own rows (children are tables of their own), and the
        # initial copy reads them with ONLY; a partitioned table is read through its root
        rel = f"ONLY {rel}"
    with conn.transaction(), conn.cursor(name="applier_verify") as cur:  # server-side: constant memory
        for oid in _result_type_oids(conn, [c[1] for c in columns]):
            cur.adapters.register_loader(oid, _RawText)
        where = f" WHERE {row_filter}" if row_filter else ""  # the server's own text of the filter
        cur.itersize = 2000  # rows per FETCH: few round trips, little memory
        cur.execute(f"SELECT {cols} FROM {rel}{where}")  # identifiers quoted; no values in the SQL
        for raw in cur:
            yield tuple(None if v is None else conv(v) for v, conv in zip(raw, converters, strict=True))


def _result_type_oids(conn: psycopg.Connection, type_oids: list[int]) -> set[int]:
    """The column types and, for domains, their base types (down the chain of domains over domains).

    PostgreSQL describes a domain column of a result by its base type (printtup.c), so the raw-text
    loader must be registered for that OID too, or psycopg parses the value itself (an int, not bytes)."""
    found = set(type_oids)
    rows = conn.execute(
        "WITH RECURSIVE chain(base) AS ("
        " SELECT t.typbasetype FROM pg_type t WHERE t.oid = ANY(%s) AND t.typtype = 'd'"
        " UNION SELECT t.typbasetype FROM chain c JOIN pg_type t ON t.oid = c.base WHERE t.typtype = 'd')"
        " SELECT base::int FROM chain", (sorted(found),)).fetchall()
    return found | {int(r[0]) for r in rows}


def _pg_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def compare(source_name: str, pg_rows: Rows, delta: Rows, *, show: int = 10, detail: bool = True,
            budget: int = DEFAULT_BUDGET) -> TableComparison:
    """Compare two row streams as multisets; with ``detail`` list (up to ``show``) rows on one side only.

    Memory stays bounded: each row leaves only its digest (24 bytes with its ordinal, on disk past
    ``budget`` bytes per side). A side given as a function (or a collection) is read a second time for
    the rows to list, on a mismatch only; a one-pass iterator's row texts are spooled to disk instead."""
    result = TableComparison(source_name)
    src, tgt = _Side(pg_rows, detail, budget), _Side(delta, detail, budget)
    try:
        result.source_rows, result.source_checksum = src.first_pass()
        result.target_rows, result.target_checksum = tgt.first_pass()
        if not result.equal and src.digests is not None and tgt.digests is not None:
            only_source, only_target = first_differences(src.digests, tgt.digests, show)
            src.digests.close()
            tgt.digests.close()
            result.only_in_source = src.examples(only_source, show)
            result.only_in_target = tgt.examples(only_target, show)
    finally:
        src.close()
        tgt.close()
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
    """A TypeCache filled from pg_type as the mirror's decoder fills it from 'Y' messages: one entry per
    type with an OID from 10000 on (pgoutput sends 'Y' for those: enums, composites, ranges, arrays of
    user types, extension types, domains), named as 'Y' names it: a domain by its base type, down a
    chain of domains (logicalrep_write_typ calls getBaseType). Named otherwise, a domain over int would
    be read as text here while the mirror holds ints."""
    from applier.catalog import TypeCache
    from applier.protocol.messages import Type

    types = TypeCache()
    for oid, nsp, name in conn.execute(
            "WITH RECURSIVE chain(oid, cur) AS ("
            " SELECT t.oid, t.oid FROM pg_type t WHERE t.oid >= 10000"
            " UNION ALL SELECT c.oid, t.typbasetype FROM chain c JOIN pg_type t ON t.oid = c.cur"
            " WHERE t.typtype = 'd')"
            " SELECT c.oid::int, n.nspname, b.typname FROM chain c JOIN pg_type b ON b.oid = c.cur"
            " JOIN pg_namespace n ON n.oid = b.typnamespace WHERE b.typtype <> 'd'"):
        types.update(Type(None, oid, nsp, name))
    return types


def postgres_table_rows(conn: psycopg.Connection, namespace: str, table: str,
                        keep: Callable[[str], bool] | None = None,
                        policy: SpecialValuePolicy = "error", row_filter: str | None = None,
                        ) -> tuple[list[str], Iterator[tuple[Any, ...]]]:
    """Column names and rows of a Postgres table as the mirror's Python values (through the values
    layer, under the mirror's special-value ``policy``); ``keep`` chooses the columns (default: all
    live ones), ``row_filter`` the rows (a publication's row filter)."""
    names, read = postgres_table_reader(conn, namespace, table, keep, policy, row_filter)
    return names, read()


def postgres_table_reader(conn: psycopg.Connection, namespace: str, table: str,
                          keep: Callable[[str], bool] | None = None,
                          policy: SpecialValuePolicy = "error", row_filter: str | None = None,
                          ) -> tuple[list[str], Callable[[], Iterator[tuple[Any, ...]]]]:
    """As ``postgres_table_rows``, with a function that reads the rows afresh (a query of its own,
    streamed through a server-side cursor) each time it is called."""
    from applier.protocol.messages import COL_TEXT
    from applier.values import convert_value

    cols = [c for c in postgres_columns(conn, namespace, table) if keep is None or keep(c[0])]
    types = _type_cache_from_postgres(conn)
    converters = [partial(convert_value, COL_TEXT, type_oid=oid, typmod=typmod, types=types, column=name,
                          policy=policy) for name, oid, typmod in cols]
    return [c[0] for c in cols], partial(postgres_rows, conn, namespace, table, cols, converters, row_filter)


def _projected(read: Callable[[], Iterator[tuple[Any, ...]]], keep_at: list[int]) -> Iterator[tuple[Any, ...]]:
    return (tuple(row[i] for i in keep_at) for row in read())


def verify_table(spark: SparkLike | None, conn: psycopg.Connection, path: str, namespace: str, table: str,
                 *, detail: bool = True, exclude: Iterable[str] = (),
                 only: Iterable[str] | None = None, policy: SpecialValuePolicy = "error",
                 soft_deleted: str | None = None, row_filter: str | None = None,
                 reader: Literal["auto", "spark"] = "auto", safe_names: bool = False) -> TableComparison:
    """Compare one Delta table with its Postgres table, on the columns Postgres has now, less those
    the mirror leaves out (``exclude``: a config's exclude_columns; ``only``: a publication's column
    list), on the rows the publication sends (``row_filter``: its WHERE clause), with Postgres' values
    converted under the mirror's special-value ``policy`` (a mirror that clamps ``infinity`` holds the
    clamped value: verify compares with exactly that). ``reader`` 'spark': read the table with Spark even
    where delta-rs could (what a Spark consumer sees). ``safe_names``: the table's columns have their
    ``column_names: safe`` names (applier.sink.naming.safe_column_name), as the config says; a table
    written under ``safe`` says so itself too (its ``applier.columnNames`` property), which is enough for
    ``applier verify`` without a config."""
    if not _table_exists(conn, namespace, table):
        return _gone_from_postgres(spark, path, namespace, table, reader)
    excluded, kept = set(exclude), None if only is None else set(only)
    names, rows = postgres_table_reader(conn, namespace, table,
                                        lambda c: c not in excluded and (kept is None or c in kept), policy,
                                        row_filter)
    store = scanner(path, spark, spark_only=reader == "spark")
    int96 = [] if store.uses_spark else (int96_files_at(path) or [])
    if int96:  # delta-rs misreads them (or stops): compared as Spark reads them, and reported
        if spark is None:
            result = compare(f"{namespace}.{table}", iter(()), iter(()), detail=detail)
            result.problems.append(int96_advice(int96) + "; not compared (no Spark to read them)")
            return result
        store = scanner(path, spark, spark_only=True)
    have = store.columns(path) if store.exists(path) else None
    if have is None:
        result = compare(f"{namespace}.{table}", rows, iter(()), detail=detail)
        result.problems.append(f"no Delta table at {path}")
        return result
    safe = [safe_column_name(n) for n in names]
    if safe != names and (safe_names or PROP_COLUMN_NAMES in store.configuration(path)):
        names = safe  # column_names: safe (the table's property says so where no config does)
    # a column Postgres sends and the Delta table lacks is a difference to report, not a crash; the
    # other columns are still compared (Spark resolves names case-insensitively, as here)
    missing = [n for n in names if n.lower() not in {c.lower() for c in have}]
    if missing:
        keep_at = [i for i, n in enumerate(names) if n not in missing]
        names = [names[i] for i in keep_at]
        rows = partial(_projected, rows, keep_at)
    # both sides as functions: read a second time, on a mismatch, for the rows to list (issue 77)
    try:
        result = compare(f"{namespace}.{table}", rows, lambda: store.scan(path, names, unless=soft_deleted),
                         detail=detail)
    except psycopg.errors.UndefinedTable:  # renamed or dropped while it was read
        return _gone_from_postgres(spark, path, namespace, table, reader)
    result.problems.extend(f"column {n!r} is not in the Delta table" for n in missing)
    result.problems.extend(type_differences(conn, namespace, table, names, store.schema_fields(path)))
    if int96:
        result.problems.append(int96_advice(int96) + "; compared as Spark reads them")
    return result


def type_differences(conn: psycopg.Connection, namespace: str, table: str, names: list[str],
                     fields: list[dict[str, Any]]) -> list[str]:
    """The columns of ``names`` (Delta names, in Postgres' column order as ``verify_table`` reads them) whose
    Delta type is not the one the mirror gives their Postgres type now (applier.values.registry), each as a
    problem.

    Why: rows are compared as values, and a value of another type can compare equal (the text 't' in
    Postgres and a Delta boolean true; the text '12.5' and a decimal 12.50 that normalizes to it): a
    column left with its old type after an ``ALTER COLUMN ... TYPE`` the mirror never applied would pass
    as equal, and the next value that tells the types apart would not fit its Delta column."""
    from applier.sink.naming import safe_column_name
    from applier.sink.store.deltatypes import delta_type
    from applier.values.convert import arrow_type_for
    from applier.values.registry import handler_for

    have = {str(f["name"]).lower(): f["type"] for f in fields}
    types = _type_cache_from_postgres(conn)
    wanted = set(names)
    out: list[str] = []
    for name, oid, typmod in postgres_columns(conn, namespace, table):
        delta_name = name if name in wanted else safe_column_name(name)
        if delta_name not in wanted or delta_name.lower() not in have:
            continue  # left out (excluded, a column list), or reported missing already
        want = delta_type(arrow_type_for(oid, typmod, types))
        found = have[delta_name.lower()]
        if not same_delta_type(want, found):
            out.append(f"column {delta_name!r} is {_type_text(found)} in the Delta table, but {name!r} is "
                       f"{handler_for(oid, typmod, types).pg_name} in Postgres, which the mirror writes as "
                       f"{_type_text(want)} (a type change that has not reached the Delta table)")
    return out


def same_delta_type(want: Any, have: Any) -> bool:
    """Two Delta JSON types are the same type: equal names, or arrays of the same element type (whether an
    array may hold NULLs is no part of its type here: every column the mirror writes may)."""
    if isinstance(want, dict) and isinstance(have, dict):
        if want.get("type") == have.get("type") == "array":
            return same_delta_type(want.get("elementType"), have.get("elementType"))
        return bool(want == have)
    return isinstance(want, str) and isinstance(have, str) and want.lower() == have.lower()


def _type_text(delta: Any) -> str:
    if isinstance(delta, dict) and delta.get("type") == "array":
        return f"array<{_type_text(delta.get('elementType'))}>"
    return str(delta)


def _table_exists(conn: psycopg.Connection, namespace: str, table: str) -> bool:
    row = conn.execute("SELECT to_regclass(format('%%I.%%I', %s::text, %s::text)) IS NOT NULL",
                       (namespace, table)).fetchone()
    return bool(row and row[0])


#: what a Delta table whose Postgres table is not there (any more) under its name means
GONE_HINT = ("renamed, moved to another schema or dropped since the mirror last ran; the mirror's next run "
             "follows it (a renamed or moved table's Delta table moves to its new name, a dropped one's stays as "
             "it was, no longer followed)")


def _gone_from_postgres(spark: SparkLike | None, path: str, namespace: str, table: str,
                        reader: Literal["auto", "spark"]) -> TableComparison:
    """A difference, not an error: the Delta table at ``path`` has no Postgres table of its name to compare with.
    Its rows are counted, not listed."""
    store = scanner(path, spark, spark_only=reader == "spark")
    result = compare(f"{namespace}.{table}", iter(()), _counted(store, path) if store.exists(path) else iter(()),
                     detail=False)
    result.problems.append(f"{namespace}.{table} is not a table in Postgres (any more): {GONE_HINT}")
    return result


def _counted(store: Any, path: str) -> Iterator[tuple[Any, ...]]:
    """The Delta table's rows, of one column only: enough to count them."""
    return iter(store.scan(path, list(store.columns(path))[:1]))


def unfollowed_tables(spark: SparkLike | None, conn: psycopg.Connection, target_dir: str, publication: str,
                      settings: TablesSettings | None = None) -> list[TableComparison]:
    """The Delta tables in the target's ``DIR/<schema>/<table>`` layout that ``settings`` selects, that a
    mirror of ``publication`` wrote and still marks as followed (``applier.publication``), and whose name the
    publication does not send now: their table was renamed, moved, dropped or taken out of the publication
    since the mirror last ran (its next run moves them or marks them no longer followed). Each is a
    difference: a ``verify --config`` of the tables published now does not look at them otherwise."""
    from applier.config import TablesSettings
    from applier.sink.naming import mirrored_table_dirs, source_name_of
    from applier.sink.spec import PROP_PUBLICATION
    from applier.sink.targets import TableTargets
    from applier.sources.publication import published_selection

    targets = TableTargets(spark, target_dir, settings or TablesSettings())
    published = {(t.namespace, t.name) for t in published_selection(conn, publication, targets.tables)}
    out: list[TableComparison] = []
    for directory in mirrored_table_dirs(target_dir):
        namespace, table = source_name_of(directory)
        path = targets.path_for(namespace, table)
        if ((namespace, table) in published or not targets.tables.selected(f"{namespace}.{table}")
                or path != str(directory)):
            continue
        store = scanner(path, spark)
        if store.configuration(path).get(PROP_PUBLICATION, "published") != "published":
            continue  # the mirror marked it: no longer followed, kept as it was
        if _table_exists(conn, namespace, table):
            result = compare(f"{namespace}.{table}", iter(()), _counted(store, path), detail=False)
            result.problems.append(f"{namespace}.{table} is no longer in publication {publication} (taken out since "
                                   "the mirror last ran; its next run marks its Delta table no longer followed)")
        else:
            result = _gone_from_postgres(spark, path, namespace, table, "auto")
        out.append(result)
    return out


def verify_against_postgres(spark: SparkLike | None, conn: psycopg.Connection, target_dir: str,
                            tables: Iterable[tuple[str, str]], settings: TablesSettings | None = None,
                            publication: str | None = None,
                            policy: SpecialValuePolicy = "error",
                            reader: Literal["auto", "spark"] = "auto") -> list[TableComparison]:
    """Compare each (schema, table) with its Delta table, found and projected as ``settings`` (a
    config's tables section) and the publication's column lists and row filters say the mirror writes
    it (``publication``: one name or a comma-separated list, as the mirror's ``source.publication``;
    a table in several is filtered as pgoutput filters it, see ``published_tables``)."""
    from applier.config import TablesSettings
    from applier.sink.extras import ExtraColumns
    from applier.sink.targets import TableTargets
    from applier.sources.publication import published_selection

    targets = TableTargets(spark, target_dir, settings or TablesSettings())
    published: dict[tuple[str, str], Any] = {}
    if publication is not None:
        published = {(t.namespace, t.name): t for t in published_selection(conn, publication, targets.tables)}
    settings = targets.tables

    def soft_deleted(ns: str, name: str) -> str | None:
        extra = ExtraColumns.for_table(settings, f"{ns}.{name}")
        return extra.deleted if extra is not None else None

    return [verify_table(spark, conn, targets.path_for(ns, name), ns, name,
                         exclude=targets.excluded_columns(ns, name),
                         only=published[(ns, name)].columns if (ns, name) in published else None,
                         policy=policy, soft_deleted=soft_deleted(ns, name),
                         row_filter=published[(ns, name)].row_filter if (ns, name) in published else None,
                         reader=reader, safe_names=settings.safe_column_names(f"{ns}.{name}"))
            for ns, name in sorted(tables)]
