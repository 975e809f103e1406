"""``applier maintain`` on real tables: compaction racing the applier's own commits ends equal to Postgres
with the exactly-once record intact; VACUUM deletes what no version needs; a checkpoint is written;
tables delta-rs cannot write go through Spark."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from background import Background, captured_log

from applier.checks.verify import verify_against_postgres
from applier.config import (
    ApplySettings,
    MaintenanceSettings,
    MirrorConfig,
    ReplayConfig,
    SourceSettings,
    TableRule,
    TablesSettings,
    TargetSettings,
)
from applier.drivers.mirror import Mirror
from applier.drivers.replay import replay_log
from applier.sink.maintenance import TableMaintainer
from applier.sink.spec import app_id_for
from applier.sink.store import DELTARS
from applier.spark.session import SparkProvider

pytestmark = [pytest.mark.postgres, pytest.mark.spark]


def _captured_log(pg, tmp_path: Path, statements: list[str]) -> Path:
    return captured_log(pg, tmp_path, "CREATE TABLE k (id int PRIMARY KEY, v int, note text)", statements)


def _assert_equal(spark, pg, target: Path, rows: int) -> None:
    with pg.connect() as conn:
        [r] = verify_against_postgres(spark, conn, str(target), [("public", "k")])
        assert r.equal and r.source_rows == rows, (r.only_in_source[:3], r.only_in_target[:3])


# inserts in 30 transactions (a file each), then changes to single rows (each rewrites one file)
STATEMENTS = ([f"INSERT INTO k SELECT g, 0, 'n' || g FROM generate_series({i * 10 + 1}, {i * 10 + 10}) g"
               for i in range(30)]
              + [f"UPDATE k SET v = v + 1 WHERE id = {i * 7 % 300 + 1}" for i in range(30)]
              + [f"DELETE FROM k WHERE id = {i * 29 + 3}" for i in range(10)])


def test_maintenance_racing_the_applier_keeps_it_exact_then_vacuums_and_checkpoints(pg, spark, tmp_path):
    target = tmp_path / "delta"
    table = target / "public" / "k"
    log = _captured_log(pg, tmp_path, STATEMENTS)
    # one commit per transaction: dozens of small files, compacted while the applier keeps committing
    cfg = ReplayConfig(source_log=str(log), target=TargetSettings(path=str(target)),
                       apply=ApplySettings(grouping="transaction", merge_engine="auto"))
    maintainer = TableMaintainer(MaintenanceSettings(min_small_files=3), None)
    compactions: list[int] = []

    def maintain_loop(stop: threading.Event, _progress) -> None:
        while not stop.is_set():
            if (table / "_delta_log").is_dir():
                result = maintainer.maintain(table, "public.k")
                if result.compacted:
                    compactions.append(result.before.count)
            time.sleep(0.05)

    with Background(maintain_loop).running():
        replay_log(spark, cfg)
    assert compactions, "no compaction ran while the applier committed: the race was not exercised"
    _assert_equal(spark, pg, target, rows=290)
    applied = DELTARS.open(str(table)).transaction_version(app_id_for("public.k"))
    assert applied is not None

    # Now stopped: the CLI with a zero retention (allowed only with enforce_retention: false)
    config = tmp_path / "mirror.yaml"
    config.write_text(yaml.safe_dump({"target": {"path": str(target)}, "maintenance": {
        "min_small_files": 2, "retention_hours": 0, "enforce_retention": False}}))
    before_files = sum(1 for _ in table.glob("*.parquet"))
    dry = subprocess.run([sys.executable, "-m", "applier.cli", "maintain", "--config", str(config), "--dry-run",
                          "--json"], capture_output=True, text=True, timeout=300)
    assert dry.returncode == 0, dry.stderr
    [planned] = json.loads(dry.stdout)["tables"]
    assert planned["table"] == "public.k" and planned["vacuumed_files"] > 0
    assert sum(1 for _ in table.glob("*.parquet")) == before_files  # a dry run deletes nothing
    done_run = subprocess.run([sys.executable, "-m", "applier.cli", "maintain", "--config", str(config), "--json"],
                              capture_output=True, text=True, timeout=300)
    assert done_run.returncode == 0, done_run.stderr
    assert "starting Spark" not in done_run.stderr  # delta-rs did it all: no JVM
    [result] = json.loads(done_run.stdout)["tables"]
    assert result["engine"] == "delta-rs" and result["files_after"] == 1
    assert result["vacuumed_files"] >= planned["vacuumed_files"]  # and the files its compaction replaced
    assert sum(1 for _ in table.glob("*.parquet")) == 1  # every file no version of the last 0 hours needs: gone
    assert result["checkpoint_version"] is not None
    assert (table / "_delta_log" / f"{result['checkpoint_version']:020d}.checkpoint.parquet").exists()
    # the exactly-once record survives, read back through the checkpoint
    assert DELTARS.open(str(table)).transaction_version(app_id_for("public.k")) == applied
    _assert_equal(spark, pg, target, rows=290)
    replay_log(spark, cfg)  # run again: every transaction is recognised as applied, nothing changes
    _assert_equal(spark, pg, target, rows=290)


def test_a_table_delta_rs_cannot_write_is_compacted_with_spark(pg, spark, tmp_path):
    target = tmp_path / "delta"
    table = target / "public" / "k"
    log = _captured_log(pg, tmp_path, STATEMENTS[:4])
    cfg = ReplayConfig(source_log=str(log), target=TargetSettings(path=str(target)),
                       apply=ApplySettings(grouping="transaction"),
                       tables=TablesSettings(rules=[TableRule(match="public.k", type_widening=True)]))
    replay_log(spark, cfg)
    assert "typeWidening" in (DELTARS.open(str(table)).protocol().writer_features or [])
    maintainer = TableMaintainer(MaintenanceSettings(min_small_files=2, z_order={"public.*": ["v"]}),
                                 SparkProvider.of(spark))
    result = maintainer.maintain(table, "public.k")
    assert result.engine == "spark" and result.compacted
    assert result.before.count >= 4 and result.after.count == 1, result
    optimize = next(h for h in DELTARS.open(str(table)).history() if h["operation"] == "OPTIMIZE")
    assert "v" in optimize["operationParameters"]["zOrderBy"], optimize
    _assert_equal(spark, pg, target, rows=40)


def test_a_running_mirror_maintains_its_tables_while_idle(pg, spark, tmp_path):
    """``maintenance.every_minutes``: the mirror compacts between groups, and goes on applying after it."""
    target = tmp_path / "delta"
    config = MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="mm", publication="kp"),
                          target=TargetSettings(path=str(target)),
                          maintenance=MaintenanceSettings(every_minutes=0.01, min_small_files=4))
    with pg.connect() as conn:
        conn.execute("CREATE TABLE k (id int PRIMARY KEY, v int, note text)")
        conn.execute("CREATE PUBLICATION kp FOR TABLE k")
        mirror: list[Mirror] = []

        def job(stop: threading.Event, progress) -> None:
            mirror.append(Mirror(spark, config, stop=stop, progress_every=0.5, progress=progress))
            mirror[0].run(once=False)

        with Background(job).running() as bg:
            bg.wait_for(lambda: mirror and mirror[0].summary.snapshot_lsn is not None, "the initial copy")
            schedule = mirror[0].maintenance
            assert schedule is not None
            for i in range(12):  # one small file each, compacted by the schedule between them
                conn.execute(f"INSERT INTO k SELECT g, {i}, 'n' FROM generate_series({i * 10 + 1}, {i * 10 + 10}) g")
                time.sleep(0.3)
            bg.wait_for(lambda: any(r.compacted for r in schedule.results), "a compaction by the schedule")
            conn.execute("UPDATE k SET v = -1 WHERE id % 3 = 0")  # applied after a compaction
            bg.wait_for(lambda: sum(1 for v in DELTARS.open(str(target / "public" / "k")).to_pyarrow_table()
                                    .column("v").to_pylist() if v == -1) == 40, "the update after it")
    _assert_equal(spark, pg, target, rows=120)

