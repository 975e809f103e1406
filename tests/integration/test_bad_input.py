"""Bad input stops the applier before the bad transaction, leaves the tables as after the last good
one, and can be got past by fixing the log or by skipping the transaction by its commit LSN.

The log is captured from a real PostgreSQL (three transactions A, B, C on one table) and then
damaged in B the way logs get damaged: cut bytes, an unknown type byte, a change for a relation
the stream never described, a Commit whose Begin was lost, invalid UTF-8 in a text value,
messages out of order. A fourth case needs no damage: a value Spark cannot hold (date
'infinity' under the default policy) written by PostgreSQL itself.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from applier.cli import main as cli_main
from applier.config import ApplySettings, ReplayConfig, TargetSettings
from applier.drivers.replay import replay_log
from applier.errors import ApplierError
from applier.lsn import format_lsn
from applier.sink.audit import read_skips
from applier.sources.rawlog import read_raw_log
from applier.sources.rawlog_writer import write_raw_log
from applier.sources.sql_slot import create_slot, peek, pgoutput_options

pytestmark = [pytest.mark.postgres, pytest.mark.spark]

AFTER_A = {1: ("a", dt.date(2020, 1, 1)), 2: ("b", dt.date(2020, 1, 2))}
AFTER_A_C = {**AFTER_A, 3: ("c", dt.date(2020, 1, 3))}


@pytest.fixture(scope="module")
def captured(pg_module):
    """The raw rows of A (two inserts), B (an update of row 1), C (an insert) and D (a date Spark
    cannot hold), B's and D's commit LSNs."""
    with pg_module.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text, d date)")
        conn.execute("CREATE PUBLICATION pub FOR TABLE t")
        create_slot(conn, "s")
        conn.execute("INSERT INTO t VALUES (1, 'a', '2020-01-01'), (2, 'b', '2020-01-02')")
        conn.execute("UPDATE t SET v = 'xx' WHERE id = 1")
        conn.execute("INSERT INTO t VALUES (3, 'c', '2020-01-03')")
        conn.execute("INSERT INTO t VALUES (9, 'inf', 'infinity')")
        rows = [(m.lsn, m.xid, bytes(m.data)) for m in peek(conn, "s", pgoutput_options("pub"))]
        final = {r[0]: (r[1], r[2]) for r in conn.execute("SELECT id, v, d FROM t WHERE id < 9")}
    xids = list(dict.fromkeys(x for _lsn, x, _d in rows))
    assert len(xids) == 4, xids
    b = [r for r in rows if r[1] == xids[1]]
    assert [d[:1] for _l, _x, d in b] == [b"B", b"U", b"C"], b
    commit_b = int.from_bytes(b[2][2][2:10], "big")  # Commit: flags (1 byte), then the commit LSN
    d_txn = [r for r in rows if r[1] == xids[3]]
    commit_d = int.from_bytes(d_txn[-1][2][2:10], "big")
    assert final[1] == ("xx", dt.date(2020, 1, 1))
    return rows, xids, commit_b, commit_d


def damage(rows, xid_b, how: str):
    """The log with B damaged; D (the infinity date) left out unless asked for."""
    out = []
    for lsn, xid, data in rows:
        if xid == xid_b and data[:1] == b"U":
            if how == "truncated":
                data = data[:-3]
            elif how == "unknown_type":
                data = b"Z" + data[1:]
            elif how == "unknown_relation":
                data = data[:1] + (999_999).to_bytes(4, "big") + data[5:]
            elif how == "invalid_utf8":
                assert data.count(b"xx") == 1
                data = data.replace(b"xx", b"\xff\xfe")
            elif how in ("commit_without_begin", "reordered"):
                continue
        if xid == xid_b and data[:1] == b"B" and how == "commit_without_begin":
            continue
        out.append((lsn, xid, data))
        if xid == xid_b and data[:1] == b"C" and how == "reordered":  # its Update after its Commit
            out.append(next((lsn2, x, d) for lsn2, x, d in rows if x == xid_b and d[:1] == b"U"))
    return out


def table(spark, target: Path) -> dict[int, tuple[str, dt.date]]:
    df = spark.read.format("delta").load(str(target / "public" / "t"))
    return {r["id"]: (r["v"], r["d"]) for r in df.collect()}


def versions(spark, target: Path) -> int:
    from delta.tables import DeltaTable

    return DeltaTable.forPath(spark, str(target / "public" / "t")).history(1).collect()[0].version


def config(log: Path, target: Path, **apply) -> ReplayConfig:
    # one transaction per group: A must land even though B fails in the same run
    return ReplayConfig(source_log=str(log), target=TargetSettings(path=str(target)), apply=ApplySettings(**apply))


SKIPPABLE = {
    "truncated": ("DecodeError", ["kind=Update", "offset=", "relation=public.t"]),
    "unknown_type": ("DecodeError", ["unknown pgoutput message type byte", "offset=0"]),
    "unknown_relation": ("CatalogError", ["relation_oid=999999"]),
    "invalid_utf8": ("ValueConversionError", ["relation=public.t"]),
    "commit_without_begin": ("AssemblyError", ["Commit without Begin"]),
}


@pytest.mark.usefixtures("replay_path")
@pytest.mark.parametrize("how", sorted(SKIPPABLE))
def test_bad_transaction_stops_before_it_and_can_be_skipped_by_commit_lsn(captured, spark, tmp_path, how):
    rows, xids, commit_b, _ = captured
    log = tmp_path / "log.parquet"
    write_raw_log(log, [r for r in damage(rows, xids[1], how) if r[1] != xids[3]])
    target = tmp_path / "delta"
    error_class, fragments = SKIPPABLE[how]

    with pytest.raises(ApplierError) as info:
        replay_log(spark, config(log, target))
    err = info.value
    text = str(err)
    assert type(err).__name__ == error_class, text
    assert f"commit_lsn={format_lsn(commit_b)}" in text, text
    assert "lsn=" in text and (how == "commit_without_begin" or f"xid={xids[1]}" in text), text
    for fragment in fragments:
        assert fragment in text, text
    assert table(spark, target) == AFTER_A  # exactly as after the last good transaction

    # The way forward: skip B by its commit LSN. C is applied, the skip is audited.
    summary = replay_log(spark, config(log, target, skip_transactions=[format_lsn(commit_b)]))
    assert table(spark, target) == AFTER_A_C
    assert summary.last_end_lsn is not None
    skips = read_skips(spark, str(target / "_applier" / "skipped_transactions"))
    assert [s["commit_lsn"] for s in skips] == [format_lsn(commit_b)]
    assert skips[0]["reason"]

    # The skip is remembered: replaying the whole log again (no skip option) writes nothing new.
    before = versions(spark, target)
    replay_log(spark, config(log, target))
    assert versions(spark, target) == before
    assert len(read_skips(spark, str(target / "_applier" / "skipped_transactions"))) == 1


@pytest.mark.usefixtures("replay_path")
def test_fix_and_resume_and_a_reordered_log(captured, spark, tmp_path):
    rows, xids, _, _ = captured
    good = tmp_path / "good.parquet"
    write_raw_log(good, [r for r in rows if r[1] != xids[3]])
    expected = {**AFTER_A_C, 1: ("xx", dt.date(2020, 1, 1))}

    # Fix and resume: B's damage held it back, so the corrected log applies B and C in place.
    cut, target = tmp_path / "cut.parquet", tmp_path / "delta"
    write_raw_log(cut, [r for r in damage(rows, xids[1], "truncated") if r[1] != xids[3]])
    with pytest.raises(ApplierError, match="commit_lsn="):
        replay_log(spark, config(cut, target, grouping="grouped"))
    assert table(spark, target) == AFTER_A
    replay_log(spark, config(good, target))
    assert table(spark, target) == expected

    # A change after its own Commit stops at once, naming its LSN. B's Commit was already taken as
    # an empty transaction, so the fixed log is replayed into a new target (docs/guarantees.md: bad input).
    bad, target2 = tmp_path / "bad.parquet", tmp_path / "delta2"
    write_raw_log(bad, [r for r in damage(rows, xids[1], "reordered") if r[1] != xids[3]])
    with pytest.raises(ApplierError, match="change outside a transaction") as info:
        replay_log(spark, config(bad, target2, grouping="grouped"))
    assert "kind=Update" in str(info.value) and "lsn=" in str(info.value)
    assert table(spark, target2) == AFTER_A
    replay_log(spark, config(good, tmp_path / "delta3"))
    assert table(spark, tmp_path / "delta3") == expected


def test_value_spark_cannot_hold_stops_and_the_cli_says_what_to_do(captured, spark, tmp_path, capsys):
    rows, xids, _, commit_d = captured
    log = tmp_path / "log.parquet"
    write_raw_log(log, rows)
    target = tmp_path / "delta"
    code = cli_main(["replay", "--source", str(log), "--target", str(target)])
    err = capsys.readouterr().err
    assert code == 4  # ExitCode.BAD_DATA
    assert "ValueConversionError" in err or "infinity" in err, err
    assert f"commit_lsn={format_lsn(commit_d)}" in err and "relation=public.t" in err, err
    assert f"--skip-transaction {format_lsn(commit_d)}" in err, err
    assert table(spark, target) == {**AFTER_A_C, 1: ("xx", dt.date(2020, 1, 1))}

    code = cli_main(["replay", "--source", str(log), "--target", str(target),
                     "--skip-transaction", format_lsn(commit_d)])
    assert code == 0, capsys.readouterr().err
    assert 9 not in table(spark, target)
    assert len(list(read_raw_log(str(log)))) == len(rows)
