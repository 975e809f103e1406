"""Replay on Spark's executors (applier.drivers.executors): what the driver path cannot show.

The replay tests, the random workloads and the bad-input tests already run every replay both ways
(the ``replay_path`` fixture). Here: a target that already holds part of the log (a crash between
groups, or an earlier replay with other boundaries) ends exactly as Postgres; ``auto`` chooses by
size and cores; a log whose files are not in log order takes the driver path; the CLI flag works;
the survey cuts only where nothing is open.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from workloads import SCHEMA, TABLES, random_workload

from applier.checks.verify import verify_against_postgres
from applier.config import ReplayConfig
from applier.drivers.executors.survey import survey_log
from applier.drivers.replay import on_executors, replay_log
from applier.sources.rawlog_writer import write_raw_log
from applier.sources.sql_slot import create_slot, peek, pgoutput_options
from applier.state import StateDir

pytestmark = [pytest.mark.postgres, pytest.mark.spark]


def capture(conn, path: Path, **options) -> list[tuple[int, int, bytes]]:
    rows = [(m.lsn, m.xid, m.data) for m in peek(conn, "s", pgoutput_options("rw_pub", **options))]
    write_raw_log(path, rows)
    return rows


def config(log: Path, target: Path, **distributed) -> ReplayConfig:
    return ReplayConfig.model_validate({"source_log": str(log), "target": {"path": str(target)},
                                        "distributed": {"mode": "on", "partition_messages": 40, **distributed},
                                        "apply": {"max_group_transactions": 7}})


def assert_equal(spark, conn, target: Path) -> None:
    for result in verify_against_postgres(spark, conn, str(target), TABLES):
        assert result.equal, (result.source_name, result.only_in_source[:3], result.only_in_target[:3])


def test_a_target_holding_part_of_the_log_ends_equal_to_postgres(pg, spark, tmp_path):
    """The first part of the log applied on the driver path with other group boundaries (what a crash
    between groups leaves), then the whole log on executors: each table leaves out exactly what it
    holds, across ranges, and a third replay writes nothing."""
    with pg.connect() as conn:
        conn.execute(SCHEMA)
        create_slot(conn, "s")
        random_workload(conn, 41, transactions=40)
        conn.execute("INSERT INTO rw_bag VALUES (-1, 'last')")
        rows = capture(conn, tmp_path / "raw.parquet", proto_version=2, streaming="on")
        commits = [i for i, (_lsn, _xid, data) in enumerate(rows) if data[:1] in (b"C", b"c")]
        cut = commits[len(commits) // 2] + 1
        write_raw_log(tmp_path / "first-half.parquet", rows[:cut])
        target = tmp_path / "delta"
        replay_log(spark, config(tmp_path / "first-half.parquet", target, mode="off"))
        summary = replay_log(spark, config(tmp_path / "raw.parquet", target))
        assert summary.ranges > 3 and 0 < summary.applied < summary.transactions
        assert_equal(spark, conn, target)
        versions = {p: len(list(p.glob("*.json"))) for p in target.glob("*/*/_delta_log")}
        again = replay_log(spark, config(tmp_path / "raw.parquet", target))
        assert again.applied == 0 and again.ranges > 3
        assert {p: len(list(p.glob("*.json"))) for p in target.glob("*/*/_delta_log")} == versions


def test_auto_chooses_by_size_and_cores_and_a_log_out_of_file_order_takes_the_driver_path(pg, spark, tmp_path,
                                                                                           capsys):
    from applier.cli import main

    with pg.connect() as conn:
        conn.execute(SCHEMA)
        create_slot(conn, "s")
        random_workload(conn, 42, transactions=20)
        rows = capture(conn, tmp_path / "raw.parquet")
        state = StateDir(tmp_path / "state")
        small = config(tmp_path / "raw.parquet", tmp_path / "t", mode="auto")
        assert "fewer than distributed.min_messages" in (on_executors(spark, small, state) or "")
        big_enough = config(tmp_path / "raw.parquet", tmp_path / "t", mode="auto", min_messages=len(rows))
        assert on_executors(spark, big_enough, state) is None  # the test session is local[2]
        assert on_executors(spark, config(tmp_path / "raw.parquet", tmp_path / "t", mode="off"), state)

        # Rows with seq, written out of seq order (as an OPTIMIZE may): read_raw_log sorts them, but
        # a file's row numbers are no longer log positions, so executors cannot be given ranges of it.
        shuffled = tmp_path / "shuffled"
        shuffled.mkdir()
        import pyarrow as pa

        table = pa.table({"lsn": [r[0] for r in rows], "xid": [r[1] for r in rows],
                          "data": [r[2] for r in rows], "seq": list(range(len(rows)))})
        pq.write_table(table.take(list(range(len(rows) - 1, -1, -1))), shuffled / "part-0.parquet")
        reason = on_executors(spark, config(shuffled, tmp_path / "t"), state)
        assert reason is not None and "not in seq order" in reason
        summary = replay_log(spark, config(shuffled, tmp_path / "from-shuffled"))
        assert summary.ranges == 0
        assert_equal(spark, conn, tmp_path / "from-shuffled")

        assert main(["replay", "--source", str(tmp_path / "raw.parquet"), "--target", str(tmp_path / "cli"),
                     "--distributed", "on"]) == 0
        assert "folded on executors: 1 ranges" in capsys.readouterr().out  # one range: the log is small
        assert_equal(spark, conn, tmp_path / "cli")


def test_the_survey_cuts_only_where_no_transaction_is_open(pg, tmp_path):
    """Streamed and two-phase transactions interleave with others; every range must hold whole
    transactions: its first message starts one (or is catalog/logical-message traffic between
    transactions) and no transaction is open after its last."""
    with pg.connect() as conn, pg.connect() as big:
        conn.execute(SCHEMA)
        conn.execute("CREATE TABLE big_t (a int, b text); ALTER PUBLICATION rw_pub ADD TABLE big_t")
        create_slot(conn, "s", two_phase=True)
        # A transaction larger than the test server's logical_decoding_work_mem (64kB) is streamed in
        # chunks, interleaved with the transactions that commit while it is open.
        big.execute("BEGIN")
        for part in range(4):
            big.execute("INSERT INTO big_t SELECT g, repeat('x', 100) FROM generate_series(1, 500) g")
            random_workload(conn, 44 + part, transactions=5)
        big.execute("COMMIT")
        random_workload(conn, 43, transactions=20, prepared=True)  # leaves a prepared transaction open
        conn.execute("INSERT INTO rw_bag VALUES (-1, 'last')")
        opts = pgoutput_options("rw_pub", proto_version=3, streaming="on")
        opts["two_phase"] = "true"
        rows = [(m.lsn, m.xid, m.data) for m in peek(conn, "s", opts)]
    write_raw_log(tmp_path / "raw.parquet", rows)
    kinds = {r[2][:1] for r in rows}
    assert {b"S", b"c", b"b", b"P", b"K"} <= kinds  # streamed and two-phase transactions are there
    survey = survey_log(str(tmp_path / "raw.parquet"), None, partition_messages=5)
    assert len(survey.ranges) > 10
    position = 0
    for r in [*survey.ranges, *([survey.tail] if survey.tail else [])]:
        ((_file, start, stop),) = r.segments
        assert start == position
        position = stop
        assert rows[start][2][:1] in (b"B", b"b", b"S", b"R", b"Y", b"M", b"K", b"r"), rows[start][2][:1]
    assert position == len(rows)


@pytest.mark.usefixtures("replay_path")
def test_a_target_directory_whose_name_delta_rs_cannot_take_is_written_through_spark(pg, spark, tmp_path):
    """delta-rs panics on a local path holding [ ] ^ | or a backslash (applier.sink.store.deltars): such a
    target is written through Spark, on either path, and still equals Postgres."""
    with pg.connect() as conn:
        conn.execute(SCHEMA)
        create_slot(conn, "s")
        random_workload(conn, 45, transactions=15)
        capture(conn, tmp_path / "raw.parquet")
        target = tmp_path / "run [1] ^|"
        replay_log(spark, ReplayConfig.model_validate({"source_log": str(tmp_path / "raw.parquet"),
                                                       "target": {"path": str(target)}}))
        assert_equal(spark, conn, target)
