"""Which tables a publication sends, as pgoutput names them, and which of those a config mirrors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import psycopg

from applier.errors import SourceError

if TYPE_CHECKING:
    from applier.config import TablesSettings


@dataclass(frozen=True, slots=True)
class PublishedTable:
    namespace: str
    name: str
    columns: tuple[str, ...] | None  # the publication's column list (None: all columns)
    row_filter: str | None  # the publication's WHERE clause, as SQL

    @property
    def qualified_name(self) -> str:
        return f"{self.namespace}.{self.name}"


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def published_tables(conn: psycopg.Connection, publication: str) -> list[PublishedTable]:
    """The tables the publication sends changes for (as pgoutput names them), with column lists and
    row filters on servers that have them (PG 15+). The column list is exactly the columns pgoutput
    sends: stored generated columns only on PostgreSQL 18+ where the publication publishes them
    (``publish_generated_columns = stored`` or a column list naming them); PostgreSQL 15 to 17 list
    generated columns in ``pg_publication_tables.attnames`` but never send them."""
    exists = conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (publication,)).fetchone()
    if exists is None:
        raise SourceError(f"publication {publication!r} does not exist; create it first, e.g. "
                          f"CREATE PUBLICATION {quote_ident(publication)} FOR TABLE ... (or FOR ALL TABLES)",
                          publication=publication)
    version = conn.info.server_version
    if version >= 180000:  # attnames is what pgoutput sends, stored generated columns included when published
        extra = ", attnames, rowfilter"
    elif version >= 150000:  # attnames lists generated columns, which pgoutput before 18 never sends
        extra = (", ARRAY(SELECT n FROM unnest(attnames) n WHERE NOT EXISTS (SELECT 1 FROM pg_attribute a "
                 "WHERE a.attrelid = format('%%I.%%I', schemaname, tablename)::regclass AND a.attname = n "
                 "AND a.attgenerated <> '')), rowfilter")
    else:
        extra = ", NULL::name[], NULL::text"
    rows = conn.execute(f"SELECT schemaname, tablename{extra} FROM pg_publication_tables WHERE pubname = %s "
                        "ORDER BY 1, 2", (publication,)).fetchall()
    return [PublishedTable(ns, name, tuple(cols) if cols is not None else None, rf) for ns, name, cols, rf in rows]


def published_selection(conn: psycopg.Connection, publication: str, tables: TablesSettings) -> list[PublishedTable]:
    """The publication's tables that ``tables`` selects: what a config mirrors, wherever its rules put
    the Delta tables."""
    return [t for t in published_tables(conn, publication) if tables.selected(t.qualified_name)]
