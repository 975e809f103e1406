"""``FallingBehind``: when a following mirror asks the server how far behind it is, against a real
server's flush position. It asks only once messages have kept arriving for ``busy_seconds`` without
the socket running dry (a loop that keeps up finds it empty between transactions), at most every
``every`` seconds, and wants a catch-up in ranges only when the server is ``threshold`` bytes ahead."""

from __future__ import annotations

import time
from contextlib import closing

import pytest

from applier.drivers.follow import FallingBehind
from applier.sources.sql_slot import current_flush_lsn

pytestmark = pytest.mark.postgres

BUSY = 0.1


def _flush(pg) -> int:
    with pg.connect() as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS fbh (v text)")
        conn.execute("INSERT INTO fbh SELECT repeat('x', 100) FROM generate_series(1, 100)")
        return current_flush_lsn(conn)


def test_a_follower_busy_long_enough_and_far_enough_behind_wants_a_catch_up(pg):
    flush = _flush(pg)
    with closing(FallingBehind(pg.dsn, 4096, every=BUSY, busy_seconds=BUSY)) as behind:
        behind.arrived(flush - 8192)  # the first message of a busy spell: nothing asked yet
        behind.arrived(flush - 8192)  # nor before it has lasted busy_seconds
        assert not behind.wanted and behind._conn is None
        time.sleep(BUSY * 1.5)
        behind.arrived(flush - 8192)
        assert behind.wanted


def test_a_socket_that_ran_dry_starts_the_busy_spell_again(pg):
    flush = _flush(pg)
    with closing(FallingBehind(pg.dsn, 4096, every=BUSY, busy_seconds=BUSY)) as behind:
        behind.arrived(flush - 8192)
        time.sleep(BUSY * 1.5)
        behind.dry()  # the loop read all that was sent: it keeps up
        behind.arrived(flush - 8192)
        assert not behind.wanted
        time.sleep(BUSY * 1.5)
        behind.arrived(flush - 8192)
        assert behind.wanted


def test_a_busy_follower_less_than_the_threshold_behind_asks_again_only_after_every(pg):
    flush = _flush(pg)
    with closing(FallingBehind(pg.dsn, 4096, every=60.0, busy_seconds=BUSY)) as behind:
        behind.arrived(flush)
        time.sleep(BUSY * 1.5)
        behind.arrived(flush - 1024)  # asked: 1 kB behind
        assert not behind.wanted
        behind.arrived(flush - 8192)  # not asked again within ``every``
        assert not behind.wanted


def test_a_threshold_of_zero_never_asks(pg):
    flush = _flush(pg)
    with closing(FallingBehind(pg.dsn, 0, every=BUSY, busy_seconds=BUSY)) as behind:
        behind.arrived(flush - (64 << 20))
        time.sleep(BUSY * 1.5)
        behind.arrived(flush - (64 << 20))
        assert not behind.wanted and behind._conn is None
