"""Read a logical slot through SQL: peek, apply, then advance.

Why peek and not get: ``pg_logical_slot_get_binary_changes`` confirms the changes to the server as
it returns them, before anything is applied; a crash after that loses them. We peek, apply, and
only then call ``pg_replication_slot_advance`` to the end LSN of what is durably applied.

Text values follow the decoding session's settings, so the session is pinned first (the same
settings PostgreSQL's own subscriber pins, plus the ones our parsers rely on).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import psycopg

from applier.config import SourceSettings
from applier.errors import ConfigError, SourceError, TransientSourceError
from applier.lsn import format_lsn, parse_lsn
from applier.sources.failures import stream_error

#: Session settings that make text output deterministic and parseable (see values/).
PINNED_SESSION_SETTINGS: Mapping[str, str] = {
    "DateStyle": "ISO",
    "IntervalStyle": "postgres",
    "extra_float_digits": "3",
    "bytea_output": "hex",
    "TimeZone": "UTC",
    "client_encoding": "UTF8",
}


#: The position a reader of a slot on this server may go to: the flush position on a primary; on a standby
#: (PostgreSQL 16+ decodes there) what it has replayed, which is as far as its walsender and the SQL functions
#: decode. pg_current_wal_flush_lsn() is an error during recovery ("recovery is in progress"), and used to
#: make every run against a standby exit 3.
SERVER_POSITION_SQL = ("CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() "
                       "ELSE pg_current_wal_flush_lsn() END")


def current_flush_lsn(conn: psycopg.Connection) -> int:
    """The server's WAL flush position (on a standby: its replay position, see ``SERVER_POSITION_SQL``):
    how far a drain (``--once``) reads, and where an idle slot may be confirmed to."""
    row = conn.execute(f"SELECT ({SERVER_POSITION_SQL})::text").fetchone()
    assert row is not None  # the expression always returns a row
    if row[0] is None:  # a standby that has replayed nothing yet (it is still starting)
        raise TransientSourceError("the standby has not replayed any WAL yet: it is still starting up")
    return parse_lsn(row[0])


def pin_session(conn: psycopg.Connection) -> None:
    for name, value in PINNED_SESSION_SETTINGS.items():
        conn.execute("SELECT set_config(%s, %s, false)", (name, value))


@dataclass(frozen=True, slots=True)
class PeekedMessage:
    lsn: int
    xid: int
    data: bytes


def pgoutput_options(publication: str, *, proto_version: int = 1, binary: bool = False,
                     messages: bool = False, streaming: str | None = None,
                     origin: str | None = None) -> dict[str, str]:
    """The pgoutput option list; only options that differ from the server default are sent."""
    opts = {"proto_version": str(proto_version), "publication_names": publication}
    if binary:
        opts["binary"] = "true"
    if messages:
        opts["messages"] = "true"
    if streaming:
        opts["streaming"] = streaming
    if origin:
        opts["origin"] = origin
    return opts


def options_for(source: SourceSettings) -> dict[str, str]:
    """The pgoutput options a source config asks for (two_phase only when configured)."""
    opts = pgoutput_options(source.publication, proto_version=source.proto_version, binary=source.binary,
                            messages=source.messages,
                            streaming=None if source.streaming == "off" else source.streaming, origin=source.origin)
    if source.two_phase:
        opts["two_phase"] = "true"
    return opts


def flat_options(options: Mapping[str, str]) -> list[str]:
    """pgoutput's options as the SQL functions take them (``VARIADIC text[]``: name, value, name, ...)."""
    return [item for pair in options.items() for item in pair]


def peek(conn: psycopg.Connection, slot: str, options: Mapping[str, str], *,
         upto_lsn: int | None = None, upto_nchanges: int | None = None) -> Iterator[PeekedMessage]:
    """Every message the slot would send now (from its confirmed position), in order; nothing is confirmed."""
    pin_session(conn)
    flat = flat_options(options)
    try:
        cur = conn.execute(
            "SELECT lsn::text, xid::text::bigint, data FROM pg_logical_slot_peek_binary_changes("
            "%s, %s::pg_lsn, %s, VARIADIC %s::text[])",
            (slot, format_lsn(upto_lsn) if upto_lsn is not None else None, upto_nchanges, flat),
        )
    except psycopg.Error as e:
        raise stream_error(f"peeking slot {slot!r} failed: {e.diag.message_primary or e}", e.sqlstate,
                           isinstance(e, psycopg.OperationalError), slot=slot) from e
    for lsn, xid, data in cur:
        yield PeekedMessage(parse_lsn(lsn), int(xid), bytes(data))


def advance(conn: psycopg.Connection, slot: str, lsn: int) -> int:
    """Confirm everything up to ``lsn`` (an applied transaction's end LSN); returns the slot's new position."""
    try:
        row = conn.execute("SELECT end_lsn::text FROM pg_replication_slot_advance(%s, %s::pg_lsn)",
                           (slot, format_lsn(lsn))).fetchone()
    except psycopg.Error as e:
        raise SourceError(f"advancing slot {slot!r} failed: {e.diag.message_primary or e}",
                          slot=slot, lsn=lsn) from e
    assert row is not None  # the function returns one row or raises
    return parse_lsn(row[0])


def create_slot(conn: psycopg.Connection, slot: str, *, two_phase: bool = False, failover: bool = False) -> int:
    """Create a pgoutput slot (no-op if it exists); returns its confirmed position.

    Slot creation waits for every transaction running at that moment, prepared ones included; if it
    takes long, look at pg_stat_activity and pg_prepared_xacts.
    """
    row = conn.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                       (slot,)).fetchone()
    if row is not None:
        return parse_lsn(row[0])
    args: tuple[object, ...] = (slot, "pgoutput", False, two_phase) if two_phase else (slot, "pgoutput")
    if failover and conn.info.server_version < 170000:
        raise ConfigError("source.failover needs PostgreSQL 17 or later (failover slots)", slot=slot)
    if failover:  # PostgreSQL 17+: pg_create_logical_replication_slot(name, plugin, temporary, twophase, failover)
        args = (slot, "pgoutput", False, two_phase, True)
    placeholders = ", ".join(["%s"] * len(args))
    created = conn.execute(f"SELECT lsn::text FROM pg_create_logical_replication_slot({placeholders})",
                           args).fetchone()
    assert created is not None  # the function returns one row or raises
    return parse_lsn(created[0])
