"""Roles that must authenticate with a password, for the tests that check secrets never leak."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from psycopg import sql


@contextmanager
def role_with_password(pg: Any, role: str, password: str, *, replication: bool = False) -> Iterator[str]:
    """A LOGIN REPLICATION role that must give its password (scram) to this test database, and
    also to replication connections with ``replication``; dropped afterwards."""
    hba = Path(pg.cluster.datadir) / "pg_hba.conf"
    original = hba.read_text()
    lines = f"host all {role} 127.0.0.1/32 scram-sha-256\n"
    if replication:
        lines += f"host replication {role} 127.0.0.1/32 scram-sha-256\n"
    with pg.connect() as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN REPLICATION PASSWORD {}").format(
            sql.Identifier(role), sql.Literal(password)))
        hba.write_text(lines + original)
        conn.execute("SELECT pg_reload_conf()")
    try:
        yield role
    finally:
        hba.write_text(original)
        with pg.connect() as conn:
            conn.execute("SELECT pg_reload_conf()")
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
