"""Following a slot once the tables are copied: the two read modes around the one apply loop.

Both feed raw messages to the loop and hand it a confirm function; they differ in how messages
arrive and how the server is told: the replication protocol (``ReplicationFollower``: standby status
updates, keepalives confirmed when nothing is pending) and SQL peek/advance (``SqlFollower``: every
peek is a new decoding session; an idle slot is advanced to the flush position).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import psycopg

from applier.config import SourceSettings
from applier.errors import SourceError
from applier.infra.progress import Backlog, Progress, ProgressReport
from applier.loop import ApplyLoop
from applier.lsn import format_lsn
from applier.protocol.replication import PrimaryKeepalive, pg_now
from applier.sources import sql_slot
from applier.sources.heldback import HeldBack, HoldWatch, readable_upto
from applier.sources.slothealth import SlotHealth, SlotWatch
from applier.sources.slots import slot_info, slot_lost_error
from applier.sources.walsender import WalSenderStream


@dataclass
class FollowStats:
    messages: int = 0
    transactions: int = 0
    confirmed_lsn: int | None = None
    stopped_by: str = "end"


class CatchUp(Protocol):
    """A backlog caught up in ranges (``ReplicationFollower``'s ``catch_up``): the started stream, the
    server's flush position, the backlog's bytes of WAL and the feed into the loop; ``following``: the
    follower fell behind; ``until``: a round, read as the stream brings it until that instant
    (``time.monotonic()``) or until the stream is quiet, not up to the flush position. Returns whether it
    caught up (False: the backlog is not one for ranges)."""

    def __call__(self, stream: WalSenderStream, flush: int, backlog: int, feed: Callable[[int, bytes], None], *,
                 following: bool = False, until: float | None = None) -> bool: ...


class CopyCatchUp(Protocol):
    """The backlog at the start caught up before the walsender starts (``ReplicationFollower``'s
    ``copy_catch_up``): the server's flush position, the backlog's bytes of WAL and the feed into the loop.
    Returns the slot's new confirmed position, or None when the backlog was not read this way."""

    def __call__(self, flush: int, backlog: int, feed: Callable[[int, bytes], None]) -> int | None: ...


#: once rounds run, a round that ended quiet (or left an open transaction to the loop) is followed by
#: another when this much more WAL arrived: the load goes on (one that ran its time is followed at once)
ONGOING_LOAD_BYTES = 64 << 10


class FallingBehind:
    """Whether a follower that keeps receiving has fallen ``threshold`` bytes of WAL behind the server.

    Why: a group that fills faster than it is applied makes the next one larger, and the per-message
    path then falls further behind under a steady load (bench/follow.py); ranges fold the same
    messages in a fraction of the CPU. The stream does not say how far behind it is (a logical
    walsender's positions are those of what it sent), so the server's flush position is asked on a
    connection of its own, at most every ``every`` seconds and only once messages have kept arriving
    for ``busy_seconds`` without the socket running dry: a loop that keeps up finds it empty between
    transactions (bench/lag.py's 200 or 1,000 a second: every few milliseconds), one that falls behind
    never does. A burst is then found after about half a second (two questions: the backlog must grow
    between them, or shrink too slowly to be worked off within ``work_off`` seconds); it used to be found
    only once a group came due (``apply.max_group_seconds``), and a load of a few seconds ended before the
    rounds began, its backlog left to the per-message path (bench/RESULTS.md, thirty-fifth session)."""

    def __init__(self, dsn: str, threshold: int, *, every: float = 0.25, busy_seconds: float = 0.25,
                 work_off: float = 0.5, backoff: float = 60.0) -> None:
        self.dsn = dsn
        self.threshold = threshold
        self.every = every
        self.busy_seconds = busy_seconds
        self.work_off = work_off
        self.backoff = backoff
        self.wanted = False  # behind: catch up at the next point where no transaction is open
        self.continuing = False  # wanted by a round that ended in an open transaction: the load goes on
        self._conn: psycopg.Connection | None = None
        self._next_check = 0.0
        self._busy_since: float | None = None  # the first message since the socket last ran dry
        self._last_behind: int | None = None  # the answer to the last question of this busy spell
        self._last_asked = 0.0  # when it was given

    def dry(self) -> None:
        """The socket had nothing more: the loop has read all that was sent."""
        self._busy_since = self._last_behind = None

    def arrived(self, read: int) -> None:
        """A message at ``read`` was fed: set ``wanted`` when messages have kept arriving for
        ``busy_seconds`` and the server is ``threshold`` ahead, and further ahead than at the last
        question of this busy spell, or closer by so little that at that pace the loop would need more
        than ``work_off`` seconds to catch up. A backlog the loop works off (left by a slow commit)
        shrinks fast, and stays with the per-message path; rounds hold a transaction up to
        ``apply.max_group_seconds``. One that shrank slowly (500 kB, 36 kB closer after a quarter of a
        second: a load about as fast as the loop) was left to the loop, which was still working it off
        when the load ended: drains of 0.3 s, where a round's are 0.07 s (bench/RESULTS.md, thirty-sixth
        session)."""
        now = time.monotonic()
        if self._busy_since is None:
            self._busy_since = now
        elif self.threshold and not self.wanted and now - self._busy_since >= self.busy_seconds \
                and now >= self._next_check:
            self._next_check = now + self.every
            behind = self.server_flush() - read
            last, self._last_behind = self._last_behind, behind
            since, self._last_asked = now - self._last_asked, now
            # closer by (last - behind) in ``since`` seconds: at that pace, the rest takes longer than work_off
            self.wanted = behind >= self.threshold and last is not None \
                and behind * since > (last - behind) * self.work_off

    def server_flush(self) -> int:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.dsn, autocommit=True)
        return sql_slot.current_flush_lsn(self._conn)

    def next_round_bytes(self) -> int:
        """How far behind a round is worth starting: ``threshold``, or while rounds go on under a load
        (``continuing``) ``ongoing_bytes``."""
        return self.ongoing_bytes() if self.continuing else self.threshold

    def ongoing_bytes(self) -> int:
        """How much more WAL starts the next round once rounds run: ``ONGOING_LOAD_BYTES`` (at most
        ``threshold``)."""
        return min(self.threshold, ONGOING_LOAD_BYTES)

    def refused(self) -> None:
        """The catch-up was not for ranges (the settings or the state want the driver path): ask later."""
        self._next_check = time.monotonic() + self.backoff

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


#: a drain whose stream has brought nothing for this long, short of its target, asks whether the server is
#: holding changes back for a standby (a caught-up drain ends within half a second: applier.sources.heldback);
#: the lag lines ask at each report
HOLD_QUIET_SECONDS = 2.0


class SlotFollower:
    def __init__(self, dsn: str, source: SourceSettings, loop: ApplyLoop, stats: FollowStats,
                 stop: threading.Event, progress: Progress, progress_every: float) -> None:
        self.dsn = dsn
        self.source = source
        self.loop = loop
        self.stats = stats
        self.stop = stop
        self.progress = progress
        self.progress_every = progress_every
        # the slot's WAL state, read now and then: warns while the slot is at risk, stops when it is lost
        self.watch = SlotWatch(dsn, source.slot, warn_below=source.wal_warning_bytes)
        # whether the server holds the slot's changes back for a standby (synchronized_standby_slots)
        self.hold = HoldWatch(dsn, source.slot, wait_seconds=source.standby_wait_seconds)
        self._backlog: Backlog | None = None

    def run(self, once: bool) -> None:
        raise NotImplementedError

    def _session_start(self, slot_confirmed: int | None) -> None:
        """Let the staging store say whether it holds every Prepare of this slot (a Commit Prepared
        with nothing staged is then an empty transaction: applier.assembly.staging)."""
        store = self.loop.feeder.assembler.prepared
        if store is not None:
            store.vouch(self.source.slot, slot_confirmed)

    def _confirming(self, lsn: int) -> None:
        """Called before the server is told ``lsn``: the staging store's record stays ahead of it."""
        store = self.loop.feeder.assembler.prepared
        if store is not None:
            store.confirming(lsn)

    def flush(self, *, wait: bool = True) -> int | None:
        """Apply the pending group (see applier.loop); returns the end LSN now confirmed, if any.
        ``wait=False``: with ``apply.overlap_groups``, only hand it over and keep reading."""
        end = self.loop.flush() if wait else self.loop.dispatch()
        self._checked_slot(self.watch.check())  # at most every 30 s
        self.stats.transactions = self.loop.transactions
        if end is not None:
            self.stats.confirmed_lsn = end
        return end

    def _checked_slot(self, health: SlotHealth | None) -> None:
        metrics = self.loop.metrics
        if metrics is not None:
            metrics.beat()  # a group was applied, or the stream was found idle
            if health is not None:
                metrics.slot(health)

    def _feed(self, lsn: int, data: bytes) -> None:
        try:
            self.loop.feed(lsn, None, data)
        finally:
            self._sync_stats()

    def _sync_stats(self) -> None:
        """The run's counters from the loop's (after a message, or after a catch-up fed many)."""
        self.stats.messages = self.loop.messages
        self.stats.transactions = self.loop.transactions
        if self.loop.confirmed_lsn is not None:
            self.stats.confirmed_lsn = self.loop.confirmed_lsn

    def _lag(self, server_lsn: int, confirmed_lsn: int | None, held: HeldBack | None = None) -> ProgressReport:
        """The progress line: what the server has, what it was told, and how far behind that is.
        ``confirmed_lsn`` is the slot's position as this run knows it (applied groups, and idle
        confirmations of WAL that carries nothing for us), so a caught-up mirror says 0. ``held``: the
        server holds changes back for a standby; the line says so, with the server's own position (a
        walsender's keepalives carry what it sent, and a held-back mirror used to say "caught up")."""
        if held is not None:
            server_lsn = max(server_lsn, held.wanted)
        applied = max(confirmed_lsn or 0, self.loop.confirmed_lsn or 0)
        self.stats.confirmed_lsn = applied or None
        behind = max(server_lsn - applied, 0) if applied else None
        seconds = 0.0
        if self.loop.last_commit_time is not None and not self.loop.idle():
            seconds = max((pg_now() - self.loop.last_commit_time) / 1e6, 0.0)
        lag = f"{behind} bytes" if behind is not None else "unknown (nothing confirmed yet)"
        if self.loop.metrics is not None:
            self.loop.metrics.lag(behind, seconds)
        fields: dict[str, object] = {"task": "follow"}
        if held is not None:
            lag += f", HELD BACK: {held.phrase()}"
            fields["held_back"] = [w.slot for w in held.waits]
        elif behind is not None and self._backlog is None:
            self._backlog = Backlog(behind)  # from the first report: rate and ETA of working it down
        elif behind is not None and self._backlog is not None:
            lag += f" ({self._backlog.line(behind)})"
            fields = self._backlog.fields(behind) if self._backlog.start_behind else fields
        fields.update({"applied_lsn": format_lsn(applied) if applied else None, "server_lsn": format_lsn(server_lsn),
                       "lag_bytes": behind, "lag_seconds": round(seconds, 1),
                       "transactions": self.stats.transactions, "messages": self.stats.messages})
        return ProgressReport(f"applied {format_lsn(applied)}, server at {format_lsn(server_lsn)}: lag {lag}, "
                              f"{seconds:.1f}s; {self.stats.transactions} transactions, {self.stats.messages} "
                              "messages", fields)



class ReplicationFollower(SlotFollower):
    """START_REPLICATION on a replication connection (psycopg's COPY_BOTH).

    ``catch_up``: called once the stream has started, with it, the server's flush position, the backlog
    (bytes of WAL from the slot's confirmed position to it) and the feed into the loop: the mirror
    catches a large backlog up on Spark's executors there (applier.drivers.backlog) before following on.
    ``copy_catch_up``: called before, without the stream: the mirror may catch the backlog up from a
    copy of the slot and advance the slot (applier.sources.slotcopy); the stream then starts from there.
    """

    def __init__(self, dsn: str, source: SourceSettings, loop: ApplyLoop, stats: FollowStats,
                 stop: threading.Event, progress: Progress, progress_every: float, *,
                 catch_up: CatchUp | None = None, copy_catch_up: CopyCatchUp | None = None,
                 follow_backlog_bytes: int = 0) -> None:
        super().__init__(dsn, source, loop, stats, stop, progress, progress_every)
        self.catch_up = catch_up
        self.copy_catch_up = copy_catch_up
        self.follow_backlog_bytes = follow_backlog_bytes if catch_up is not None else 0

    def _catch_up_again(self, stream: WalSenderStream, behind: FallingBehind, read: int,
                        target: int | None) -> None:
        """Fallen behind while following, at a point where no transaction is open: apply what is pending,
        then catch the backlog up in ranges from the same stream, round after round while the load
        lasts (after a round that ran its time the next starts at once; after one that ended quiet, once
        ``ONGOING_LOAD_BYTES`` more arrived; a round with nothing of ours ends them, and the loop follows
        on after them). Rounds follow each other directly: the per-message path between two rounds costs about
        4x the CPU per message (bench/RESULTS.md, twenty-ninth session: rounds that ended once less than
        ``behind.threshold`` had arrived applied two thirds of pgbench's load message by message), and a
        group of the few transactions between two rounds would cost a commit as large as a round's.
        A round lasts ``apply.max_group_seconds``, as a group does: each commit rewrites or marks the
        files it touches, so fewer, larger rounds cost less CPU beside a busy database, and a transaction
        still waits about that long. It reads the stream as it comes for that long, and ends early once
        the stream is quiet (StreamRanges ``until``): then the load has stopped, and the follower is
        caught up as soon as that round is committed.
        ``target`` (``--once``): rounds read up to the server's position, and none starts past ``target``,
        so a drain under a steady load ends."""
        assert self.catch_up is not None
        needed = behind.next_round_bytes()
        behind.wanted = behind.continuing = False
        behind.dry()  # after the rounds, a busy spell is counted from the next message
        self.flush()  # the pending group and the one in flight: the loop is idle, nothing is open
        flush = behind.server_flush()
        pace = self.loop.settings.max_group_seconds
        while flush - read >= needed and not self.stop.is_set() and (target is None or read < target):
            until = time.monotonic() + pace if target is None else None
            applied = self.loop.transactions
            ran = self.catch_up(stream, flush, flush - read, self._feed, following=True, until=until)
            self._sync_stats()
            if not ran:
                behind.refused()
                return
            ran_its_time = until is not None and time.monotonic() >= until
            # a round read past ``flush``: up to the end of what it committed
            read, flush = max(flush, self.loop.confirmed_lsn or 0), behind.server_flush()
            # in rounds they go on while the load does; after one that ran its time, whatever came since:
            # the load may have stopped just after it, and a round then ends quiet and commits the rest
            # at once, where the loop would apply it message by message at about 4x the CPU (a drain of
            # 0.42 s against 0.17 s in bench/follow.py)
            needed = 1 if ran_its_time else behind.ongoing_bytes()
            if not self.loop.idle():  # the stream's tail: an open transaction, fed to the loop
                behind.wanted = behind.continuing = flush - read >= needed  # the next round once it is done
                return
            if until is not None and self.loop.transactions == applied:
                # nothing of ours in a whole round: caught up. WAL of other databases and tables may
                # move on (the walsender's keepalives then keep a round from going quiet): the loop
                # confirms it, and rounds start again only if this mirror falls behind again
                return

    def run(self, once: bool) -> None:
        src = self.source
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            flush = sql_slot.current_flush_lsn(conn)
            info = slot_info(conn, src.slot)
            # a copy of the slot is no failover slot: it is read no further than the server releases to this one
            readable, _held = readable_upto(conn, src.slot, flush)
        target = flush if once else None
        confirmed = info.confirmed_flush_lsn if info is not None else None
        if self.copy_catch_up is not None and confirmed and readable > confirmed:
            advanced = self.copy_catch_up(readable, readable - confirmed, self._feed)
            self._sync_stats()
            if advanced is not None:
                confirmed = advanced
                if target is not None and advanced >= target:
                    self.stats.stopped_by = f"--once: reached {format_lsn(target)}"
                    return
        self._session_start(confirmed)
        stream = WalSenderStream(self.dsn)

        def confirm(lsn: int) -> None:
            if lsn > stream.confirmed:
                self._confirming(lsn)
                stream.confirm(lsn)
                # as this run knows it: the server may not take the last one (a walsender ended first)
                self.stats.confirmed_lsn = max(self.stats.confirmed_lsn or 0, lsn)

        self.loop.confirm = confirm
        behind = FallingBehind(self.dsn, self.follow_backlog_bytes)
        try:
            try:
                stream.start(src.slot, sql_slot.options_for(self.source))
            except SourceError as e:
                raise slot_lost_error(src.slot, e.sqlstate, str(e)) or e from None
            self._checked_slot(self.watch.check(force=True))
            # the status updates go on while Spark starts, a group is applied or executors commit
            # (a catch-up's reader pauses it while it reads: WalSenderStream.hot_reader)
            stream.start_heartbeat()
            if self.catch_up is not None and confirmed:
                self.catch_up(stream, readable, max(readable - confirmed, 0), self._feed)
                self._sync_stats()
            if target is not None:
                self.progress(f"draining up to {format_lsn(target)}")
                # --once ends on a keepalive at or past the target: ask for one now rather than after
                # half a second of silence (a caught-up backlog is often already there)
                stream.send_status(reply_requested=True)
            last_report = last_data = time.monotonic()
            while not self.stop.is_set():
                try:
                    # With a group pending, only take what has already arrived: when nothing more has,
                    # the backlog is drained and the group is applied at once. So a group holds what
                    # arrived while the previous one was being applied: it grows with the load (and
                    # keeps up with it) and a transaction waits about one apply, not a fixed time.
                    # Not keepalives: under a steady load the walsender sends one each time it catches
                    # up, i.e. after nearly every transaction, even while a backlog is still buffered;
                    # a flush per keepalive made groups of one transaction that fell behind.
                    pending = bool(self.loop.group)
                    frame = stream.read(0.0 if pending else 0.5)
                    if frame is None:
                        behind.dry()
                    elif not isinstance(frame, PrimaryKeepalive):
                        last_data = time.monotonic()
                        self._feed(frame.wal_start, frame.payload)
                        if self.loop.group.due():  # held long enough while more keeps arriving
                            self.flush(wait=False)
                        behind.arrived(frame.wal_start)
                        if behind.wanted and not self.loop.feeder.assembler.open_transactions():
                            self._catch_up_again(stream, behind, frame.wal_start, target)
                        continue
                    at_target = (target is not None and isinstance(frame, PrimaryKeepalive)
                                 and frame.wal_end >= target)
                    if frame is None or at_target or self.loop.group.due():
                        self.flush()
                    idle = self.loop.idle()
                    if idle and frame is not None:
                        confirm(max(stream.confirmed, frame.wal_end))  # nothing of ours is before it
                    if target is not None and idle and isinstance(frame, PrimaryKeepalive) \
                            and frame.wal_end >= target:
                        self.stats.stopped_by = f"--once: reached {format_lsn(target)}"
                        break
                    if frame is None and not pending:  # idle for 0.5 s
                        stream.send_status(reply_requested=True)
                        self.loop.tick()
                        if self.loop.metrics is not None and self.loop.idle():
                            self.loop.metrics.beat()
                    if target is not None and idle and time.monotonic() - last_data >= HOLD_QUIET_SECONDS:
                        self.hold.check(target)
                        self.hold.waited_out()  # held back for a standby: exit 6 after the wait
                except KeyboardInterrupt:
                    self.flush()
                    raise
                if time.monotonic() - last_report >= self.progress_every:
                    last_report = time.monotonic()
                    # is the server holding changes back? (a keepalive says what the walsender sent, which
                    # then looks caught up)
                    self.progress(self._lag(stream.server_wal_end, stream.confirmed, self.hold.check(target)))
            else:
                self.stats.stopped_by = "stop requested"
            self.flush()
        finally:
            behind.close()
            self.hold.close()
            stream.close()



class SqlFollower(SlotFollower):
    """pg_logical_slot_peek_binary_changes, then pg_replication_slot_advance once applied."""

    def run(self, once: bool, *, poll_seconds: float = 1.0, batch_changes: int = 10_000) -> None:
        """Peek, apply, advance. When a peek drained the slot up to the server's flush position and
        nothing is pending (no group, no open streamed transaction), the slot is advanced to that
        position even if nothing in it was ours, as the walsender path confirms keepalives: otherwise
        an idle slot holds back WAL that other databases and unpublished tables keep writing."""
        src = self.source
        options = sql_slot.options_for(self.source)
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            info = slot_info(conn, src.slot)
            confirmed = info.confirmed_flush_lsn if info is not None else None
            self._session_start(confirmed)

            def advance(end: int) -> None:
                nonlocal confirmed
                if confirmed is None or end > confirmed:
                    self._confirming(end)
                    confirmed = sql_slot.advance(conn, src.slot, end)

            self.loop.confirm = advance
            self._checked_slot(self.watch.check(force=True))
            while not self.stop.is_set():
                # while the server holds changes back for a standby, a peek past what it released would wait
                # inside the call: read up to there, and say which standby it waits for
                target, held = readable_upto(conn, src.slot, sql_slot.current_flush_lsn(conn))
                said = self.hold.seen(held)
                committed_before = self.loop.transactions
                self.loop.feeder.assembler.session_start()  # every peek is a new decoding session
                peeked: list[sql_slot.PeekedMessage] = []
                try:
                    # the peek's rows are fetched before anything is applied (one statement at a time)
                    try:
                        if held is None or target > (confirmed or 0):
                            peeked = list(sql_slot.peek(conn, src.slot, options, upto_lsn=target,
                                                        upto_nchanges=batch_changes))
                    except (psycopg.Error, SourceError) as e:
                        lost = slot_lost_error(src.slot, e.sqlstate, str(e))
                        if lost is None:
                            raise
                        raise lost from None
                    for message in peeked:
                        self._feed(message.lsn, message.data)
                finally:
                    self.flush()
                if len(peeked) < batch_changes and self.loop.idle():
                    advance(target)  # drained: nothing of ours is before ``target``
                self.stats.confirmed_lsn = confirmed
                if self.loop.transactions > committed_before:
                    self.progress(self._lag(target, confirmed, said))
                else:
                    if once and held is None:
                        self.stats.stopped_by = f"--once: reached {format_lsn(target)}"
                        return
                    if once:
                        self.hold.waited_out()  # held back for a standby: exit 6 after the wait
                    self.loop.tick()
                    if self.loop.metrics is not None:
                        self.loop.metrics.beat()  # drained: idle and caught up
                    self.stop.wait(poll_seconds)
            self.stats.stopped_by = "stop requested"
