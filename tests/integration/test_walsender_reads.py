"""The catch-up's reader of the replication stream (WalSenderStream.read_message) against a real
server: with ``gather`` it lets frames pile up in the socket when it has outrun the walsender, so
that one socket read takes many frames. The frames must be exactly those read without it.

Reading without gather is not compared for speed: it is bistable (bench/stream_read.py: the same
backlog took 4,400 to 474,000 socket reads), so a plain read may land in the good state and take as
many frames a read as a gathered one (a CI run did: 229 against 222). With gather, every run took
over a hundred frames a read; the test asks for 16. Without gather most runs here take 1-3."""

from __future__ import annotations

import psycopg
import pytest

from applier.drivers.executors.ranges import LogRange
from applier.drivers.executors.survey import LogSurvey
from applier.protocol.replication import PrimaryKeepalive, XLogData
from applier.sources.walsender import WalSenderStream

pytestmark = pytest.mark.postgres

OPTIONS = {"proto_version": "2", "publication_names": "g_pub"}

BACKLOG = """
CREATE TABLE g (id int PRIMARY KEY, v text);
CREATE PUBLICATION g_pub FOR TABLE g;
CREATE PROCEDURE g_run() LANGUAGE plpgsql AS $$
BEGIN
  FOR i IN 1..2000 LOOP
    INSERT INTO g SELECT i * 10 + k, 'row ' || i FROM generate_series(0, 9) k;
    COMMIT;
  END LOOP;
END $$;
"""


def _read_all(dsn: str, slot: str, gather: float) -> tuple[list[tuple[int, bytes]], float]:
    """Every frame of the slot's backlog (until the stream is quiet for a second), and the frames per
    socket read."""
    stream = WalSenderStream(dsn)
    try:
        stream.start(slot, OPTIONS)
        frames: list[tuple[int, bytes]] = []
        while (frame := stream.read_message(1.0, gather=gather)) is not None:
            if not isinstance(frame, PrimaryKeepalive):
                frames.append(frame)
        return frames, stream.frames_read / max(stream.socket_reads, 1)
    finally:
        stream.close()


def test_gathered_reads_take_every_frame_in_fewer_socket_reads(pg):
    with pg.connect() as conn:
        conn.execute(BACKLOG)
        for slot in ("g_plain", "g_gathered"):  # each on its own: not in a transaction that wrote
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        conn.execute("CALL g_run()")  # on its own: its COMMITs cannot run inside a multi-statement query
    plain, plain_per_read = _read_all(pg.dsn, "g_plain", 0.0)
    gathered, gathered_per_read = _read_all(pg.dsn, "g_gathered", 0.001)
    assert len(plain) == 2000 * 12 + 1  # Begin, 10 Inserts, Commit per transaction; one Relation
    assert gathered == plain
    assert gathered_per_read >= 16, (gathered_per_read, plain_per_read)


def _busy_then_read(dsn: str, slot: str, *, heartbeat: bool) -> None:
    """Start streaming with a 1 s wal_sender_timeout, read nothing for 3 s (a reader busy with a
    group's commits, or waiting for Spark to start), then read a transaction committed after that."""
    import time

    stream = WalSenderStream(dsn, status_interval=0.25)
    try:
        stream._command("SET wal_sender_timeout = '1s'")
        stream.start(slot, OPTIONS)
        if heartbeat:
            stream.start_heartbeat()
        time.sleep(3)  # busy: the reader does not touch the connection
        with psycopg.connect(dsn, autocommit=True) as conn:  # a change made after it, to be read now
            conn.execute("INSERT INTO g VALUES ((SELECT coalesce(max(id), 0) + 1 FROM g), 'one')")
        got: list[XLogData] = []
        while not any(f.payload[:1] == b"C" for f in got):  # the insert's transaction, to its Commit
            frame = stream.read(5.0)
            assert frame is not None
            if isinstance(frame, XLogData):
                got.append(frame)
    finally:
        stream.close()


def test_a_reader_busy_past_wal_sender_timeout_keeps_its_connection_with_the_heartbeat(pg):
    from applier.errors import SourceError

    with pg.connect() as conn:
        conn.execute(BACKLOG)
        conn.execute("SELECT pg_create_logical_replication_slot('g_beat', 'pgoutput')")
    _busy_then_read(pg.dsn, "g_beat", heartbeat=True)
    with pg.connect() as conn:  # after that run's change: this slot has none before its own
        conn.execute("SELECT pg_create_logical_replication_slot('g_silent', 'pgoutput')")
    with pytest.raises(SourceError):  # the control: without it the server ends the connection
        _busy_then_read(pg.dsn, "g_silent", heartbeat=False)


def test_a_confirm_made_after_the_catch_up_reader_stopped_reaches_the_slot(pg, caplog):
    """The executor catch-up's reader (StreamRanges) stops at the end of the backlog, and the
    executors' commits can take longer than ``wal_sender_timeout`` after that (over 100 s in a full
    test run on two cores). Their confirm must still reach the slot. It was lost: nothing answered the
    walsender once the reader stopped, the server ended the connection, the confirm went to the closed
    socket without an error, and the next run read every transaction of the catch-up again."""
    import time

    from applier.drivers.backlog import StreamRanges
    from applier.lsn import format_lsn
    from applier.sources.sql_slot import current_flush_lsn

    with pg.connect() as conn:
        conn.execute("CREATE TABLE g (id int PRIMARY KEY, v text); CREATE PUBLICATION g_pub FOR TABLE g")
        conn.execute("SELECT pg_create_logical_replication_slot('g_confirm', 'pgoutput')")
        for i in range(5):
            conn.execute("INSERT INTO g SELECT g, 'v' FROM generate_series(%s::int, %s::int) g",
                         (i * 100, i * 100 + 99))
        target = current_flush_lsn(conn)
    stream = WalSenderStream(pg.dsn, status_interval=0.25)
    try:
        stream._command("SET wal_sender_timeout = '1s'")
        stream.start("g_confirm", OPTIONS)
        source = StreamRanges(stream, None, partition_messages=150, target=target)
        ranges = list(source.ranges())
        assert sum(r.messages for r in ranges) >= 500
        time.sleep(3)  # the executors fold and commit
        stream.confirm(target)  # ApplyLoop.folded_applied, on the caller's thread
        source.result()
        time.sleep(3)  # Spark starts before the driver path reads on
        frame = stream.read(5.0)  # the connection is still there: a keepalive, not an error
        assert isinstance(frame, PrimaryKeepalive)
    finally:
        stream.close()
    with pg.connect() as conn:
        confirmed = conn.execute("SELECT confirmed_flush_lsn FROM pg_replication_slots "
                                 "WHERE slot_name = 'g_confirm'").fetchone()[0]
    assert confirmed == format_lsn(target)


def _backlog_behind(pg, slot: str) -> int:
    """BACKLOG's 2,000 transactions (24,001 messages) behind a new slot; the server's flush position after
    them (a catch-up's target)."""
    from applier.sources.sql_slot import current_flush_lsn

    with pg.connect() as conn:
        conn.execute(BACKLOG)
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        conn.execute("CALL g_run()")  # on its own: its COMMITs cannot run inside a multi-statement query
        return current_flush_lsn(conn)


def test_a_catch_ups_last_ranges_shrink_toward_its_target(pg):
    """A catch-up's ranges from the second on end halfway to the target (none shorter than a sixteenth of
    ``partition_messages``), so that the last fold, which no reading overlaps, is short; the ranges hold
    every message of the backlog once, in order."""
    from applier.drivers.backlog import TAIL_DIVISOR, StreamRanges
    from applier.drivers.executors.ranges import range_messages

    target = _backlog_behind(pg, "g_tail")
    partition = 4_800
    stream = WalSenderStream(pg.dsn)
    try:
        stream.start("g_tail", OPTIONS)
        source = StreamRanges(stream, None, partition_messages=partition, target=target)
        ranges = list(source.ranges())
        source.result()
    finally:
        stream.close()
    lsns = [m.lsn for r in ranges for m in range_messages(r)]
    assert len(lsns) == 2000 * 12 + 1 and sum(r.messages for r in ranges) == len(lsns)
    assert [m.data[:1] for m in range_messages(ranges[-1])][-1] == b"C"
    sizes = [r.messages for r in ranges]
    left = len(lsns) - sizes[0]
    for size in sizes[1:-1]:  # (the last is what is left)
        expected = max(partition // TAIL_DIVISOR, min(partition, left // 2))
        assert size <= expected * 1.1 + 12, sizes  # (a range ends at a commit: 12 messages a transaction)
        left -= size
    assert sizes[-1] <= partition // TAIL_DIVISOR * 2 + 12, sizes
    assert len(sizes) <= 12, sizes


def test_a_catch_up_whose_folds_are_slow_still_reads_its_whole_backlog(pg):
    """The reader waits for room when the folds are behind (at most ``queued`` ranges wait for them); that
    wait is not the stream's quiet. It was counted as quiet (from the last message) once the quiet
    stopped counting keepalives, and a catch-up whose folds took longer than the quiet ended after
    the wait: the rest went to the driver path (a scenario test's flake under load)."""
    import time

    from applier.drivers.backlog import StreamRanges

    target = _backlog_behind(pg, "g_slow")
    stream = WalSenderStream(pg.dsn)
    try:
        stream.start("g_slow", OPTIONS)
        source = StreamRanges(stream, None, partition_messages=4_000, target=target, queued=1, quiet_seconds=0.2)
        taken = 0
        for cut in source.ranges():
            taken += cut.messages
            time.sleep(0.5)  # a slow fold: longer than the quiet
        survey = source.result()
    finally:
        stream.close()
    assert survey.tail is None and taken == 2000 * 12 + 1, (taken, survey.tail)


def test_a_stream_the_server_ended_says_at_close_that_the_last_confirm_may_be_lost(pg, caplog):
    """The control of the test above: nothing answers the walsender, it ends the connection, and a
    confirm sent after that is lost. Nothing fails in Delta, but close() must not stay silent."""
    import contextlib
    import logging
    import time

    from applier.errors import TransientSourceError

    with pg.connect() as conn:
        conn.execute("CREATE TABLE g (id int PRIMARY KEY, v text); CREATE PUBLICATION g_pub FOR TABLE g")
        conn.execute("SELECT pg_create_logical_replication_slot('g_lost', 'pgoutput')")
    stream = WalSenderStream(pg.dsn, status_interval=0.25)
    caplog.set_level(logging.WARNING, logger="applier.sources.walsender")
    try:
        stream._command("SET wal_sender_timeout = '1s'")
        stream.start("g_lost", OPTIONS)
        time.sleep(3)  # nobody answers
        with contextlib.suppress(TransientSourceError):  # a write to the closed socket may fail, or not
            stream.confirm(123)
    finally:
        stream.close()
    assert "the server may not have taken the last confirmed position, 0/7B" in caplog.text, caplog.text


def test_a_confirm_made_while_the_catch_up_reader_reads_is_sent_by_that_reader(pg):
    """libpq is not safe for two threads on one connection: a confirm from another thread while the hot
    reader holds the stream (a group's commits ending before the catch-up has read its backlog) only
    records the position, and the reader sends it at its next status check, within a second when the
    stream is quiet. The position must reach the slot while the reader still reads, sent by it."""
    import threading
    import time

    from applier.lsn import format_lsn
    from applier.sources.sql_slot import current_flush_lsn

    with pg.connect() as conn:
        conn.execute("CREATE TABLE g (id int PRIMARY KEY, v text); CREATE PUBLICATION g_pub FOR TABLE g")
        conn.execute("SELECT pg_create_logical_replication_slot('g_hot', 'pgoutput')")
        conn.execute("INSERT INTO g SELECT g, 'v' FROM generate_series(1, 300) g")
        target = current_flush_lsn(conn)
    stream = WalSenderStream(pg.dsn, status_interval=60.0)  # no status update falls due by itself meanwhile
    sent: list[tuple[str, int]] = []
    send_status = stream.send_status

    def recorded(*, reply_requested: bool = False) -> None:
        sent.append((threading.current_thread().name, stream.confirmed))
        send_status(reply_requested=reply_requested)

    stream.send_status = recorded  # type: ignore[method-assign]
    stop = threading.Event()

    def read() -> None:
        with stream.hot_reader():
            while not stop.is_set():
                stream.read_message(0.2)

    reader = threading.Thread(target=read, name="catch-up-reader")
    try:
        stream.start("g_hot", OPTIONS)
        reader.start()
        time.sleep(1)  # the reader has the backlog and waits for more
        stream.confirm(target)  # a group's commits exist: from the committing thread
        confirmed = None
        with pg.connect() as conn:
            for _ in range(50):
                confirmed = conn.execute("SELECT confirmed_flush_lsn FROM pg_replication_slots "
                                         "WHERE slot_name = 'g_hot'").fetchone()[0]
                if confirmed == format_lsn(target):
                    break
                time.sleep(0.2)
        assert reader.is_alive()  # still reading: the reader sent it, not the end of its block
    finally:
        stop.set()
        reader.join(10)
        stream.close()
    assert confirmed == format_lsn(target)
    assert [name for name, lsn in sent if lsn == target][:1] == ["catch-up-reader"], sent


def _ranges_of_a_round(dsn: str, slot: str, *, until_in: float, target: int) -> tuple[list[LogRange], LogSurvey,
                                                                                      float]:
    """A follower's round (StreamRanges ``until``) on a started stream: its ranges, its survey and how
    long its reading took."""
    import time

    from applier.drivers.backlog import StreamRanges

    stream = WalSenderStream(dsn)
    try:
        stream.start(slot, OPTIONS)
        source = StreamRanges(stream, None, partition_messages=10_000, target=target, quiet_seconds=0.05,
                              until=time.monotonic() + until_in)
        ranges = list(source.ranges())
        survey = source.result()
        return ranges, survey, source.seconds
    finally:
        stream.close()


def _commits(ranges: list[LogRange]) -> list[int]:
    """The end LSN of every transaction in the ranges, in order (a Commit: 'C', end LSN at byte 10)."""
    from applier.drivers.executors.ranges import range_messages

    return [int.from_bytes(m.data[10:18], "big") for r in ranges for m in range_messages(r) if m.data[:1] == b"C"]


def test_a_round_reads_past_the_position_it_began_at_until_its_time_then_cuts_at_a_commit(pg):
    """A follower's round reads the stream as it comes, not up to the server's position when it began,
    while a load goes on: it ends at the first transaction's end after its time, with nothing open."""
    import threading
    import time

    from applier.drivers.executors.ranges import range_messages
    from applier.sources.sql_slot import current_flush_lsn

    with pg.connect() as conn:
        conn.execute("CREATE TABLE g (id int PRIMARY KEY, v text); CREATE PUBLICATION g_pub FOR TABLE g")
        conn.execute("SELECT pg_create_logical_replication_slot('g_round', 'pgoutput')")
        conn.execute("INSERT INTO g SELECT g, 'before' FROM generate_series(1, 100) g")
        began = current_flush_lsn(conn)
    stop = threading.Event()

    def load() -> None:
        with psycopg.connect(pg.dsn, autocommit=True) as c:
            i = 1000
            while not stop.is_set():
                c.execute("INSERT INTO g VALUES (%s, 'during'), (%s, 'during')", (i, i + 1))
                i += 2
                time.sleep(0.002)

    loader = threading.Thread(target=load)
    loader.start()
    try:
        ranges, survey, seconds = _ranges_of_a_round(pg.dsn, "g_round", until_in=0.8, target=began)
    finally:
        stop.set()
        loader.join()
    commits = _commits(ranges)
    assert survey.tail is None  # cut where nothing is open
    assert commits[0] <= began < commits[-1]  # past the position it began at
    assert len(commits) > 20
    assert seconds >= 0.75  # the load kept it reading until its time (it counts from its thread's start)
    assert list(range_messages(ranges[-1]))[-1].data[:1] == b"C"


def test_a_round_ends_once_the_stream_is_quiet_with_every_transaction(pg):
    """When the load stops, a round ends a quiet moment after the last message, long before its time,
    and holds every transaction: the follower commits it at once (bench/follow.py's drain)."""
    from applier.sources.sql_slot import current_flush_lsn

    with pg.connect() as conn:
        conn.execute("CREATE TABLE g (id int PRIMARY KEY, v text); CREATE PUBLICATION g_pub FOR TABLE g")
        conn.execute("SELECT pg_create_logical_replication_slot('g_quiet', 'pgoutput')")
        for i in range(50):
            conn.execute("INSERT INTO g VALUES (%s, 'v')", (i,))
        flush = current_flush_lsn(conn)
    ranges, survey, seconds = _ranges_of_a_round(pg.dsn, "g_quiet", until_in=60.0, target=0)
    assert len(_commits(ranges)) == 50 and survey.tail is None
    assert _commits(ranges)[-1] <= flush
    assert seconds < 10.0  # quiet, not the round's 60 s


def test_a_round_ends_once_no_message_comes_though_keepalives_do(pg):
    """Quiet is counted from the last message, not the last frame. While WAL of a table outside the
    publication is written (an autovacuum after a load does the same), the walsender sends a keepalive
    each time it has decoded it, since the round has not confirmed what it read: counted as traffic,
    they kept a round reading for its whole time after the load's last transaction (bench/follow.py)."""
    import threading
    import time

    with pg.connect() as conn:
        conn.execute("CREATE TABLE g (id int PRIMARY KEY, v text); CREATE PUBLICATION g_pub FOR TABLE g; "
                     "CREATE TABLE elsewhere (id serial PRIMARY KEY)")
        conn.execute("SELECT pg_create_logical_replication_slot('g_keepalives', 'pgoutput')")
        for i in range(50):
            conn.execute("INSERT INTO g VALUES (%s, 'v')", (i,))
    stop = threading.Event()
    written = 0

    def elsewhere() -> None:
        nonlocal written
        with psycopg.connect(pg.dsn, autocommit=True) as c:
            while not stop.is_set():
                c.execute("INSERT INTO elsewhere DEFAULT VALUES")
                written += 1
                time.sleep(0.002)

    writer = threading.Thread(target=elsewhere)
    writer.start()
    try:
        time.sleep(0.2)
        before = written
        ranges, survey, seconds = _ranges_of_a_round(pg.dsn, "g_keepalives", until_in=6.0, target=0)
        during = written - before
    finally:
        stop.set()
        writer.join()
    assert len(_commits(ranges)) == 50 and survey.tail is None
    assert during >= 5  # the other table's WAL went on while the round read
    assert seconds < 3.0  # the quiet after the last message, not the round's 6 s
