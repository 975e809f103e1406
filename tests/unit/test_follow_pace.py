"""A catch-up round waits for the next one only while the server's WAL moves (applier.drivers.follow):
under a load rounds are paced, and once the load stops what is left is applied at once instead of
waiting out the pace (bench/follow.py's drain)."""

from __future__ import annotations

import threading
import time

from applier.drivers.follow import pace_rounds


def test_rounds_wait_out_the_pace_while_the_wal_moves() -> None:
    positions = iter(range(1000, 10**6, 100))
    started = time.monotonic()
    assert not pace_rounds(started + 0.35, threading.Event(), lambda: next(positions), step=0.05)
    assert time.monotonic() - started >= 0.35


def test_a_quiet_server_ends_the_wait_at_once() -> None:
    moves = iter([1000, 1100, 1100])
    started = time.monotonic()
    assert not pace_rounds(started + 5.0, threading.Event(), lambda: next(moves), step=0.05)
    assert time.monotonic() - started < 1.0  # two steps, not five seconds


def test_a_server_already_quiet_is_seen_after_one_step() -> None:
    """The first reading is taken when the wait starts (not the round's target, long behind by then):
    a load that ended during the round costs one step of the drain, not two."""
    readings = []

    def flush() -> int:
        readings.append(time.monotonic())
        return 1100

    started = time.monotonic()
    assert not pace_rounds(started + 5.0, threading.Event(), flush, step=0.2)
    assert len(readings) == 2 and 0.2 <= readings[1] - started < 0.4


def test_a_stop_ends_the_wait() -> None:
    stop = threading.Event()
    stop.set()
    assert pace_rounds(time.monotonic() + 5.0, stop, lambda: 0, step=0.05)


def test_rounds_under_a_load_go_on_at_a_smaller_backlog() -> None:
    """A mirror starts rounds once ``follow_backlog_mb`` behind; a round that ended inside an open
    transaction wants the next once ``ONGOING_LOAD_BYTES`` more arrived (no connection is made here)."""
    from applier.drivers.follow import ONGOING_LOAD_BYTES, FallingBehind

    behind = FallingBehind("dbname=unused", 1 << 20)
    assert behind.next_round_bytes() == 1 << 20
    behind.continuing = True
    assert behind.next_round_bytes() == ONGOING_LOAD_BYTES < 1 << 20
