"""The initial copy of the published tables, at exactly the point where the slot starts.

Why an exported snapshot and not copy-then-replay: ``CREATE_REPLICATION_SLOT ... (SNAPSHOT
'export')`` hands out a snapshot that sees exactly the transactions committed before the slot's
consistent point, and the slot streams exactly the ones after it. Copying under that snapshot and
then applying from the consistent point is exact for every table, including tables without a key
(FULL identity multisets), where replaying changes over a later copy would count rows twice. It is
what PostgreSQL's own table sync does (tablesync.c).

The rows are read as the same text the pgoutput plugin sends (each type's output function, with the
session pinned like the walsender's), and each table's Relation is described the way pgoutput
describes it (published columns, key flags of the replica identity, generated columns only where
pgoutput sends them: PostgreSQL 18's ``publish_generated_columns``), so
the copy goes through the same catalog and values code as the stream and a later Relation message
for the same table is not mistaken for a schema change.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
from psycopg import pq

from applier.errors import SourceError
from applier.protocol.messages import Relation, RelationColumn, TupleData, Type
from applier.sources.publication import PublishedTable, quote_ident
from applier.sources.sql_slot import pin_session

#: pgoutput sends a Type message for columns whose type OID is at least this (FirstGenbkiObjectId).
_FIRST_NON_BUILTIN_OID = 10000


def describe_relation(conn: psycopg.Connection, table: PublishedTable) -> tuple[Relation, list[Type]]:
    """The Relation (and Type) messages pgoutput would send for ``table`` now (logicalrep_write_rel)."""
    row = conn.execute(
        "SELECT c.oid, c.relreplident FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname = %s", (table.namespace, table.name)).fetchone()
    if row is None:
        raise SourceError("published table not found", table=table.qualified_name)
    oid, identity = int(row[0]), str(row[1])
    if identity == "d":
        key_sql = "SELECT indkey FROM pg_index WHERE indrelid = %s AND indisprimary"
    else:
        key_sql = "SELECT indkey FROM pg_index WHERE indrelid = %s AND indisreplident"
    key_row = conn.execute(key_sql, (oid,)).fetchone() if identity in ("d", "i") else None
    key_attnums = {int(a) for a in str(key_row[0]).split()} if key_row else set()
    # pgoutput sends a stored generated column only on PostgreSQL 18+ and only when the publication
    # publishes it: then it is in the table's column list (published_tables), like any other column.
    generated_ok = conn.info.server_version >= 180000 and table.columns is not None
    cols = conn.execute(
        "SELECT attnum, attname, atttypid::int8, atttypmod FROM pg_attribute WHERE attrelid = %s "
        "AND attnum > 0 AND NOT attisdropped AND (attgenerated = '' OR (%s AND attgenerated = 's')) "
        "ORDER BY attnum", (oid, generated_ok)).fetchall()
    columns: list[RelationColumn] = []
    for attnum, attname, typid, typmod in cols:
        if table.columns is not None and attname not in table.columns:
            continue
        key = identity == "f" or attnum in key_attnums
        columns.append(RelationColumn(1 if key else 0, attname, int(typid), int(typmod)))
    types: list[Type] = []
    for typid in sorted({c.type_oid for c in columns if c.type_oid >= _FIRST_NON_BUILTIN_OID}):
        # like logicalrep_write_typ: the OID as used, the namespace and name of its base type
        row = conn.execute(
            "WITH RECURSIVE b(oid, base) AS (SELECT oid, typbasetype FROM pg_type WHERE oid = %s "
            "UNION ALL SELECT t.oid, t.typbasetype FROM pg_type t JOIN b ON t.oid = b.base WHERE b.base <> 0) "
            "SELECT n.nspname, t.typname FROM b JOIN pg_type t ON t.oid = b.oid "
            "JOIN pg_namespace n ON n.oid = t.typnamespace WHERE b.base = 0", (typid,)).fetchone()
        if row is None:
            raise SourceError("a column's type disappeared while the table was described", type_oid=typid)
        ns, name = row
        types.append(Type(None, typid, ns, name))
    return Relation(None, oid, table.namespace, table.name, identity, tuple(columns)), types


def copy_rows(conn: psycopg.Connection, table: PublishedTable, relation: Relation, *,
              batch_rows: int = 10_000, select: str | None = None) -> Iterator[list[TupleData]]:
    """The table's rows as text TupleData (what pgoutput would send), ``batch_rows`` at a time.

    Runs inside the caller's transaction (the one that set the exported snapshot), through a
    server-side cursor so a big table never sits in memory whole. ``select`` (one chunk's query,
    selecting the relation's columns) replaces the whole-table query.
    """
    if select is None:
        cols = ", ".join(quote_ident(c.name) for c in relation.columns) or "NULL"
        relkind = conn.execute("SELECT relkind FROM pg_class WHERE oid = %s", (relation.oid,)).fetchone()
        only = "" if relkind and relkind[0] == "p" else "ONLY "
        where = f" WHERE {table.row_filter}" if table.row_filter else ""
        select = f"SELECT {cols} FROM {only}{quote_ident(table.namespace)}.{quote_ident(table.name)}{where}"
    sql = select
    pgconn = conn.pgconn
    _exec(pgconn, f"DECLARE applier_snapshot NO SCROLL CURSOR FOR {sql}", table)
    try:
        ncols = len(relation.columns)
        while True:
            res = _exec(pgconn, f"FETCH {batch_rows} FROM applier_snapshot", table)
            n = res.ntuples
            if n == 0:
                break
            batch = []
            for r in range(n):
                raw = [res.get_value(r, c) for c in range(ncols)]  # None is SQL NULL
                values = tuple(None if v is None else bytes(v) for v in raw)
                kinds = bytes(110 if v is None else 116 for v in values)  # 'n' / 't'
                batch.append(TupleData(kinds, values))
            yield batch
            if n < batch_rows:
                break
    finally:
        _exec(pgconn, "CLOSE applier_snapshot", table)


def _exec(pgconn: pq.abc.PGconn, sql: str, table: PublishedTable) -> pq.abc.PGresult:
    res = pgconn.exec_(sql.encode("utf-8"))
    if res.status not in (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK):
        message = res.error_message.decode("utf-8", "replace").strip()
        raise SourceError(f"copying the table failed: {message}", table=table.qualified_name)
    return res


def open_snapshot(conn: psycopg.Connection, snapshot_name: str) -> None:
    """Start a transaction that sees exactly the exported snapshot (the slot's starting point)."""
    pin_session(conn)
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
    conn.execute(f"SET TRANSACTION SNAPSHOT {_literal(snapshot_name)}")


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"
