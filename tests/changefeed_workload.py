"""The change-feed workload shared by tests/integration/test_changefeed.py and
tests/scenario/test_pipelines.py (a helper module, not a test file: both tiers import it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from applier.config import ApplySettings, MirrorConfig, SourceSettings, TableRule, TablesSettings, TargetSettings
from applier.drivers.mirror import mirror

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
