"""Is the server holding the slot's changes back for a standby? (PostgreSQL 17+ failover slots)

Why: with ``synchronized_standby_slots`` set on the primary, a logical slot created with FAILOVER is sent
changes only once every physical slot named there has confirmed the WAL that carries them, so that no
reader of the slot is ever ahead of the standby that would take over. When such a standby is down or
behind, the walsender sends keepalives and no data, and its keepalives carry the position it has sent,
not the server's: a ``mirror --once`` used to wait for ever for a keepalive at the flush position, and
said "lag 0 bytes (caught up)" every 10 s while ``status`` showed it 161 kB behind. The SQL functions
(peek, and so ``capture`` and ``read_mode: sql``) wait inside the call. So the readers ask the server here
which standby slot it waits for, say so, read only as far as the server releases, and a drain stops after
``source.standby_wait_seconds`` with ``HeldBackError`` (exit 6), never "caught up".

What the server checks (StandbySlotsHaveCaughtup in PostgreSQL's slot.c): every slot named must exist, be
physical, not be invalidated, and have a ``restart_lsn`` at or past the position to send.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import psycopg

from applier.errors import HeldBackError, SourceError
from applier.lsn import format_lsn, parse_lsn
from applier.sources.sql_slot import current_flush_lsn

log = logging.getLogger("applier.slot")


@dataclass(frozen=True, slots=True)
class StandbyWait:
    """One slot named in ``synchronized_standby_slots`` that has not confirmed the position wanted."""

    slot: str
    why: str  # in words: missing, logical, invalidated, no standby connected, behind
    connected: bool = False  # its standby is connected and only behind: the wait may end by itself at once
    confirmed: int | None = None  # how far its standby has confirmed (restart_lsn), when known

    def line(self) -> str:
        return f"{self.slot} ({self.why})"


@dataclass(frozen=True, slots=True)
class HeldBack:
    """The server holds ``slot``'s changes past ``released`` back until ``waits`` confirm ``wanted``."""

    slot: str  # the mirror's (logical, failover) slot
    wanted: int  # the position the reader wants to reach (the server's flush position)
    released: int | None  # how far the server sends now: the least restart_lsn of the standby slots
    waits: tuple[StandbyWait, ...]

    @property
    def settled(self) -> bool:
        """A wait no standby ends by itself in a moment (a slot missing, invalidated, or without its standby),
        as opposed to a connected standby a little behind, which a busy server shows now and then."""
        return any(not w.connected for w in self.waits)

    def phrase(self) -> str:
        """For a log line: which standby slots the server waits for and why."""
        names = "; ".join(w.line() for w in self.waits)
        upto = f"; it sends changes up to {format_lsn(self.released)} only" if self.released else ""
        return (f"the server is holding changes of slot {self.slot} back for standby slot(s) named in "
                f"synchronized_standby_slots: {names}{upto}, short of {format_lsn(self.wanted)}")

    def remedy(self) -> str:
        return ("start that standby (or let it catch up), or remove its slot from synchronized_standby_slots on "
                "the primary (ALTER SYSTEM, then SELECT pg_reload_conf()); nothing is wrong with the mirror, and "
                "nothing reaches it until then")

    def error(self, waited: float) -> HeldBackError:
        """The stop of a drain that waited ``waited`` seconds (exit 6)."""
        return HeldBackError(f"{self.phrase()}. Waited {waited:.0f}s (source.standby_wait_seconds); {self.remedy()}, "
                             "then run again", slot=self.slot, standby_slots=", ".join(w.slot for w in self.waits),
                             wanted_lsn=self.wanted)


def standby_slot_names(setting: str) -> list[str]:
    """The slot names of a ``synchronized_standby_slots`` value (comma-separated; a name may be quoted)."""
    return [n.strip().strip('"') for n in setting.split(",") if n.strip().strip('"')]


def holding_back(conn: psycopg.Connection, slot: str, wanted: int) -> HeldBack | None:
    """What the server holds back of ``slot`` short of ``wanted``; None when it sends all of it: before
    PostgreSQL 17, for a slot without failover, with ``synchronized_standby_slots`` empty, or when every
    slot named has confirmed ``wanted``."""
    if conn.info.server_version < 170000:
        return None
    row = conn.execute("SELECT current_setting('synchronized_standby_slots', true), "
                       "(SELECT failover FROM pg_replication_slots WHERE slot_name = %s)", (slot,)).fetchone()
    if row is None or not row[0] or not row[1]:
        return None
    names = standby_slot_names(str(row[0]))
    found = {str(r[0]): r[1:] for r in conn.execute(
        "SELECT slot_name, slot_type, active, restart_lsn::text, "
        "invalidation_reason IS NOT NULL OR wal_status = 'lost' FROM pg_replication_slots "
        "WHERE slot_name = ANY(%s)", (names,))}
    waits: list[StandbyWait] = []
    released: int | None = None
    for name in names:
        if name not in found:
            waits.append(StandbyWait(name, "no such slot on this server"))
            released = 0
            continue
        kind, active, restart, invalidated = found[name]
        if kind != "physical":
            waits.append(StandbyWait(name, f"a {kind} slot: synchronized_standby_slots takes the standbys' "
                                           "physical slots"))
            released = 0
        elif invalidated:
            waits.append(StandbyWait(name, "invalidated: its standby must be rebuilt"))
            released = 0
        else:
            at = parse_lsn(restart) if restart is not None else 0
            released = at if released is None else min(released, at)
            if at < wanted:
                state = "connected" if active else "no standby connected"
                waits.append(StandbyWait(name, f"{state}, confirmed up to {format_lsn(at)}, "
                                               f"{wanted - at} bytes behind", connected=bool(active), confirmed=at))
    if not waits:
        return None
    return HeldBack(slot, wanted, released or None, tuple(waits))


def readable_upto(conn: psycopg.Connection, slot: str, target: int) -> tuple[int, HeldBack | None]:
    """How far a peek of ``slot`` may read now without waiting inside the call: ``target``, or while the
    server holds changes back, the position it has released (0: none), with what holds them."""
    held = holding_back(conn, slot, target)
    if held is None:
        return target, None
    return min(target, held.released or 0), held


#: a connected standby behind is a hold only once it has confirmed nothing more for this long (on a busy
#: server a healthy standby is always a little behind); a slot missing or without its standby is one at once
PERSIST_SECONDS = 2.0


class HoldWatch:
    """Whether the server is holding the slot's changes back for a standby, asked on a connection of its own
    at most every ``every`` seconds (or told by a reader that asked itself: ``seen``). ``held`` is the hold
    the readers report: a settled one at once, a connected standby's lag once it has lasted
    ``PERSIST_SECONDS``. Each new one is logged with the standby slots it waits for; a drain calls
    ``waited_out``, which stops it with HeldBackError (exit 6) once the hold has lasted ``wait_seconds``:
    it used to wait for ever, saying "caught up"."""

    def __init__(self, dsn: str, slot: str, *, wait_seconds: float, every: float = 2.0) -> None:
        self.dsn = dsn
        self.slot = slot
        self.wait_seconds = wait_seconds
        self.every = every
        self.held: HeldBack | None = None
        self._since: float | None = None  # when the current hold was first seen
        self._checked = float("-inf")
        self._said: tuple[str, ...] | None = None
        self._conn: psycopg.Connection | None = None
        self._never = False  # before PostgreSQL 17: no server holds anything back
        self._positions: dict[str, int | None] = {}  # the standby slots' positions at the last answer

    def check(self, wanted: int | None = None) -> HeldBack | None:
        """Ask (at most every ``every`` seconds) whether changes short of ``wanted`` (None: the server's
        position now) are held back; returns ``held``. A failed question keeps the last answer."""
        now = time.monotonic()
        if self._never or now - self._checked < self.every:
            return self.held
        self._checked = now
        try:
            if self._conn is None or self._conn.closed:
                self._conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=10)
            if self._conn.info.server_version < 170000:  # (synchronized_standby_slots came with 17)
                self._never = True
                self.close()
                return None
            position = wanted if wanted is not None else current_flush_lsn(self._conn)
            held = holding_back(self._conn, self.slot, position)
        except (psycopg.Error, SourceError) as e:  # the stream reports a server that is gone; this is a question
            log.debug("held-back check skipped: %s", e)
            return self.held
        return self.seen(held)

    def seen(self, held: HeldBack | None) -> HeldBack | None:
        """The server's answer now (asked here, or by a reader before its peek); returns ``held``."""
        now = time.monotonic()
        if held is None:
            if self._said:
                log.info("slot %s: the server sends its changes again (the standby slots have confirmed them)",
                         self.slot)
            self.held, self._since, self._said, self._positions = None, None, None, {}
            return None
        positions = {w.slot: w.confirmed for w in held.waits}
        moved = any((positions.get(k) or 0) > (v or 0) for k, v in self._positions.items())
        self._positions = positions
        if self._since is None or (not held.settled and moved):
            self._since = now  # (a connected standby that confirms more is not stuck: counted from now)
        if not held.settled and now - self._since < PERSIST_SECONDS:
            self.held = None  # not (yet) a hold
            return None
        self.held = held
        names = tuple(w.slot for w in held.waits)
        if names != self._said:
            log.warning("%s. %s", held.phrase(), held.remedy())
            self._said = names
        return held

    def waited_out(self) -> None:
        """HeldBackError when the server has held changes back for ``wait_seconds`` (since first seen)."""
        if self.held is not None and self._since is not None:
            waited = time.monotonic() - self._since
            if waited >= self.wait_seconds:
                raise self.held.error(waited)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
