"""The parallel, chunked initial copy against a real PostgreSQL: every kind of published table ends
exactly equal to Postgres (chunks on several connections, the CSV/Arrow path and the per-value path,
row filters, column lists, a partitioned table published via its root, generated columns, a table
without a key, an empty table), the stream then carries on from the snapshot; and a copy SIGKILLed
after some chunks of a table were committed is resumed without copying the finished tables again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import yaml
from deltalake import DeltaTable

from applier.checks.verify import verify_against_postgres
from applier.config import MirrorConfig, SnapshotSettings, SourceSettings, TargetSettings
from applier.drivers.mirror import Mirror, mirror

pytestmark = [pytest.mark.postgres, pytest.mark.spark]

REPO = Path(__file__).resolve().parents[2]

SCHEMA = """
CREATE TABLE big (id int PRIMARY KEY, k bigint, s smallint, b bool, t text, v varchar(20), c char(5),
                  u uuid, j jsonb, note text);
INSERT INTO big SELECT i, i::bigint * 1000003, (i % 30000)::smallint, CASE i % 3 WHEN 0 THEN true
    WHEN 1 THEN false END,
    CASE i % 7 WHEN 0 THEN NULL WHEN 1 THEN '' WHEN 2 THEN E'two\\nlines, "quoted"' WHEN 3 THEN 'ü€𝄞'
         ELSE repeat('x', i % 50) END,
    CASE WHEN i % 5 = 0 THEN NULL ELSE 'v' || i END, CASE WHEN i % 4 = 0 THEN '' ELSE 'c' END,
    md5(i::text)::uuid, jsonb_build_object('i', i, 's', 'a,b'), repeat('filler ', 10)
FROM generate_series(1, 40000) i;
CREATE TABLE typed (id int PRIMARY KEY, n numeric(10,2), f float8, d date, ts timestamptz, arr int[],
                    nb numeric, iv interval, tsn timestamp);
INSERT INTO typed SELECT i, i / 7.0, CASE i % 10 WHEN 0 THEN 'NaN' WHEN 1 THEN '-Infinity' ELSE i / 3.0 END,
    date '2020-01-01' + i, timestamptz '2021-03-04 05:06:07.123456+02' + i * interval '1 minute',
    ARRAY[i, NULL, -i], 10::numeric ^ 40 + i, i * interval '1 day 3 seconds',
    timestamp '1999-12-31 23:59:59.5' + i * interval '1 hour'
FROM generate_series(1, 3000) i;
CREATE TABLE bag (a int, b text);
ALTER TABLE bag REPLICA IDENTITY FULL;
INSERT INTO bag SELECT i % 100, 'dup' FROM generate_series(1, 3000) i;
CREATE TABLE filtered (id int PRIMARY KEY, a text);
INSERT INTO filtered SELECT i, 'f' || i FROM generate_series(1, 3000) i;
CREATE TABLE cols (id int PRIMARY KEY, a text, secret text);
INSERT INTO cols SELECT i, 'a' || i, 'hidden' FROM generate_series(1, 500) i;
CREATE TABLE gen (id int PRIMARY KEY, a int, g int GENERATED ALWAYS AS (a * 2) STORED);
INSERT INTO gen (id, a) SELECT i, i FROM generate_series(1, 500) i;
CREATE TABLE parted (id int PRIMARY KEY, r int) PARTITION BY RANGE (id);
CREATE TABLE parted_1 PARTITION OF parted FOR VALUES FROM (0) TO (1000);
CREATE TABLE parted_2 PARTITION OF parted FOR VALUES FROM (1000) TO (5000);
INSERT INTO parted SELECT i, i FROM generate_series(1, 3000) i;
CREATE TABLE empty (id int PRIMARY KEY);
ANALYZE;
CREATE PUBLICATION cp FOR TABLE big, typed, bag, filtered WHERE (id % 3 = 0), cols (id, a), gen, parted, empty
    WITH (publish_via_partition_root = true);
"""


def _delta_rows(spark, target: Path, table: str, columns: list[str]) -> Counter:
    frame = spark.read.format("delta").load(str(target / "public" / table))
    assert sorted(frame.columns) == sorted(columns), frame.columns  # generated / unlisted columns left out
    return Counter(tuple(r) for r in frame.select(*columns).collect())


def _pg_rows(conn, sql: str) -> Counter:
    return Counter(tuple(r) for r in conn.execute(sql).fetchall())


def _assert_all_equal(spark, conn, target: Path) -> None:
    results = verify_against_postgres(spark, conn, str(target),
                                      [("public", t) for t in ("big", "typed", "bag", "parted", "empty")])
    for r in results:
        assert r.equal, (r.source_name, r.source_rows, r.target_rows, r.only_in_source[:3], r.only_in_target[:3])
    assert _delta_rows(spark, target, "filtered", ["id", "a"]) == _pg_rows(
        conn, "SELECT id, a FROM filtered WHERE id % 3 = 0")
    assert _delta_rows(spark, target, "cols", ["id", "a"]) == _pg_rows(conn, "SELECT id, a FROM cols")
    assert _delta_rows(spark, target, "gen", ["id", "a"]) == _pg_rows(conn, "SELECT id, a FROM gen")


def test_parallel_chunked_copy_of_every_kind_of_table_equals_postgres_then_streams(pg, spark, tmp_path):
    target = tmp_path / "delta"
    cfg = MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="ic", publication="cp"),
                       target=TargetSettings(path=str(target)),
                       snapshot=SnapshotSettings(parallelism=3, chunk_mb=1, commit_mb=2))
    lines: list[str] = []
    with pg.connect() as conn:
        conn.execute(SCHEMA)
        (pages,) = conn.execute("SELECT relpages FROM pg_class WHERE relname = 'big'").fetchone()
        assert pages > 3 * 128  # big is cut into several 1 MB chunks
        summary = Mirror(spark, cfg, progress=lines.append, progress_every=0.0).run(once=True)
        assert summary.snapshot_rows["public.big"] == 40000
        assert summary.snapshot_rows["public.filtered"] == 1000
        assert summary.snapshot_rows["public.empty"] == 0
        _assert_all_equal(spark, conn, target)
        big_lines = [m for m in lines if m.startswith("snapshot: public.big: ")]
        assert any(" of ~40,000 (" in m and "rows/s" in m for m in big_lines), big_lines  # progress with estimate
        assert any(m.startswith("snapshot: public.big: 40000 rows in ") for m in big_lines), big_lines
        # big was written in several commits, the last one carrying the slot's point
        history = spark.sql(f"DESCRIBE HISTORY delta.`{target / 'public' / 'big'}`").collect()
        assert len(history) >= 3, len(history)

        conn.execute("UPDATE big SET t = 'changed' WHERE id % 1000 = 0; DELETE FROM big WHERE id < 100;"
                     "INSERT INTO bag VALUES (1, 'dup'); UPDATE filtered SET a = 'g' WHERE id < 30;"
                     "INSERT INTO parted VALUES (4000, 1); UPDATE gen SET a = -a WHERE id < 10;"
                     "UPDATE typed SET f = 'Infinity' WHERE id = 5")
        after = mirror(spark, cfg, once=True)
        assert after.snapshot_lsn is None and after.transactions >= 1
        _assert_all_equal(spark, conn, target)
        # created and copied by delta-rs alone (with the timestampNtz feature a timestamp without time
        # zone needs), then merged by Spark
        typed = DeltaTable(str(target / "public" / "typed"))
        assert typed.history()[-1]["clientVersion"].startswith("delta-rs")
        assert typed.protocol().writer_features == ["timestampNtz"]
        assert typed.to_pyarrow_table().num_rows == 3000


def test_copy_on_spark_executors_equals_postgres_then_streams(pg, spark, tmp_path):
    """``snapshot.on_executors: true`` (local executors here; tests/scenario/test_spark_cluster.py runs it on
    a standalone cluster): every table is one Spark job whose tasks read their chunks under the slot's
    snapshot, each table committed once, replacing what was there and carrying the snapshot's LSN. The
    tasks write Parquet files that delta-rs commits, or, into a table delta-rs does not write (column
    mapping: ``odd``'s names), through Spark's Delta writer."""
    target = tmp_path / "delta"
    cfg = MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="ice", publication="cp"),
                       target=TargetSettings(path=str(target)),
                       snapshot=SnapshotSettings(parallelism=3, chunk_mb=1, on_executors=True))
    lines: list[str] = []
    with pg.connect() as conn:
        conn.execute(SCHEMA)
        conn.execute('CREATE TABLE odd ("a b" int PRIMARY KEY, "c,d" text); ALTER PUBLICATION cp ADD TABLE odd;'
                     "INSERT INTO odd SELECT i, 'o' || i FROM generate_series(1, 700) i")
        summary = Mirror(spark, cfg, progress=lines.append, progress_every=0.0).run(once=True)
        assert summary.snapshot_rows["public.big"] == 40000
        assert summary.snapshot_rows["public.filtered"] == 1000
        assert summary.snapshot_rows["public.empty"] == 0
        _assert_all_equal(spark, conn, target)
        assert any(m.startswith("snapshot: public.big: 40000 rows in ")
                   and m.endswith(" on executors (delta-rs commit)") for m in lines), lines
        assert any(m.startswith("snapshot: public.odd: 700 rows in ")
                   and m.endswith(" on executors (Spark's Delta writer)") for m in lines), lines
        assert any(m.startswith("snapshot: 9 table(s), ") and m.endswith("on Spark's executors") for m in lines), lines
        assert _delta_rows(spark, target, "odd", ["a b", "c,d"]) == _pg_rows(conn, 'SELECT "a b", "c,d" FROM odd')
        for table in ("big", "typed", "bag", "filtered", "cols", "gen", "parted", "empty", "odd"):
            path = target / "public" / table
            history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").collect()
            assert [r["operationParameters"].get("mode") for r in history][0] == "Overwrite", (table, history)
            if table != "odd":  # delta-rs reads what the tasks wrote (column mapping it does not read)
                assert DeltaTable(str(path)).to_pyarrow_table().num_rows == summary.snapshot_rows[f"public.{table}"]
        # the files' statistics let readers skip: a key range reads the files that may hold it
        for table, low, high in (("big", 12000, 12050), ("typed", 7, 9)):
            frame = spark.read.format("delta").load(str(target / "public" / table))
            assert frame.where(f"id BETWEEN {low} AND {high}").count() == high - low + 1
            assert frame.where("id IS NULL").count() == 0
        assert _delta_rows(spark, target, "cols", ["id", "a"]) == _pg_rows(conn, "SELECT id, a FROM cols")
        assert _delta_rows(spark, target, "gen", ["id", "a"]) == _pg_rows(conn, "SELECT id, a FROM gen")

        conn.execute("UPDATE big SET t = 'changed' WHERE id % 1000 = 0; DELETE FROM big WHERE id < 100;"
                     "INSERT INTO bag VALUES (1, 'dup'); UPDATE filtered SET a = 'g' WHERE id < 30;"
                     "INSERT INTO parted VALUES (4000, 1); UPDATE typed SET f = 'Infinity' WHERE id = 5")
        after = mirror(spark, cfg, once=True)
        assert after.snapshot_lsn is None and after.transactions >= 1
        _assert_all_equal(spark, conn, target)


def test_copy_killed_after_some_chunks_of_a_table_resumes_without_copying_finished_tables(pg, spark, tmp_path):
    target = tmp_path / "delta"
    config = tmp_path / "mirror.yaml"
    settings: dict[str, Any] = {
        "source": {"slot": "rc", "publication": "cp"},
        "target": {"path": str(target)},
        # one connection: the tables are copied in publication order, so some are done when big dies
        "snapshot": {"parallelism": 1, "chunk_mb": 1, "commit_mb": 1},
    }
    config.write_text(yaml.safe_dump(settings))
    # the restarts run in the tests' Spark session with the same config (only the killed run needs a process)
    in_process = MirrorConfig.model_validate({**settings, "source": {**settings["source"], "dsn": pg.dsn}})
    env = {**os.environ, "APPLIER_DSN": pg.dsn, "PYTHONPATH": str(REPO)}
    env.pop("APPLIER_CRASH_AT", None)
    command = [sys.executable, "-m", "applier.cli", "mirror", "--config", str(config), "--once"]
    with pg.connect() as conn:
        conn.execute(SCHEMA)
        names = [r[0] for r in conn.execute("SELECT tablename FROM pg_publication_tables WHERE pubname = 'cp' "
                                            "ORDER BY schemaname, tablename")]
        assert names.index("bag") < names.index("big")  # bag is finished before big starts
        killed = subprocess.run(command, env={**env, "APPLIER_CRASH_AT": "snapshot_chunk:2"},
                                capture_output=True, text=True, timeout=900)
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
        assert "snapshot: public.bag: 3000 rows" in killed.stderr
        bag_path = target / "public" / "bag"
        bag_versions = len(spark.sql(f"DESCRIBE HISTORY delta.`{bag_path}`").collect())
        big_history = spark.sql(f"DESCRIBE HISTORY delta.`{target / 'public' / 'big'}`").collect()
        assert len(big_history) >= 2  # some chunks of big are committed, its copy is not finished

        # changes while the mirror is down: to a finished table, to the part-copied one, to the rest
        conn.execute("INSERT INTO bag VALUES (7, 'dup'); DELETE FROM big WHERE id % 2 = 0;"
                     "INSERT INTO big (id, t) VALUES (50001, 'late'); UPDATE typed SET n = 1 WHERE id < 100;"
                     "UPDATE parted SET r = -r WHERE id > 2000")
        lines: list[str] = []
        mirror(spark, in_process, once=True, progress=lines.append)
        assert "snapshot: public.bag: copied before, kept" in lines, lines
        assert any(line.startswith("snapshot: public.big: copying again at ") for line in lines), lines
        # bag was not copied again: its new commits are the stream's (one insert), no overwrite
        bag_history = spark.sql(f"DESCRIBE HISTORY delta.`{bag_path}`").collect()
        new_ops = [r["operationParameters"].get("mode") for r in bag_history[: len(bag_history) - bag_versions]]
        assert "Overwrite" not in new_ops, new_ops
        _assert_all_equal(spark, conn, target)
        conn.execute("INSERT INTO big (id, t) VALUES (50002, 'after')")
        lines.clear()
        mirror(spark, in_process, once=True, progress=lines.append)
        assert not [line for line in lines if "copying" in line], lines
        _assert_all_equal(spark, conn, target)


def test_copy_on_executors_killed_before_a_tables_commit_resumes_and_leaves_no_rows_twice(pg, spark, tmp_path):
    """On Spark's executors a table's copy is one commit of the files its tasks wrote: a mirror SIGKILLed
    after the tasks wrote a table's files and before the driver committed them keeps the tables committed
    before, copies that one again (its first files are in its directory, named by no commit), and every
    reader sees exactly Postgres."""
    target = tmp_path / "delta"
    config = tmp_path / "mirror.yaml"
    settings: dict[str, Any] = {
        "source": {"slot": "rx", "publication": "cp"},
        "target": {"path": str(target)},
        # one table at a time, in publication order: bag is committed when big's files are written
        "snapshot": {"parallelism": 1, "chunk_mb": 1, "on_executors": True},
    }
    config.write_text(yaml.safe_dump(settings))
    in_process = MirrorConfig.model_validate({**settings, "source": {**settings["source"], "dsn": pg.dsn}})
    env = {**os.environ, "APPLIER_DSN": pg.dsn, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "applier.cli", "mirror", "--config", str(config), "--once"]
    with pg.connect() as conn:
        conn.execute(SCHEMA)
        killed = subprocess.run(command, env={**env, "APPLIER_CRASH_AT": "snapshot_files:2"},
                                capture_output=True, text=True, timeout=900)
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
        assert "snapshot: public.bag: 3000 rows in " in killed.stderr, killed.stderr[-3000:]
        big = target / "public" / "big"
        orphans = {p.name for p in big.glob("*.parquet")}
        assert len(orphans) >= 8, orphans  # one file per chunk, written and not committed
        assert DeltaTable(str(big)).to_pyarrow_table().num_rows == 0  # created empty, never filled

        conn.execute("INSERT INTO bag VALUES (7, 'dup'); DELETE FROM big WHERE id % 2 = 0")
        lines: list[str] = []
        mirror(spark, in_process, once=True, progress=lines.append)
        assert "snapshot: public.bag: copied before, kept" in lines, lines
        assert any(line.startswith("snapshot: public.big: copying again at ") for line in lines), lines
        _assert_all_equal(spark, conn, target)
        table = DeltaTable(str(big))
        assert table.to_pyarrow_table().num_rows == 20000
        assert not orphans & {p.rsplit("/", 1)[-1] for p in table.file_uris()}  # the killed run's files: in no commit


def test_a_copy_written_as_files_by_its_threads_keeps_the_target_file_size_and_exact_statistics(pg, spark, tmp_path):
    """The copy's threads write their chunks as Parquet files while the others read (committed every
    ``commit_mb`` and at the end): the table's ``delta.targetFileSize`` still bounds each file (a MERGE
    later rewrites the files its keys reach), and every file's statistics are exactly its rows, so a
    reader that skips files by them reads exactly Postgres's rows."""
    from applier.config import TableRule, TablesSettings

    target = tmp_path / "delta"
    cfg = MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="icf", publication="cp"),
                       target=TargetSettings(path=str(target)),
                       snapshot=SnapshotSettings(parallelism=2, chunk_mb=1, commit_mb=3),
                       tables=TablesSettings(rules=[TableRule(match="public.big",
                                                              table_properties={"delta.targetFileSize": "262144"})]))
    with pg.connect() as conn:
        conn.execute(SCHEMA)
        summary = Mirror(spark, cfg).run(once=True)
        assert summary.snapshot_rows["public.big"] == 40000
        _assert_all_equal(spark, conn, target)
        big = DeltaTable(str(target / "public" / "big"))
        actions = pa.table(big.get_add_actions(flatten=True)).to_pylist()
        chunks = conn.execute("SELECT relpages FROM pg_class WHERE relname = 'big'").fetchone()[0] // 128 + 1
        assert len(actions) > chunks, (len(actions), chunks)  # chunks cut into files near the target size
        assert max(a["size_bytes"] for a in actions) < 3 * 262144, [a["size_bytes"] for a in actions]
        assert sum(a["num_records"] for a in actions) == 40000
        modes = [h["operationParameters"].get("mode") for h in reversed(big.history())]
        assert modes[1] == "Overwrite" and len(modes) >= 3, modes  # created, overwritten, appended
        for a in actions:  # each file's statistics are its own rows'
            file = target / "public" / "big" / a["path"]
            rows = pq.read_table(file)
            assert a["num_records"] == rows.num_rows and a["size_bytes"] == file.stat().st_size
            assert (a["min.id"], a["max.id"]) == (pc.min(rows["id"]).as_py(), pc.max(rows["id"]).as_py())
            assert a["null_count.t"] == rows["t"].null_count and a["min.note"] == pc.min(rows["note"]).as_py()
        # timestamps' bounds are cut to the millisecond, as delta-rs and Spark write them: a reader that
        # skips files by them still finds the greatest (its microseconds past the bound)
        typed = DeltaTable(str(target / "public" / "typed"))
        stats = pa.table(typed.get_add_actions(flatten=True)).to_pylist()
        assert all(a["max.ts"] is not None and a["min.tsn"] is not None for a in stats), stats
        (newest, oldest_naive) = conn.execute("SELECT max(ts), min(tsn) FROM typed").fetchone()
        typed_frame = spark.read.format("delta").load(str(target / "public" / "typed"))
        assert typed_frame.where(typed_frame.ts >= newest).count() == 1
        assert typed_frame.where(typed_frame.tsn <= oldest_naive).count() == 1
        assert typed.to_pyarrow_table(filters=[("ts", ">=", newest)]).num_rows == 1
        frame = spark.read.format("delta").load(str(target / "public" / "big"))
        assert frame.where("id BETWEEN 12000 AND 12050").count() == 51
        (odd,) = conn.execute("SELECT count(*) FROM big WHERE t = 'ü€𝄞'").fetchone()
        assert frame.where("t = 'ü€𝄞'").count() == odd
