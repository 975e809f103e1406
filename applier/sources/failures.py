"""Which source failures a reconnect can cure, told apart once for the replication and SQL readers."""

from __future__ import annotations

from applier.errors import SourceError, TransientSourceError

#: Connection failures that no retry cures (they need the user), told apart by the server's message.
PERMANENT_CONNECT_FAILURES = ("authentication failed", "does not exist", "no pg_hba.conf entry",
                              "permission denied", "must be superuser or replication role",
                              "must have the REPLICATION", "invalid connection option", "missing \"=\"")


def is_transient(sqlstate: str | None, connection_lost: bool, message: str = "") -> bool:
    """A failure a reconnect can cure: the connection broke, or the server is shutting down, restarting
    or starting up (SQLSTATE class 08, 57P01-57P03). Not: a missing or invalidated slot, a refused
    login, a missing publication."""
    if sqlstate is None:  # a connection-time failure: libpq gives the server's words, not its code
        return connection_lost and not any(p in message for p in PERMANENT_CONNECT_FAILURES)
    return sqlstate.startswith("08") or sqlstate in ("57P01", "57P02", "57P03")


def stream_error(message: str, sqlstate: str | None, connection_lost: bool, **context: object) -> SourceError:
    cls = TransientSourceError if is_transient(sqlstate, connection_lost, message) else SourceError
    return cls(message, sqlstate=sqlstate, **context)
