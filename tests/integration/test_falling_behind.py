"""``FallingBehind``: when a following mirror asks the server how far behind it is, against a real
server's flush position. It asks only once messages have kept arriving for ``busy_seconds`` without
the socket running dry (a loop that keeps up finds it empty between transactions), at most every
``every`` seconds, and wants a catch-up in ranges only when the server is ``threshold`` bytes ahead
and further ahead than at the last question of the same busy spell, or closer by so little that the loop
would need more than ``work_off`` seconds to catch up at that pace (a backlog that shrinks fast is one the
loop works off)."""

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


def _later(behind: FallingBehind, read: int) -> bool:
    """A message at ``read`` once ``busy_seconds`` and ``every`` have passed: whether it is wanted."""
    time.sleep(BUSY * 1.5)
    behind.arrived(read)
    return behind.wanted


def test_a_follower_busy_long_enough_and_further_behind_each_time_wants_a_catch_up(pg):
    flush = _flush(pg)
    with closing(FallingBehind(pg.dsn, 4096, every=BUSY, busy_seconds=BUSY)) as behind:
        behind.arrived(flush - 8192)  # the first message of a busy spell: nothing asked yet
        behind.arrived(flush - 8192)  # nor before it has lasted busy_seconds
        assert not behind.wanted and behind._conn is None
        assert not _later(behind, flush - 8192)  # asked: 8 kB behind, nothing to compare with yet
        assert _later(behind, flush - 16384)  # 16 kB: further behind


def test_a_backlog_that_shrinks_stays_with_the_loop_until_it_grows(pg):
    flush = _flush(pg)
    with closing(FallingBehind(pg.dsn, 4096, every=BUSY, busy_seconds=BUSY)) as behind:
        behind.arrived(flush)
        assert not _later(behind, flush - 65536)
        assert not _later(behind, flush - 8192)  # the loop works a backlog off (after a slow commit)
        assert _later(behind, flush - 16384)  # and falls behind again


def test_a_socket_that_ran_dry_starts_the_busy_spell_again(pg):
    flush = _flush(pg)
    with closing(FallingBehind(pg.dsn, 4096, every=BUSY, busy_seconds=BUSY)) as behind:
        behind.arrived(flush)
        assert not _later(behind, flush - 8192)
        behind.dry()  # the loop read all that was sent: it keeps up
        behind.arrived(flush - 16384)
        assert not behind.wanted  # a new spell: not yet busy_seconds long
        assert not _later(behind, flush - 16384)  # its first question
        assert _later(behind, flush - 32768)


def test_a_busy_follower_less_than_the_threshold_behind_is_not_wanted(pg):
    flush = _flush(pg)
    with closing(FallingBehind(pg.dsn, 4096, every=BUSY, busy_seconds=BUSY)) as behind:
        behind.arrived(flush)
        assert not _later(behind, flush)
        assert not _later(behind, flush - 1024)  # grew, but 1 kB behind


def test_questions_come_at_most_every_every_seconds(pg):
    flush = _flush(pg)
    with closing(FallingBehind(pg.dsn, 4096, every=60.0, busy_seconds=BUSY)) as behind:
        behind.arrived(flush)
        assert not _later(behind, flush - 8192)  # asked
        assert not _later(behind, flush - 65536)  # not asked again within ``every``


def test_a_threshold_of_zero_never_asks(pg):
    flush = _flush(pg)
    with closing(FallingBehind(pg.dsn, 0, every=BUSY, busy_seconds=BUSY)) as behind:
        behind.arrived(flush - (64 << 20))
        assert not _later(behind, flush - (64 << 20))
        assert not _later(behind, flush - (128 << 20))
        assert behind._conn is None


def test_a_backlog_that_shrinks_too_slowly_to_be_worked_off_soon_is_wanted(pg):
    flush = _flush(pg)
    with closing(FallingBehind(pg.dsn, 4096, every=BUSY, busy_seconds=BUSY, work_off=0.5)) as behind:
        behind.arrived(flush)
        assert not _later(behind, flush - 65536)
        # 4 kB closer in about 0.15 s: the other 60 kB would take the loop about 2 s at that pace
        assert _later(behind, flush - 61440)
