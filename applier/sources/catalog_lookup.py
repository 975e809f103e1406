"""The live catalog, asked when the stream alone cannot say which table or column is which.

The sink binds each source relation to its Delta table by OID (applier.sink.identity); when a new
relation takes a name another one had, or a column disappears while another appears, it asks here
what the older relation or column is now. One short connection per question: these are schema
events, rare next to row changes.
"""

from __future__ import annotations

import psycopg


class LiveCatalog:
    """``applier.sink.identity.CatalogLookup`` over a DSN."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    def relation(self, oid: int) -> tuple[str, str] | None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            row = conn.execute("SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = "
                               "c.relnamespace WHERE c.oid = %s", (oid,)).fetchone()
        return (str(row[0]), str(row[1])) if row is not None else None

    def attnums(self, oid: int) -> dict[str, int]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            return column_attnums(conn, oid)


def column_attnums(conn: psycopg.Connection, oid: int) -> dict[str, int]:
    """Column name -> attnum of relation ``oid``'s live columns (as the connection's snapshot sees them)."""
    rows = conn.execute("SELECT attname, attnum FROM pg_attribute WHERE attrelid = %s AND attnum > 0 "
                        "AND NOT attisdropped", (oid,)).fetchall()
    return {str(name): int(num) for name, num in rows}
