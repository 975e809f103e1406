"""What the server says about a replication slot, and the error for a slot that is gone."""

from __future__ import annotations

from dataclasses import dataclass

import psycopg

from applier.errors import SlotUnusableError
from applier.lsn import parse_lsn


@dataclass(frozen=True, slots=True)
class SlotInfo:
    plugin: str | None  # None: a physical slot
    confirmed_flush_lsn: int | None
    slot_type: str = "logical"


def slot_info(conn: psycopg.Connection, slot: str) -> SlotInfo | None:
    """The slot's plugin, confirmed position and type; None when no such slot exists."""
    row = conn.execute("SELECT plugin, confirmed_flush_lsn::text, slot_type FROM pg_replication_slots "
                       "WHERE slot_name = %s", (slot,)).fetchone()
    if row is None:
        return None
    return SlotInfo(row[0], parse_lsn(row[1]) if row[1] is not None else None, str(row[2]))


def check_usable(slot: str, info: SlotInfo) -> None:
    """SlotUnusableError (exit 2) for a slot this mirror cannot read: a physical slot, or a logical slot
    of another plugin (test_decoding, wal2json...), each said as what it is, with the way on."""
    if info.slot_type != "logical":
        raise SlotUnusableError(
            f"slot {slot!r} is a {info.slot_type} replication slot (a standby's), not a logical one: a mirror needs a "
            "logical slot of the pgoutput plugin. Name another slot in source.slot (the mirror creates it); do not "
            "drop this one if a standby uses it", slot=slot)
    if info.plugin != "pgoutput":
        raise SlotUnusableError(
            f"slot {slot!r} decodes with the {info.plugin!r} plugin, not pgoutput, so this mirror cannot read it. "
            "Name another slot in source.slot (the mirror creates it), or drop this one if nothing else reads it: "
            f"SELECT pg_drop_replication_slot('{slot}')", slot=slot, plugin=info.plugin)


def slot_lost_error(slot: str, sqlstate: str | None, message: str) -> SlotUnusableError | None:
    """The error for a slot that was dropped (42704) or invalidated (55000, e.g. max_slot_wal_keep_size
    exceeded) under a running mirror, with the way back; None for other failures."""
    if sqlstate not in ("42704", "55000") or "slot" not in message:
        return None
    return SlotUnusableError(
        f"the replication slot can no longer be read ({message.splitlines()[0]}). The changes since the "
        f"last confirmed position are gone from the server, so the tables must be copied again: drop the "
        f"slot if it still exists (SELECT pg_drop_replication_slot('{slot}')) and run mirror again; it "
        "creates the slot, takes a new snapshot and replaces the tables, then follows the stream",
        slot=slot, sqlstate=sqlstate)


def sync_slot_prefix(slot: str) -> str:
    """The name a table sync's temporary slot starts with (the pid of the mirror follows)."""
    return f"{slot}_sync_"


def prepared_phrase(gids: list[str]) -> str:
    """The prepared transactions a slot's creation waits for, as the wait lines name them (five at most)."""
    return f"{len(gids)} prepared transaction(s) ({', '.join(gids[:5])}{', ...' if len(gids) > 5 else ''})"


def open_phrase(running: list[str]) -> str:
    """The open transactions a slot's creation waits for (``slot_creation_blockers``), five at most."""
    return f"{len(running)} open transaction(s) ({'; '.join(running[:5])}{'; ...' if len(running) > 5 else ''})"


def slot_creation_blockers(conn: psycopg.Connection) -> tuple[list[str], list[str]]:
    """What creating a logical slot now would wait for: the prepared transactions (their gids) and
    the open transactions that hold a transaction id (pid, database, state, age), oldest first.
    Creating a slot waits until every one of them ends; a prepared one waits for a user."""
    gids = [str(r[0]) for r in conn.execute("SELECT gid FROM pg_prepared_xacts ORDER BY prepared")]
    running = [f"pid {r[0]} ({r[1]}, {r[2]}, open {r[3]}s)" for r in conn.execute(
        "SELECT pid, coalesce(datname, '-'), coalesce(state, '-'), "
        "coalesce(extract(epoch FROM now() - xact_start)::int, 0) FROM pg_stat_activity "
        "WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid() ORDER BY xact_start")]
    return gids, running


def standby_slot_wait(conn: psycopg.Connection) -> str | None:
    """On a standby (PostgreSQL 16+), what creating a logical slot waits for beyond the open transactions:
    a record of the primary's running transactions, which the primary logs every 15 s only while it writes
    WAL (an idle primary never does); None on a primary."""
    row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
    if not row or not row[0]:
        return None
    return ("this server is a standby: the slot waits for the primary to log its running transactions (every "
            "15 s while the primary writes; an idle primary does not), and SELECT pg_log_standby_snapshot() on "
            "the primary logs one now")
