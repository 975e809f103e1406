"""Is the slot safe? The server's own verdict on the WAL it keeps for us (``wal_status``, ``safe_wal_size``).

Why watch it: a slot that falls behind makes the server keep WAL; past ``max_wal_size`` the slot is
``extended``, past ``max_slot_wal_keep_size`` it is ``unreserved`` (the next checkpoint may remove what
we have not read) and then ``lost``: the changes are gone and the tables must be copied again. The
most common complaint in Debezium's and PeerDB's trackers is finding that out from a failed restart.
So the mirror warns while something can still be done (a faster apply, a larger keep size), and stops
with a precise error the moment the slot is lost, instead of following a stream with a hole in it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import psycopg

from applier.errors import SourceError
from applier.sources.slots import slot_lost_error

log = logging.getLogger("applier.slot")

#: ``wal_status`` values that mean the slot may lose WAL we have not read (PostgreSQL 13+)
AT_RISK = ("extended", "unreserved")


@dataclass(frozen=True, slots=True)
class SlotHealth:
    slot: str
    wal_status: str | None  # reserved | extended | unreserved | lost; None before PostgreSQL 13
    safe_wal_size: int | None  # bytes that may still be written before the slot is at risk; None: unlimited
    failover: bool | None  # PostgreSQL 17+: the slot is synchronized to standbys; None before 17

    @property
    def lost(self) -> bool:
        return self.wal_status == "lost"

    def risk(self, warn_below: int) -> str | None:
        """Why the slot is at risk, in words for the log; None when it is not."""
        if self.lost:
            return "wal_status is lost: the tables must be copied again (drop the slot, run mirror)"
        if self.wal_status in AT_RISK:
            more = ("the next checkpoint may remove WAL it still needs" if self.wal_status == "unreserved"
                    else "the server keeps WAL past max_wal_size for it")
            return f"wal_status is {self.wal_status} ({more})"
        if self.safe_wal_size is not None and self.safe_wal_size < warn_below:
            return f"only {self.safe_wal_size} bytes of WAL may be written before it exceeds max_slot_wal_keep_size"
        return None


def read_slot_health(conn: psycopg.Connection, slot: str) -> SlotHealth | None:
    """The slot's WAL state from ``pg_replication_slots``; None when no such slot exists."""
    version = conn.info.server_version
    columns = ", ".join([
        "wal_status" if version >= 130000 else "NULL::text",
        "safe_wal_size" if version >= 130000 else "NULL::bigint",
        "failover" if version >= 170000 else "NULL::bool"])
    row = conn.execute(f"SELECT {columns} FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
    if row is None:
        return None
    return SlotHealth(slot, row[0], int(row[1]) if row[1] is not None else None, row[2])


def slot_lost(slot: str) -> SourceError:
    """The stop for a lost slot (exit 3), with the way back: the same error as a START_REPLICATION or a
    peek on it gives (applier.sources.slots.slot_lost_error)."""
    error = slot_lost_error(slot, "55000", "replication slot has wal_status lost: the server removed WAL "
                            "the mirror had not read; raise max_slot_wal_keep_size to keep it from happening again")
    assert error is not None  # 55000 and a message naming the slot
    return error


class SlotWatch:
    """Checks the slot's WAL state now and then on a connection of its own: warns once per new risk,
    stops (raises) when the slot is lost."""

    def __init__(self, dsn: str, slot: str, *, warn_below: int, every: float = 30.0) -> None:
        self.dsn = dsn
        self.slot = slot
        self.warn_below = warn_below
        self.every = every
        self.last: SlotHealth | None = None
        self._checked = float("-inf")
        self._warned: str | None = None

    def check(self, *, force: bool = False) -> SlotHealth | None:
        """Read the state (at most once per ``every`` seconds unless ``force``); raise when lost."""
        now = time.monotonic()
        if not force and now - self._checked < self.every:
            return self.last
        self._checked = now
        try:
            with psycopg.connect(self.dsn, autocommit=True, connect_timeout=10) as conn:
                health = read_slot_health(conn, self.slot)
        except psycopg.Error as e:  # the stream reports a server that is gone; this is only a check
            log.debug("slot check skipped: %s", e)
            return self.last
        self.last = health
        if health is None:
            return None
        if health.lost:
            raise slot_lost(self.slot)
        risk = health.risk(self.warn_below)
        key = None if risk is None else (health.wal_status if health.wal_status in AT_RISK else "low")
        if risk is not None and key != self._warned:
            log.warning("slot %s is at risk: %s; the mirror must catch up (or max_slot_wal_keep_size be "
                        "raised) before the server removes that WAL, or the tables must be copied again",
                        self.slot, risk)
        elif risk is None and self._warned is not None:
            log.info("slot %s is safe again (wal_status %s)", self.slot, health.wal_status)
        self._warned = key
        return health
