"""Reading one table's initial copy in chunks, on any connection that imported the slot's snapshot.

Why chunks and COPY: the copy of a big table is the first thing a user waits for. Each table is cut
into ctid ranges (a TID Range Scan on PostgreSQL 14+, from ``pg_class.relpages``; the last range is
open-ended so pages added after the estimate are read too), and every range is read with one
``COPY (SELECT ...) TO STDOUT (FORMAT csv)`` on any of several connections that all ``SET
TRANSACTION SNAPSHOT`` the exported snapshot, so every chunk sees exactly the slot's starting point.

Why CSV into pyarrow: pyarrow's CSV reader builds the columns in C without a Python object per value,
with SQL NULL (unquoted empty) kept apart from '' (quoted empty). Each column is then turned into
exactly the stream's value by the cheapest exact reader for its type (``applier.sources.typedcopy``:
Arrow casts for dates, timestamps, numeric(p, s) and floats, numpy for bytea, the stream's own parser
per value for arrays and rare types). A chunk holding a value Spark's type cannot hold (±infinity,
BC years, numeric NaN in a DECIMAL) goes alone through the stream's own per-value conversion
(``copy_rows`` + RowConverter), so special values and the policy are exactly the stream's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

import psycopg
from psycopg import pq

from applier.errors import SourceError
from applier.protocol.messages import Relation
from applier.sources.pqwait import next_result, wait_socket
from applier.sources.publication import PublishedTable, quote_ident
from applier.sources.typedcopy import column_readers, convert_chunk

if TYPE_CHECKING:
    import pyarrow as pa

    from applier.catalog import TypeCache

_PAGE = 8192


@dataclass(frozen=True, slots=True)
class CopyPlan:
    """Where a table's rows come from and how it is cut."""

    source_sql: str  # "ONLY s.t" or "s.t" (partitioned tables are read through their root)
    row_filter: str | None
    chunks: tuple[str, ...]  # ctid conditions ('' for the whole table)
    estimated_rows: int  # pg_class.reltuples (-1 when never analysed: unknown)
    bytes: int = 0  # heap size by pg_class.relpages (0 for a partitioned table: its leaves hold the pages)


def plan_table(conn: psycopg.Connection, table: PublishedTable, relation: Relation, *,
               chunk_mb: int) -> CopyPlan:
    row = conn.execute(
        "SELECT c.relkind, c.relpages::int8, c.reltuples::int8, "
        "(SELECT coalesce(sum(p.reltuples), -1)::int8 FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhrelid "
        " WHERE i.inhparent = c.oid) FROM pg_class c WHERE c.oid = %s", (relation.oid,)).fetchone()
    if row is None:
        raise SourceError("published table not found (dropped during the copy?)", table=table.qualified_name)
    relkind, pages, tuples, leaf_tuples = str(row[0]), int(row[1]), int(row[2]), int(row[3])
    name = f"{quote_ident(table.namespace)}.{quote_ident(table.name)}"
    if relkind == "p":
        return CopyPlan(name, table.row_filter, ("",), leaf_tuples)
    per_chunk = max(chunk_mb * 1024 * 1024 // _PAGE, 1)
    if conn.info.server_version < 140000 or pages <= per_chunk:
        return CopyPlan(f"ONLY {name}", table.row_filter, ("",), tuples, pages * _PAGE)
    bounds = list(range(0, pages, per_chunk))
    chunks = [f"ctid >= '({lo},0)'::tid AND ctid < '({hi},0)'::tid" for lo, hi in zip(bounds, bounds[1:], strict=False)]
    chunks.append(f"ctid >= '({bounds[-1]},0)'::tid")  # open-ended: relpages is only an estimate
    return CopyPlan(f"ONLY {name}", table.row_filter, tuple(chunks), tuples, pages * _PAGE)


def select_sql(plan: CopyPlan, columns: list[str], chunk: str) -> str:
    cols = ", ".join(quote_ident(c) for c in columns) or "NULL"
    conds = [f"({c})" for c in (plan.row_filter, chunk) if c]
    where = f" WHERE {' AND '.join(conds)}" if conds else ""
    return f"SELECT {cols} FROM {plan.source_sql}{where}"


def arrow_types(relation: Relation, types: TypeCache | None, schema: pa.Schema) -> list[Any] | None:
    """How every column of the table is read on the fast path (``applier.sources.typedcopy``), or None
    when the table takes the per-value path (a table without columns)."""
    return column_readers(relation, types, schema)


def copy_out(conn: psycopg.Connection, statement: str) -> bytearray:
    """Everything a ``COPY ... TO STDOUT`` sends, read straight off libpq.

    Why not psycopg's ``Copy``: PostgreSQL sends a row per CopyData message, and psycopg's iterator
    spends about 1 µs of Python on each (a generator and a wait per message), so a table of narrow rows
    was read at ~1M rows/s whatever the server did, with the GIL held all along: two copy threads took
    turns. This loop takes every message libpq has in one call each (~0.4 µs) and waits in ``poll``,
    which lets the other threads run. Errors are psycopg's own, as from ``Copy``; the connection is left
    idle in its transaction, as after a ``Copy``, or closed when the loop is left half way (an error of
    the server ends the COPY first, so that one leaves it usable)."""
    pgconn = conn.pgconn
    with conn.lock:
        pgconn.send_query(statement.encode())
        res = next_result(pgconn, lambda write: wait_socket(pgconn, write=write))
        if res is None or res.status != pq.ExecStatus.COPY_OUT:
            _drain_and_raise(conn, res)
        data = bytearray()
        get = pgconn.get_copy_data
        try:
            while True:
                n, block = get(1)
                if n > 0:
                    data += block
                elif n == 0:
                    wait_socket(pgconn)
                    pgconn.consume_input()
                else:
                    break
        except BaseException:
            conn.close()  # half way through a COPY: nothing else can be sent on it
            raise
        res = pgconn.get_result()
        if res is None or res.status != pq.ExecStatus.COMMAND_OK:
            _drain_and_raise(conn, res)
        while pgconn.get_result() is not None:
            pass
    return data


def _drain_and_raise(conn: psycopg.Connection, res: pq.abc.PGresult | None) -> NoReturn:
    pgconn = conn.pgconn
    error: psycopg.Error
    if res is None:
        error = psycopg.OperationalError(pgconn.error_message.decode("utf-8", "replace").strip()
                                         or "the server sent no result")
    elif res.status == pq.ExecStatus.FATAL_ERROR:
        error = psycopg.errors.error_from_result(res, encoding=conn.info.encoding)
    else:
        status = pq.ExecStatus(res.status).name
        error = psycopg.ProgrammingError(f"expected COPY TO STDOUT's data, the server answered {status}")
    while pgconn.status == pq.ConnStatus.OK and pgconn.get_result() is not None:
        pass
    raise error


def read_arrow_chunk(conn: psycopg.Connection, sql: str, names: list[str], readers: list[Any],
                     table: PublishedTable) -> Any | None:
    """One chunk as a pyarrow Table (``COPY ... (FORMAT csv)`` parsed by pyarrow and converted column by
    column), or None when a value in it must take the per-value path (the caller copies the chunk
    again that way, under the same snapshot)."""
    import pyarrow as pa
    from pyarrow import csv

    try:
        data = copy_out(conn, f"COPY ({sql}) TO STDOUT (FORMAT csv)")
    except psycopg.Error as e:
        raise SourceError(f"copying the table failed: {str(e).splitlines()[0] if str(e) else e!r}",
                          table=table.qualified_name, sqlstate=e.sqlstate) from None
    if not data:
        # from_batches, not Schema.empty_table(): that one imports pandas (0.25 s of a first copy)
        schema = pa.schema([pa.field(n, r.target) for n, r in zip(names, readers, strict=True)])
        return pa.Table.from_batches([], schema=schema)
    fields = [pa.field(f"c{i}", r.csv_type) for i, r in enumerate(readers)]  # positional: any name is safe
    block_size = 16 << 20
    while True:
        try:
            result = csv.read_csv(
                pa.py_buffer(data),
                read_options=csv.ReadOptions(column_names=[f.name for f in fields], block_size=block_size),
                parse_options=csv.ParseOptions(newlines_in_values=True),
                convert_options=csv.ConvertOptions(
                    column_types={f.name: f.type for f in fields}, null_values=[""], strings_can_be_null=True,
                    quoted_strings_can_be_null=False, true_values=["t"], false_values=["f"]))
            break
        except pa.ArrowInvalid as e:
            # a row longer than a block (a value over ~16 MB: PostgreSQL holds up to 1 GB in a field, and
            # a bytea's hex text is twice that): read again with blocks that hold it
            if "straddl" not in str(e) or block_size > len(data):
                raise
            block_size = min(block_size * 4, len(data) + 1, (1 << 31) - 1)
    del data
    return convert_chunk(result, readers, names)
