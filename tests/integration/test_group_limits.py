"""The group limits mean what they say (issue 74, item 6): ``apply.max_group_transactions``,
``max_group_rows`` and ``max_group_bytes_mb`` bound every group, on the driver path, in a backlog caught up
in ranges (read from a copy of the slot or from the walsender), in a following mirror's rounds, and in a
stored log replayed on Spark's executors; a transaction larger than a limit alone is a group of its own.
With ``max_group_transactions: 5`` a following mirror that fell 64 kB behind took groups of up to 211
transactions: the ranges of a catch-up were cut by ``distributed.partition_messages`` only, and the group
of folds was checked after a whole range had joined it.

Each group is read back from the Delta table itself: every transaction inserts its own rows (a column
says which transaction), so the rows a version added are exactly the group's row changes, and their
transactions are the group's; the commit's own description (``transactions=N``) must agree."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from deltalake import DeltaTable

from applier.checks.verify import verify_against_postgres
from applier.config import ApplySettings, DistributedSettings, MirrorConfig, SourceSettings, TargetSettings
from applier.drivers.executors.ranges import LogRange
from applier.drivers.mirror import mirror

pytestmark = [pytest.mark.postgres, pytest.mark.spark]

SCHEMA = """
CREATE TABLE gl (id int PRIMARY KEY, txn int NOT NULL, v text);
CREATE PUBLICATION gl_pub FOR TABLE gl;
CREATE PROCEDURE gl_run(first int, n int, big int DEFAULT 0) LANGUAGE plpgsql AS $$
DECLARE rows int;
BEGIN
  FOR i IN first..first + n - 1 LOOP
    -- 1 to 5 rows a transaction, and every 40th 12 rows: more than a group of 8 rows may hold
    rows := CASE WHEN i % 40 = 0 THEN 12 ELSE 1 + (i * 7) % 5 END;
    INSERT INTO gl SELECT i * 100 + k, i, CASE WHEN big > 0 THEN repeat(md5(i::text), big / 32)
                                              ELSE 'row ' || k END
      FROM generate_series(1, CASE WHEN big > 0 THEN 1 ELSE rows END) k;
    COMMIT;
  END LOOP;
END $$;
"""

TABLE = [("public", "gl")]


def _config(pg, target: Path, mode: str, reader: str = "auto", **apply: object) -> MirrorConfig:
    return MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="gl", publication="gl_pub"),
                        target=TargetSettings(path=str(target)),
                        apply=ApplySettings(**apply),
                        distributed=DistributedSettings(mode=mode, backlog_folds="driver",
                                                        backlog_reader=reader))


def _groups(path: Path, after: int) -> list[tuple[int, int, int]]:
    """Per version of the Delta table past ``after``: the rows it added, the transactions they came from,
    and the ``transactions=N`` its commit says it applied."""
    history = {h["version"]: h for h in DeltaTable(str(path)).history()}
    groups = []
    before = {} if after < 0 else {r["id"]: r["txn"] for r in DeltaTable(str(path), version=after).to_pyarrow_table(
        columns=["id", "txn"]).to_pylist()}
    for version in range(after + 1, DeltaTable(str(path)).version() + 1):
        now = {r["id"]: r["txn"] for r in DeltaTable(str(path), version=version).to_pyarrow_table(
            columns=["id", "txn"]).to_pylist()}
        assert before.keys() <= now.keys(), version  # (inserts only)
        added = [now[k] for k in now.keys() - before.keys()]
        said = re.search(r"transactions=(\d+)", history[version].get("userMetadata") or "")
        if said is None and not added:
            continue  # (the table created, empty)
        assert said is not None, history[version]
        groups.append((len(added), len(set(added)), int(said.group(1))))
        before = now
    return groups


def _check(groups: list[tuple[int, int, int]], transactions: int, *, max_transactions: int | None = None,
           max_rows: int | None = None) -> None:
    assert groups, "no group applied"
    assert sum(g[1] for g in groups) == transactions, groups  # every transaction, once
    for i, (rows, txns, said) in enumerate(groups):
        near = (i, groups[max(0, i - 3):i + 3])  # (the group, among those around it: rows, transactions)
        assert txns == said, near  # each transaction inserted rows: the commit's count is the data's
        if max_transactions is not None:
            assert txns <= max_transactions, near
        if max_rows is not None:
            assert rows <= max_rows or txns == 1, near  # a transaction larger alone: a group of its own


def _assert_equal(spark, conn, target: Path) -> None:
    for r in verify_against_postgres(spark, conn, str(target), TABLE):
        assert r.equal, (r.source_name, r.source_rows, r.target_rows, r.only_in_source[:3], r.only_in_target[:3])


#: (distributed.mode, distributed.backlog_reader): the driver path; a backlog in ranges from a copy of the
#: slot (SQL), and from the walsender
WAYS = {"driver-path": ("off", "auto"), "ranges-from-a-copy": ("on", "auto"), "ranges-from-the-walsender":
        ("on", "walsender")}
LIMITS = {"transactions": dict(max_group_transactions=5), "rows": dict(max_group_rows=8)}


@pytest.mark.parametrize("limit", sorted(LIMITS))
@pytest.mark.parametrize("way", sorted(WAYS))
def test_every_group_of_a_backlog_keeps_the_limits(pg, spark, tmp_path, way, limit):
    """200 transactions of 1 to 5 rows (every 40th of 12) behind the slot, applied by ``mirror --once``:
    no group holds more than 5 transactions, or more than 8 rows unless one transaction alone does."""
    mode, reader = WAYS[way]
    target = tmp_path / "delta"
    config = _config(pg, target, mode, reader, **LIMITS[limit])
    with pg.connect() as conn:
        conn.execute(SCHEMA)
        conn.execute("CALL gl_run(1, 3)")
        mirror(spark, config, once=True)  # the copy
        copied = DeltaTable(str(target / "public" / "gl")).version()
        conn.execute("CALL gl_run(4, 200)")  # the backlog
        lines: list[str] = []
        summary = mirror(spark, config, once=True, progress=lines.append)
        assert summary.transactions == 200, lines
        in_ranges = [line for line in lines if line.startswith("catch-up on the driver:")]
        assert bool(in_ranges) == (mode == "on"), lines
        _check(_groups(target / "public" / "gl", copied), 200, **_limits(LIMITS[limit]))
        _assert_equal(spark, conn, target)


def _limits(apply: dict[str, int]) -> dict[str, int | None]:
    return {"max_transactions": apply.get("max_group_transactions"), "max_rows": apply.get("max_group_rows")}


@pytest.mark.parametrize("way", ["driver-path", "ranges-from-a-copy"])
def test_every_group_of_large_rows_keeps_max_group_bytes_mb(pg, spark, tmp_path, way):
    """30 transactions of one row of 300 kB each: a group of at most 1 MB (``max_group_bytes_mb: 1``)
    holds three of them at most; in ranges, the bytes of the messages stand for the row images."""
    mode, reader = WAYS[way]
    target = tmp_path / "delta"
    config = _config(pg, target, mode, reader, max_group_bytes_mb=1)
    with pg.connect() as conn:
        conn.execute(SCHEMA)
        conn.execute("CALL gl_run(1, 3)")
        mirror(spark, config, once=True)
        copied = DeltaTable(str(target / "public" / "gl")).version()
        conn.execute("CALL gl_run(4, 30, 300000)")
        lines: list[str] = []
        assert mirror(spark, config, once=True, progress=lines.append).transactions == 30
        assert any(line.startswith("catch-up on the driver:") for line in lines) == (mode == "on"), lines
        groups = _groups(target / "public" / "gl", copied)
        _check(groups, 30, max_transactions=3)
        assert len(groups) <= 15, groups  # (not one transaction a group either)
        _assert_equal(spark, conn, target)


def test_a_following_mirror_that_falls_behind_keeps_max_group_transactions_in_its_rounds(pg, spark, tmp_path):
    """The reported case: ``max_group_transactions: 5``, a mirror following its slot (not ``--once``) that a
    burst of small transactions leaves 64 kB behind catches up in rounds (``distributed.follow_backlog_mb``,
    ranges folded on the driver); their groups held up to 211 transactions."""
    from background import Background

    target = tmp_path / "delta"
    config = _config(pg, target, "auto", max_group_transactions=5, max_group_seconds=0.5)
    path = target / "public" / "gl"
    with pg.connect() as conn:
        conn.execute(SCHEMA)
        conn.execute("CALL gl_run(1, 3)")
        mirror(spark, config, once=True)  # the copy
        copied = DeltaTable(str(path)).version()
        job = Background(lambda stop, progress: mirror(spark, config, stop=stop, progress=progress), seconds=300)

        def confirmed_past(flush: str) -> bool:
            row = conn.execute("SELECT confirmed_flush_lsn >= %s FROM pg_replication_slots WHERE slot_name = 'gl'",
                               (flush,)).fetchone()
            return bool(row and row[0])

        with job.running():
            job.wait_for(lambda: conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = 'gl'")
                         .fetchone()[0], "the mirror to stream from its slot")
            conn.execute("CALL gl_run(4, 600)")  # the burst
            flush = conn.execute("SELECT pg_current_wal_flush_lsn()").fetchone()[0]
            job.wait_for(lambda: confirmed_past(flush), "the mirror to catch up the burst")
        rounds = [line for line in job.lines if "behind while following" in line]
        assert rounds, job.lines[-20:]  # it fell behind, and caught up in rounds
        _check(_groups(path, copied), 600, max_transactions=5)
        _assert_equal(spark, conn, target)


def _ranges_keep(ranges: list[LogRange], messages: list[tuple[int, bytes]], *, max_transactions: int,
                 max_rows: int) -> int:
    """``ranges`` hold ``messages`` once, in order, each whole transactions: no more than ``max_transactions``
    of them, and no more than ``max_rows`` row changes unless it is one transaction alone. Returns how many
    (but the last) are shorter than both limits: cut before a transaction that would have taken them past
    ``max_rows`` (or, in a catch-up, halfway to its target)."""
    from applier.drivers.executors.ranges import range_messages

    at = 0
    earlier = 0
    for r in ranges:
        held = [(m.lsn, bytes(m.data)) for m in range_messages(r)] if r.inline is not None else \
            messages[at:at + r.messages]
        assert held == messages[at:at + len(held)] and len(held) == r.messages, r.index
        at += len(held)
        kinds = [data[:1] for _lsn, data in held]
        commits, rows = kinds.count(b"C"), sum(kinds.count(k) for k in (b"I", b"U", b"D"))
        assert kinds[0] in (b"B", b"R") and kinds[-1] == b"C", (r.index, kinds)
        assert commits <= max_transactions, (r.index, commits)
        assert rows <= max_rows or commits == 1, (r.index, rows, commits)
        assert r.size == sum(len(data) for _lsn, data in held), r.index
        earlier += r is not ranges[-1] and r.messages < max_rows and commits < max_transactions
    assert at == len(messages)
    return earlier


def _backlog(pg, slot: str, n: int) -> tuple[list[tuple[int, bytes]], int]:
    """``gl_run(1, n)`` behind a new slot: its messages (as SQL reads them: LSN, bytes) and the server's
    flush position after them."""
    from applier.sources.sql_slot import create_slot, current_flush_lsn, peek, pgoutput_options

    with pg.connect() as conn:
        conn.execute(SCHEMA)
        create_slot(conn, slot)
        conn.execute(f"CALL gl_run(1, {n})")
        messages = [(m.lsn, bytes(m.data)) for m in peek(conn, slot, pgoutput_options("gl_pub"))]
        return messages, current_flush_lsn(conn)


def test_a_stored_log_is_cut_into_ranges_within_the_limits_and_replayed_on_executors_within_them(pg, spark,
                                                                                                  tmp_path):
    """survey_log cuts a stored log after the 5th transaction of a range, and before a transaction that would
    take a range past 8 row messages (after it, when it is alone); the replay on executors then keeps the
    limits in every group."""
    from applier.config import ReplayConfig
    from applier.drivers.executors.survey import survey_log
    from applier.drivers.replay import replay_log
    from applier.sources.rawlog_writer import write_raw_log

    messages, _flush = _backlog(pg, "gl_log", 200)
    log = tmp_path / "raw.parquet"
    write_raw_log(log, [(lsn, 0, data) for lsn, data in messages])
    survey = survey_log(str(log), None, partition_messages=8, max_transactions=5)
    assert survey.tail is None
    # and some ranges were cut before a transaction that would have taken them past 8 messages
    assert _ranges_keep(survey.ranges, messages, max_transactions=5, max_rows=8) >= 5
    for limit in sorted(LIMITS):
        target = tmp_path / limit
        summary = replay_log(spark, ReplayConfig.model_validate({
            "source_log": str(log), "target": {"path": str(target)}, "distributed": {"mode": "on"},
            "apply": LIMITS[limit]}))
        assert summary.ranges > 1 and summary.transactions == 200, summary
        _check(_groups(target / "public" / "gl", -1), 200, **_limits(LIMITS[limit]))
        with pg.connect() as conn:
            _assert_equal(spark, conn, target)


def test_a_stream_is_cut_into_ranges_within_the_limits(pg):
    """StreamRanges (a catch-up's reader of the walsender) cuts as survey_log does."""
    from applier.drivers.backlog import StreamRanges
    from applier.sources.walsender import WalSenderStream

    messages, flush = _backlog(pg, "gl_stream", 200)
    stream = WalSenderStream(pg.dsn)
    try:
        stream.start("gl_stream", {"proto_version": "1", "publication_names": "gl_pub"})
        source = StreamRanges(stream, None, partition_messages=8, target=flush, max_transactions=5)
        ranges = list(source.ranges())
        survey = source.result()
    finally:
        stream.close()
    assert survey.tail is None
    # the walsender sends the changes of a transaction without their positions (0): compare the bytes
    read = [(lsn, data) for r in ranges if r.inline is not None for lsn, data in zip(*r.inline, strict=True)]
    assert [d for _l, d in read] == [d for _l, d in messages]
    _ranges_keep(ranges, read, max_transactions=5, max_rows=8)
