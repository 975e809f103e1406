"""Change feed tables (issue 19 item 9's change feed) against a real PostgreSQL.

The feed is right when what a CDC consumer makes of it equals Postgres: per key the last row by
(__commit_lsn, __ordinal), gone when that row is a delete (what create_auto_cdc_flow does with
``apply_as_deletes``). Every insert and update row must hold every value (unchanged TOAST resolved),
the copy's rows come first as 'R', a TRUNCATE deletes every row, and a re-run appends nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from applier.config import ApplySettings, MirrorConfig, SourceSettings, TableRule, TablesSettings, TargetSettings
from applier.drivers.mirror import mirror

pytestmark = [pytest.mark.postgres, pytest.mark.spark]

deltalake = pytest.importorskip("deltalake")

BIG = "z" * 5000


def consumed(feed: list[dict[str, Any]], columns: tuple[str, ...]) -> set[tuple[Any, ...]]:
    """What a CDC consumer (AUTO CDC, SCD type 1) makes of the feed."""
    last: dict[Any, dict[str, Any]] = {}
    for row in sorted(feed, key=lambda r: (r["__commit_lsn"], r["__ordinal"])):
        last[row["id"]] = row
    return {tuple(r[c] for c in columns) for r in last.values() if r["__op"] != "D"}


def run_workload(conn, config: MirrorConfig, spark) -> int:
    """The feed's workload, mirrored in two runs; returns the copy's position."""
    conn.execute("CREATE TABLE acct (id int PRIMARY KEY, v int, big text)")
    conn.execute("ALTER TABLE acct ALTER COLUMN big SET STORAGE EXTERNAL")
    conn.execute("INSERT INTO acct SELECT g, g, %s FROM generate_series(1, 10) g", (BIG,))
    conn.execute("CREATE PUBLICATION cf_pub FOR TABLE acct")
    first = mirror(spark, config, once=True)
    statements = [
        ["UPDATE acct SET v = v + 100 WHERE id <= 4"],  # big unchanged: 'u', from the mirror table
        ["DELETE FROM acct WHERE id = 5"],
        ["UPDATE acct SET id = 106 WHERE id = 6"],  # a key change: D 6, U 106 with big resolved
        ["INSERT INTO acct VALUES (30, 30, 'x')", "UPDATE acct SET v = 31 WHERE id = 30",
         "DELETE FROM acct WHERE id = 30"],
        None,  # the second run starts here
        ["UPDATE acct SET v = -1 WHERE id = 1"],  # 'u' again, across the runs
        ["UPDATE acct SET v = 7 WHERE id = 7", "TRUNCATE acct",
         f"INSERT INTO acct VALUES (1, 1, '{BIG}'), (2, 2, 'b')"],
        ["UPDATE acct SET v = 5 WHERE id = 1"],
    ]
    for txn in statements:
        if txn is None:
            mirror(spark, config, once=True)
            continue
        with conn.transaction():
            for sql in txn:
                conn.execute(sql)
    mirror(spark, config, once=True)
    assert first.snapshot_lsn is not None
    return first.snapshot_lsn


def feed_config(pg, target: Path, slot: str) -> MirrorConfig:
    return MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot=slot, publication="cf_pub"),
                        target=TargetSettings(path=str(target)),
                        tables=TablesSettings(rules=[TableRule(match="public.acct", changes=True)]),
                        apply=ApplySettings(max_group_transactions=1000))


def test_change_feed_consumed_like_auto_cdc_equals_postgres(pg, spark, tmp_path):
    config = feed_config(pg, tmp_path / "delta", "cf")
    path = tmp_path / "delta" / "_changes" / "public" / "acct"
    with pg.connect() as conn:
        copy_lsn = run_workload(conn, config, spark)
        feed = deltalake.DeltaTable(str(path)).to_pyarrow_table().to_pylist()
        want = {tuple(r) for r in conn.execute("SELECT id, v, big FROM acct")}
        assert consumed(feed, ("id", "v", "big")) == want
        copied = [r for r in feed if r["__op"] == "R"]
        assert len(copied) == 10 and {r["__commit_lsn"] for r in copied} == {copy_lsn}
        assert all(r["big"] is not None for r in feed if r["__op"] in "IUR")  # every value, TOAST resolved
        assert all(r["__commit_time"] is not None for r in feed if r["__op"] != "R")
        ops = [(r["id"], r["__op"]) for r in sorted(feed, key=lambda r: (r["__commit_lsn"], r["__ordinal"]))
               if r["__op"] != "R"]
        assert (6, "D") in ops and ops.index((6, "D")) < ops.index((106, "U"))  # the key change
        at_truncate = next(r["__commit_lsn"] for r in feed if r["id"] == 7 and r["__op"] == "U")
        truncated = {r["id"] for r in feed if r["__op"] == "D" and r["__commit_lsn"] == at_truncate}
        assert truncated == {1, 2, 3, 4, 7, 8, 9, 10, 106}  # every row the table held
        by_key6 = next(r for r in feed if r["id"] == 6 and r["__op"] == "D")
        assert (by_key6["v"], by_key6["big"]) == (6, BIG)  # a delete carries the deleted row's values
        version = deltalake.DeltaTable(str(path)).version()
        mirror(spark, config, once=True)
        assert deltalake.DeltaTable(str(path)).version() == version  # nothing appended twice
