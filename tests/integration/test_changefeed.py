"""Change feed tables (issue 19 item 9's change feed) against a real PostgreSQL.

The feed is right when what a CDC consumer makes of it equals Postgres: per key the last row by
(__commit_lsn, __ordinal), gone when that row is a delete (what create_auto_cdc_flow does with
``apply_as_deletes``). Every insert and update row must hold every value (unchanged TOAST resolved),
the copy's rows come first as 'R', a TRUNCATE deletes every row, and a re-run appends nothing.
"""

from __future__ import annotations

import pytest
from changefeed_workload import BIG, consumed, feed_config, run_workload

from applier.config import SnapshotSettings
from applier.drivers.mirror import mirror

pytestmark = [pytest.mark.postgres, pytest.mark.spark]

deltalake = pytest.importorskip("deltalake")


@pytest.mark.parametrize("on_executors", [False, True], ids=["driver", "executors"])
def test_change_feed_consumed_like_auto_cdc_equals_postgres(pg, spark, tmp_path, on_executors):
    """``executors``: the copy on Spark's executors writes the feed's 'R' rows (applier's added columns,
    constants) and then the mirror table, each in one commit."""
    config = feed_config(pg, tmp_path / "delta", "cf")
    config = config.model_copy(update={"snapshot": SnapshotSettings(on_executors=on_executors)})
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
