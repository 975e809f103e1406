"""Tables with names readers and paths mishandle, made and changed alike in the tests of directory names
(tests/integration/test_escaped_names.py, test_safe_path_names.py): a helper module, not a test file."""

from __future__ import annotations

from psycopg import sql


def create_tables(conn, tables: list[tuple[str, str]], *, weird_column: bool = False) -> None:
    """Each ``(schema, table)`` made (its schema too) with five rows: ``id``, ``v`` and, with
    ``weird_column``, an int column named ``Weird col`` (a name ``column_names: safe`` escapes)."""
    extra = sql.SQL(', "Weird col" int') if weird_column else sql.SQL("")
    values = sql.SQL(", i * 10") if weird_column else sql.SQL("")
    for schema, table in tables:
        if schema != "public":
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        name = sql.Identifier(schema, table)
        conn.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v text{})").format(name, extra))
        conn.execute(sql.SQL("INSERT INTO {} SELECT i, {} || i{} FROM generate_series(1, 5) i").format(
            name, sql.Literal(table), values))


def change_tables(conn, tables: list[tuple[str, str]]) -> None:
    """An update (id 1), a delete (id 2) and an insert (id 6) in each table: what the stream brings."""
    for schema, table in tables:
        name = sql.Identifier(schema, table)
        conn.execute(sql.SQL("UPDATE {} SET v = v || '!' WHERE id = 1").format(name))
        conn.execute(sql.SQL("DELETE FROM {} WHERE id = 2").format(name))
        conn.execute(sql.SQL("INSERT INTO {} (id, v) VALUES (6, 'six')").format(name))
