"""A transaction larger than ``apply.memory_budget_mb`` (issue 47, repro 19): a 3M-row UPDATE needed
3.1 GB, about 1 KB per changed row whatever the budget, and the run said nothing for minutes. It is
spilled, then read back and applied a piece at a time (applier.loop, ``_apply_pieced``): memory holds
one piece. Each piece commits with a piece marker, so a crash between pieces, and a next run that cuts
the transaction into other pieces, applies every change exactly once: key-less tables (a multiset,
where a change applied twice is a duplicate row), key changes, updates that leave a TOAST value
unchanged. Every case ends equal to Postgres, row by row."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import deltalake
import pytest
import yaml

from applier.checks.verify import verify_against_postgres
from applier.config import ApplySettings, DistributedSettings, MirrorConfig, SourceSettings, TargetSettings
from applier.drivers.mirror import mirror
from applier.sink.spec import app_id_for
from applier.spark.session import SparkProvider

pytestmark = [pytest.mark.postgres]

REPO = Path(__file__).resolve().parents[2]
TABLES = [("public", "h"), ("public", "bag")]

SCHEMA = """
CREATE TABLE h (id int PRIMARY KEY, v int, pad text, doc text);
ALTER TABLE h ALTER COLUMN doc SET STORAGE EXTERNAL;
INSERT INTO h SELECT g, g, repeat('p', 60), CASE WHEN g % 500 = 0 THEN repeat(md5(g::text), 300) END
  FROM generate_series(1, 6000) g;
CREATE TABLE bag (a int, b text);
ALTER TABLE bag REPLICA IDENTITY FULL;
INSERT INTO bag SELECT g % 50, 'x' FROM generate_series(1, 3000) g;
CREATE PUBLICATION huge FOR TABLE h, bag;
"""

#: One transaction of ~21,000 row changes: updates (a TOAST value left unchanged), key changes, deletes,
#: inserts, and a key-less table's duplicate rows inserted and deleted
BIG = """
BEGIN;
UPDATE h SET v = v + 1, pad = pad || 'x';
UPDATE h SET id = id + 100000 WHERE id % 7 = 0;
DELETE FROM h WHERE id % 11 = 0;
INSERT INTO h SELECT g, g, 'new', NULL FROM generate_series(200001, 203000) g;
UPDATE h SET v = -v WHERE id % 500 = 0 OR id % 700 = 0;
INSERT INTO bag SELECT g % 50, 'y' FROM generate_series(1, 3000) g;
DELETE FROM bag WHERE a % 3 = 0 AND b = 'x';
UPDATE bag SET b = 'z' WHERE a = 1;
COMMIT;
"""


def _config(pg, target: Path, budget_mb: int) -> MirrorConfig:
    return MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="huge", publication="huge"),
                        target=TargetSettings(path=str(target)),
                        apply=ApplySettings(memory_budget_mb=budget_mb), distributed=DistributedSettings(mode="off"))


def _assert_equal(conn, target: Path) -> None:
    no_spark = SparkProvider(lambda: pytest.fail("Spark started"))
    for r in verify_against_postgres(no_spark, conn, str(target), TABLES):
        assert r.equal, (r.source_name, r.source_rows, r.target_rows, r.only_in_source[:3], r.only_in_target[:3])


def test_a_transaction_over_the_budget_is_applied_in_pieces_and_said(pg, tmp_path, caplog):
    target = tmp_path / "delta"
    config = _config(pg, target, 1)  # pieces of 1,024 row changes
    no_spark = SparkProvider(lambda: pytest.fail("Spark started"))
    with pg.connect() as conn:
        conn.execute(SCHEMA)
        mirror(no_spark, config, once=True)
        conn.execute(BIG)
        lines: list[str] = []
        with caplog.at_level(logging.INFO):
            mirror(no_spark, config, once=True, progress=lines.append)
        assert "over apply.memory_budget_mb (1 MB): spilled to disk" in caplog.text, caplog.text
        pieces = [line for line in lines if ": applying piece " in line]
        assert len(pieces) >= 10 and "(1,024 row changes)" in pieces[0], lines
        _assert_equal(conn, target)
        table = deltalake.DeltaTable(str(target / "public" / "h"))
        marked = [c for c in table.history() if "piece=changes<=" in (c.get("userMetadata") or "")]
        assert len(marked) >= 10, [c.get("userMetadata") for c in table.history()]
        # both tables record the transaction's end as applied (h's last rows came in an earlier piece)
        ends = {deltalake.DeltaTable(str(target / "public" / t)).transaction_version(app_id_for(f"public.{t}"))
                for t in ("h", "bag")}
        assert len(ends) == 1 and ends != {None}, ends


@pytest.mark.parametrize("hit", [1, 7])
def test_a_crash_between_pieces_then_other_pieces_apply_each_change_once(pg, tmp_path, hit):
    """Killed after the ``hit``-th piece's commits; the next run cuts the transaction into pieces twice
    as large (another budget): the key-less table would hold duplicates if a committed piece applied
    again, the keyed one would lose the TOAST value of a changed key."""
    target = tmp_path / "delta"
    config_file = tmp_path / "mirror.yaml"
    config_file.write_text(yaml.safe_dump({
        "source": {"slot": "huge", "publication": "huge"}, "target": {"path": str(target)},
        "apply": {"memory_budget_mb": 1}, "distributed": {"mode": "off"}}))
    env = {**os.environ, "APPLIER_DSN": pg.dsn, "PYTHONPATH": str(REPO), "APPLIER_CRASH_AT": f"piece_committed:{hit}"}
    command = [sys.executable, "-m", "applier.cli", "mirror", "--config", str(config_file), "--once"]
    no_spark = SparkProvider(lambda: pytest.fail("Spark started"))
    with pg.connect() as conn:
        conn.execute(SCHEMA)
        mirror(no_spark, _config(pg, target, 1), once=True)
        conn.execute(BIG)
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == -signal.SIGKILL, (done.returncode, done.stdout[-2000:], done.stderr[-3000:])
        mirror(no_spark, _config(pg, target, 2), once=True)
        _assert_equal(conn, target)
        conn.execute("INSERT INTO bag VALUES (-1, 'after')")  # and the mirror goes on from there
        mirror(no_spark, _config(pg, target, 2), once=True)
        _assert_equal(conn, target)


@pytest.mark.parametrize("reader", ["auto", "walsender"])
def test_a_catch_up_at_the_start_hands_a_transaction_over_the_budget_to_the_pieces(pg, tmp_path, reader):
    """Issue 77: a backlog caught up in ranges held a whole huge transaction in one range (a 3M-row UPDATE:
    2.3 GB at a budget of 256 MB), since a range is cut only where no transaction is open. A range now
    holds at most a sixth of the budget; a transaction larger than twice that ends the ranges, and the
    apply loop takes it and applies it in pieces. Small transactions before and after it go through
    ranges and the driver; all of it once, whichever reader reads the backlog (a temporary copy of the
    slot, then the walsender from where the copy's commits ended; or the walsender alone)."""
    target = tmp_path / "delta"
    config = MirrorConfig(
        source=SourceSettings(dsn=pg.dsn, slot="huge", publication="huge"), target=TargetSettings(path=str(target)),
        apply=ApplySettings(memory_budget_mb=1),
        distributed=DistributedSettings(mode="on", min_backlog_mb=0, backlog_reader=reader))
    no_spark = SparkProvider(lambda: pytest.fail("Spark started"))
    with pg.connect() as conn:
        conn.execute(SCHEMA)
        mirror(no_spark, config, once=True)
        for i in range(40):  # about 400 kB of small transactions: ranges of their own before the big one
            conn.execute("UPDATE h SET v = v + 1 WHERE id BETWEEN %s AND %s", (i * 100 + 1, i * 100 + 60))
        conn.execute(BIG)
        conn.execute("INSERT INTO bag VALUES (-2, 'after the big one')")
        lines: list[str] = []
        mirror(no_spark, config, once=True, progress=lines.append)
        handed = [line for line in lines if "catch-up: a transaction holds over" in line]
        assert handed and "applied on the driver, in pieces" in handed[0], lines
        assert any(": applying piece " in line for line in lines), lines
        assert any("catch-up on the driver:" in line and " 0 ranges" not in line for line in lines), lines
        _assert_equal(conn, target)
        conn.execute("UPDATE bag SET b = 'later' WHERE a = -2")
        mirror(no_spark, config, once=True)
        _assert_equal(conn, target)
