"""The DSN checked before anything expensive starts: parsed, its sslmode validated, one connection made.

A mirror that cannot parse its DSN, has a typo in ``sslmode`` or a wrong password must say so in one
line, at once, and without echoing the DSN; it must not start Spark (maybe download jars) and then
retry for minutes as if the server were restarting. Retries are for outages after a good start.

The DSN is handed to libpq unchanged, so everything libpq reads is honoured: ``sslmode``,
``sslrootcert``, ``service`` (pg_service.conf), ``passfile`` (~/.pgpass) and the PG* environment
variables (PGHOST, PGPASSWORD, PGSSLMODE, ...).
"""

from __future__ import annotations

import os
import re
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from applier.errors import ConfigError, SourceError
from applier.infra.redact import register, scrub

#: The values libpq accepts for sslmode. verify-full (with sslrootcert) is the one we recommend.
SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
#: Seconds the first connection may take when neither the DSN nor PGCONNECT_TIMEOUT says.
CONNECT_TIMEOUT = 15


def parse_dsn(dsn: str) -> dict[str, Any]:
    """The DSN's settings; ConfigError (naming no part of it) when libpq cannot parse it or its
    sslmode is not one libpq knows."""
    register(dsn)
    try:
        parts: dict[str, Any] = conninfo_to_dict(dsn)
    except psycopg.Error:
        raise ConfigError(
            "the DSN is not a valid libpq connection string (space-separated key=value pairs with values "
            "that hold spaces in single quotes, or a postgresql:// URI); its text is not shown because it "
            "may hold a password") from None
    sslmode = parts.get("sslmode", os.environ.get("PGSSLMODE"))
    if sslmode is not None and sslmode not in SSLMODES:
        raise ConfigError(f"invalid sslmode in the DSN (or PGSSLMODE): use one of {', '.join(SSLMODES)} "
                          "(verify-full with sslrootcert=/path/to/ca.crt is the safe choice)")
    return parts


def one_line(message: str) -> str:
    """libpq's multi-line message as one line, secrets masked."""
    return " ".join(part.strip() for part in scrub(message).splitlines() if part.strip())


def without_dsn_values(text: str, parts: dict[str, Any]) -> str:
    """``text`` with every value of the DSN replaced by its key (``"<host>"``, ``<port>``, ``"<user>"``):
    libpq's messages quote the host, port and user, and an error must show no part of the DSN."""
    for key, value in sorted(parts.items(), key=lambda kv: -len(str(kv[1]))):
        value = str(value)
        if value:
            text = re.sub(r"(?<![\w.\-])" + re.escape(value) + r"(?![\w.\-])", f"<{key}>", text)
    return text


def check_connection(dsn: str) -> None:
    """Parse ``dsn`` and make one connection with it, so that a wrong DSN fails before Spark starts.

    ConfigError (exit 2) for a DSN libpq refuses to use; SourceError (exit 3) when the server cannot
    be reached or refuses the login. No retry: a first connection that fails is not an outage."""
    parts = parse_dsn(dsn)
    timeout: int | None = None
    if "connect_timeout" not in parts and not os.environ.get("PGCONNECT_TIMEOUT"):
        timeout = CONNECT_TIMEOUT
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=timeout) as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError as e:
        text = without_dsn_values(one_line(str(e)), parts)
        if e.sqlstate is None and ("invalid" in text or "unrecognized" in text):
            raise ConfigError(f"libpq refuses the DSN: {text}") from None
        raise SourceError(f"cannot connect to PostgreSQL: {text}", sqlstate=e.sqlstate) from None
    except psycopg.Error as e:
        raise ConfigError(f"libpq refuses the DSN: {without_dsn_values(one_line(str(e)), parts)}") from None
