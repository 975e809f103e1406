"""Which tables a publication sends, as pgoutput names them, and which of those a config mirrors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import psycopg

from applier.errors import ConfigError

if TYPE_CHECKING:
    from applier.config import TablesSettings


@dataclass(frozen=True, slots=True)
class PublishedTable:
    namespace: str
    name: str
    columns: tuple[str, ...] | None  # the publication's column list (None: all columns)
    row_filter: str | None  # the publication's WHERE clause, as SQL
    oid: int | None = None  # the relation's OID: what the mirror follows through renames

    @property
    def qualified_name(self) -> str:
        return f"{self.namespace}.{self.name}"


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def require_publication(conn: psycopg.Connection, publication: str) -> None:
    """ConfigError (exit 2: a name in the config or a flag, which a restart will not fix) when the
    server has no such publication. The commands call it right after the DSN check, before Spark
    starts; a publication dropped while a mirror runs ends the run the same way."""
    exists = conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (publication,)).fetchone()
    if exists is None:
        raise ConfigError(f"publication {publication!r} does not exist in this database; create it first, e.g. "
                          f"CREATE PUBLICATION {quote_ident(publication)} FOR TABLE ... (or FOR ALL TABLES), or "
                          "fix source.publication (--publication)")


def check_publication(dsn: str, publication: str) -> None:
    """``require_publication`` on a connection of its own (after ``check_connection`` made one)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        require_publication(conn, publication)


def published_tables(conn: psycopg.Connection, publication: str) -> list[PublishedTable]:
    """The tables the publication sends changes for (as pgoutput names them), with column lists and
    row filters on servers that have them (PG 15+). The column list is exactly the columns pgoutput
    sends: stored generated columns only on PostgreSQL 18+ where the publication publishes them
    (``publish_generated_columns = stored`` or a column list naming them); PostgreSQL 15 to 17 list
    generated columns in ``pg_publication_tables.attnames`` but never send them."""
    require_publication(conn, publication)
    version = conn.info.server_version
    if version >= 180000:  # attnames is what pgoutput sends, stored generated columns included when published
        extra = ", attnames, rowfilter"
    elif version >= 150000:  # attnames lists generated columns, which pgoutput before 18 never sends
        extra = (", ARRAY(SELECT n FROM unnest(attnames) n WHERE NOT EXISTS (SELECT 1 FROM pg_attribute a "
                 "WHERE a.attrelid = format('%%I.%%I', schemaname, tablename)::regclass AND a.attname = n "
                 "AND a.attgenerated <> '')), rowfilter")
    else:
        extra = ", NULL::name[], NULL::text"
    rows = conn.execute(f"SELECT schemaname, tablename{extra}, (quote_ident(schemaname) || '.' || "
                        "quote_ident(tablename))::regclass::oid::int8 FROM pg_publication_tables WHERE pubname = %s "
                        "ORDER BY 1, 2", (publication,)).fetchall()
    return [PublishedTable(ns, name, tuple(cols) if cols is not None else None, rf, int(oid))
            for ns, name, cols, rf, oid in rows]


def published_selection(conn: psycopg.Connection, publication: str, tables: TablesSettings) -> list[PublishedTable]:
    """The publication's tables that ``tables`` selects: what a config mirrors, wherever its rules put
    the Delta tables."""
    return [t for t in published_tables(conn, publication) if tables.selected(t.qualified_name)]
