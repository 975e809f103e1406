"""Mirrored tables are open Delta tables: delta-rs (``deltalake``) reads every table of a replay and of a
mirror and finds exactly Postgres's rows; type widening, the one feature delta-rs cannot read, is
enabled only on a table whose source column was actually widened, and ``applier status`` says so
without starting a JVM; a rule's table options (change data feed, partitioning, liquid clustering,
free properties) are set when a table is created and an existing table's mismatch is reported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from applier.checks.verify import compare, postgres_table_rows, verify_against_postgres
from applier.config import (
    ApplySettings,
    MirrorConfig,
    ReplayConfig,
    SourceSettings,
    TableRule,
    TablesSettings,
    TargetSettings,
)
from applier.devtools.sample import create_schema, run_workload
from applier.drivers.mirror import mirror
from applier.drivers.replay import replay_log
from applier.sources.rawlog_writer import write_raw_log
from applier.sources.sql_slot import create_slot, peek, pgoutput_options

pytestmark = [pytest.mark.postgres, pytest.mark.spark]

deltalake = pytest.importorskip("deltalake")

REPO = Path(__file__).resolve().parents[2]

# Types that reach Delta as every Spark type family the mirror writes, and a column name that needs
# Delta column mapping (which delta-rs reads).
TYPED = """
CREATE SCHEMA lake;
CREATE TABLE lake.typed (id int PRIMARY KEY, "a b" text, n numeric(12, 2), big numeric, f float8, r real,
                         ts timestamptz, lt timestamp, d date, bin bytea, arr int[], flag boolean, w int);
CREATE PUBLICATION pub FOR TABLES IN SCHEMA lake;
"""
TYPED_ROWS = """
INSERT INTO lake.typed SELECT g, 'row ' || g, g * 1.25, g::numeric ^ 30, g / 3.0, g / 7.0,
    '2026-01-01 00:00+00'::timestamptz + g * interval '1 hour', '2026-01-01'::timestamp + g * interval '1 minute',
    DATE '2026-01-01' + g, decode(lpad(to_hex(g), 4, '0'), 'hex'), ARRAY[g, NULL, g + 1], g % 2 = 0, g
    FROM generate_series(1, 40) g;
"""


def delta_rs_rows(path: str, columns: list[str]) -> list[tuple[Any, ...]]:
    """The table's rows as delta-rs reads them: its pyarrow path, or for a column-mapped table or one with
    deletion vectors (which that path refuses) its DataFusion engine."""
    import pyarrow as pa

    table = deltalake.DeltaTable(path)
    features = table.protocol().reader_features or []
    if "columnMapping" in features or "deletionVectors" in features:
        feature = "columnMapping" if "columnMapping" in features else "deletionVectors"
        with pytest.raises(Exception, match=feature):  # loudly, never NULLs for every column, nor deleted rows
            table.to_pyarrow_table()
        select = ", ".join('"' + c.replace('"', '""') + '"' for c in columns)
        rows = pa.table(deltalake.QueryBuilder().register("t", table).execute(f"SELECT {select} FROM t").read_all())
    else:
        rows = table.to_pyarrow_table(columns=columns)
    return [tuple(row[c] for c in columns) for row in rows.to_pylist()]


def assert_delta_rs_equals_postgres(conn, path: Path, namespace: str, table: str) -> int:
    names, pg_rows = postgres_table_rows(conn, namespace, table)
    result = compare(f"{namespace}.{table}", pg_rows, iter(delta_rs_rows(str(path), names)))
    assert result.equal, (result.source_name, result.only_in_source[:3], result.only_in_target[:3])
    return result.source_rows


def reader_features(path: Path) -> list[str]:
    return sorted(deltalake.DeltaTable(str(path)).protocol().reader_features or [])


def status_without_java(*args: str) -> dict[str, Any]:
    """`applier status --json` with no `java` reachable: it must read the Delta logs without a JVM."""
    env = {k: v for k, v in os.environ.items() if k not in ("JAVA_HOME", "SPARK_HOME")}
    env["PATH"] = "/nonexistent"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-m", "applier.cli", "status", "--json", *args], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def capture(conn, slot: str, options: dict[str, str], path: Path) -> Path:
    write_raw_log(path, ((m.lsn, m.xid, m.data) for m in peek(conn, slot, options)))
    return path


# on the driver only: the tables are the same whichever path folded them (the random workloads compare both)
def test_replayed_tables_are_read_by_delta_rs_and_only_a_widened_table_needs_type_widening(pg, spark, tmp_path):
    with pg.connect() as conn:
        create_schema(conn, "shop_pub")
        conn.execute(TYPED)
        create_slot(conn, "s")
        run_workload(conn, transactions=30, seed=3)
        conn.execute(TYPED_ROWS)
        conn.execute("UPDATE lake.typed SET \"a b\" = 'changed', arr = NULL WHERE id <= 5;"
                     "DELETE FROM lake.typed WHERE id = 40")
        raw_shop = capture(conn, "s", pgoutput_options("shop_pub"), tmp_path / "shop.parquet")
        raw_lake = capture(conn, "s", pgoutput_options("pub"), tmp_path / "lake.parquet")
        target = tmp_path / "delta"
        for raw in (raw_shop, raw_lake):
            replay_log(spark, ReplayConfig(source_log=str(raw), target=TargetSettings(path=str(target))))
        tables = [("shop", "customers"), ("shop", "products"), ("shop", "orders"), ("shop", "events"),
                  ("lake", "typed")]
        for namespace, name in tables:
            path = target / namespace / name
            # the lowest protocol: a TIMESTAMP column needs 'timestampNtz' (which makes column mapping a
            # named feature too); delta-rs reads both
            assert "typeWidening" not in reader_features(path), (name, reader_features(path))
            assert assert_delta_rs_equals_postgres(conn, path, namespace, name) > 0 or name == "events"
        mapping = deltalake.DeltaTable(str(target / "lake" / "typed")).metadata().configuration
        assert mapping.get("delta.columnMapping.mode") == "name"  # "a b" needs it
        assert "columnMapping" in reader_features(target / "lake" / "typed")
        assert "columnMapping" not in reader_features(target / "shop" / "orders")

        # A widening in the source: only now does the table gain type widening (and say so): this table is
        # column-mapped ("a b"), so it is widened in place (apply.type_widening rewrites a table that is not:
        # test_every_reader.py)
        conn.execute("ALTER TABLE lake.typed ALTER COLUMN w TYPE bigint;"
                     "UPDATE lake.typed SET w = 5000000000 + id WHERE id <= 3")
        raw_lake = capture(conn, "s", pgoutput_options("pub"), tmp_path / "lake2.parquet")
        replay_log(spark, ReplayConfig(source_log=str(raw_lake), target=TargetSettings(path=str(target))))
        typed = target / "lake" / "typed"
        assert "typeWidening" in reader_features(typed)
        with pytest.raises(Exception, match="typeWidening"):
            deltalake.DeltaTable(str(typed)).to_pyarrow_table()
        assert "typeWidening" not in reader_features(target / "shop" / "orders")
        got = spark.read.format("delta").load(str(typed)).where("id <= 3").select("w").collect()
        assert sorted(r[0] for r in got) == [5000000001, 5000000002, 5000000003]

        status = {t["table"]: t for t in status_without_java("--target", str(target))["tables"]}
        assert status["lake.typed"]["widened_columns"] == ["w"]
        assert "typeWidening" in status["lake.typed"]["reader_features"]
        assert status["shop.orders"]["widened_columns"] == []
        assert "typeWidening" not in status["shop.orders"]["reader_features"]
        (pg_rows,) = conn.execute("SELECT count(*) FROM lake.typed").fetchone()
        assert status["lake.typed"]["rows"] == pg_rows
        assert status["lake.typed"]["applied_lsn"] is not None


def test_mirrored_tables_are_read_by_delta_rs(pg, spark, tmp_path):
    with pg.connect() as conn:
        conn.execute(TYPED)
        conn.execute(TYPED_ROWS)  # copied by the snapshot
        target = tmp_path / "delta"
        # the snapshot's overwrite and the stream's MERGEs keep a rule's partitioning
        rules = TablesSettings(rules=[TableRule(match="lake.typed", partition_by=["flag"], change_data_feed=True)])
        cfg = MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="m", publication="pub"),
                           target=TargetSettings(path=str(target)), tables=rules,
                           apply=ApplySettings(max_group_seconds=1.0))
        mirror(spark, cfg, once=True)
        conn.execute("UPDATE lake.typed SET n = n + 1, ts = NULL WHERE id % 3 = 0;"
                     "DELETE FROM lake.typed WHERE id > 35;"
                     "INSERT INTO lake.typed (id, \"a b\", arr) VALUES (100, 'late', '{}')")
        mirror(spark, cfg, once=True)  # then the stream
        path = target / "lake" / "typed"
        assert "typeWidening" not in reader_features(path)
        assert deltalake.DeltaTable(str(path)).metadata().partition_columns == ["flag"]
        assert assert_delta_rs_equals_postgres(conn, path, "lake", "typed") == 36


def test_rule_table_options_are_set_at_creation_and_a_mismatch_is_reported(pg, spark, tmp_path, caplog):
    with pg.connect() as conn:
        create_schema(conn, "shop_pub")
        create_slot(conn, "s")
        run_workload(conn, transactions=20, seed=5)
        raw = capture(conn, "s", pgoutput_options("shop_pub"), tmp_path / "raw.parquet")
        target = tmp_path / "delta"
        rules = [TableRule(match="shop.orders", change_data_feed=True, partition_by=["status"],
                           table_properties={"delta.logRetentionDuration": "interval 60 days"}),
                 TableRule(match="shop.customers", cluster_by=["id"]),
                 TableRule(match="shop.products", type_widening=True)]
        cfg = ReplayConfig(source_log=str(raw), target=TargetSettings(path=str(target)),
                           tables=TablesSettings(rules=rules))
        replay_log(spark, cfg)

        def detail(name: str) -> Any:
            return spark.sql(f"DESCRIBE DETAIL delta.`{target / 'shop' / name}`").collect()[0]

        orders = detail("orders")
        assert orders["partitionColumns"] == ["status"]
        assert orders["properties"]["delta.enableChangeDataFeed"] == "true"
        assert orders["properties"]["delta.logRetentionDuration"] == "interval 60 days"
        assert "changeDataFeed" in orders["tableFeatures"]
        assert detail("customers")["clusteringColumns"] == ["id"]
        assert "clustering" in detail("customers")["tableFeatures"]
        assert detail("products")["properties"]["delta.enableTypeWidening"] == "true"
        assert detail("events")["partitionColumns"] == [] and "delta.enableChangeDataFeed" not in detail("events")[
            "properties"]
        # The change feed holds the replayed changes; delta-rs still reads CDF and clustered tables.
        changes = spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", 0).load(
            str(target / "shop" / "orders"))
        assert changes.where("_change_type = 'insert'").count() > 0
        for name in ("orders", "customers"):
            assert assert_delta_rs_equals_postgres(conn, target / "shop" / name, "shop", name) > 0
        assert "typeWidening" in reader_features(target / "shop" / "products")  # opted in: delta-rs loses it

        # Options apply only at creation: a changed rule leaves the table alone and says so.
        changed = [TableRule(match="shop.orders", partition_by=["sku"]),
                   TableRule(match="shop.customers", cluster_by=["name"])]
        conn.execute("UPDATE shop.orders SET qty = qty + 1 WHERE id <= 3;"
                     "UPDATE shop.customers SET name = name || '!' WHERE id <= 2")
        raw2 = capture(conn, "s", pgoutput_options("shop_pub"), tmp_path / "raw2.parquet")
        caplog.set_level("WARNING", logger="applier.sink.schema")
        replay_log(spark, ReplayConfig(source_log=str(raw2), target=TargetSettings(path=str(target)),
                                       tables=TablesSettings(rules=changed)))
        warnings = " ".join(r.getMessage() for r in caplog.records)
        assert "shop.orders: the existing Delta table differs" in warnings and "partition_by ['sku']" in warnings
        assert "cluster_by ['name']" in warnings
        assert detail("orders")["partitionColumns"] == ["status"]
        assert detail("customers")["clusteringColumns"] == ["id"]
        for name in ("orders", "customers"):
            assert assert_delta_rs_equals_postgres(conn, target / "shop" / name, "shop", name) > 0
        # `applier status --config` shows the same differences (read with delta-rs, no JVM).
        from applier.checks.status import table_status
        from applier.sink.schema import table_options

        orders_status = table_status(target / "shop" / "orders", expected_options=table_options(changed[0]))
        assert orders_status.option_mismatches == ("partition_by ['sku'] configured, table has ['status']",)
        clustered = table_status(target / "shop" / "orders",
                                 expected_options=table_options(TableRule(match="*", cluster_by=["id"])))
        assert clustered.option_mismatches == ("cluster_by ['id'] configured, table is not clustered",)
        same = table_status(target / "shop" / "orders", expected_options=table_options(rules[0]))
        assert same.option_mismatches == ()


def test_table_options_are_validated():
    with pytest.raises(ValueError, match="cannot be combined"):
        TableRule(match="*", partition_by=["a"], cluster_by=["b"])
    with pytest.raises(ValueError, match="applier's own properties"):
        TableRule(match="*", table_properties={"applier.source": "x"})


MIXED = """
CREATE SCHEMA "Mixed Case";
CREATE TABLE "Mixed Case"."Weird col" (id int PRIMARY KEY, "Weird col" text, "n (units)" numeric(8, 2), flag boolean);
CREATE PUBLICATION pub FOR TABLES IN SCHEMA "Mixed Case";
INSERT INTO "Mixed Case"."Weird col" SELECT g, 'value ' || g, g * 1.5, g % 2 = 0 FROM generate_series(1, 20) g;
"""


def pyarrow_read(path: Path, conn) -> str:
    """What ``DeltaTable(path).to_pyarrow_table()`` (pandas' and Polars' way in) does with the table:
    'refused' with an error, or 'equal' to Postgres; anything else (a table of NULLs) fails the test."""
    names, pg_rows = postgres_table_rows(conn, "Mixed Case", "Weird col")
    try:
        table = deltalake.DeltaTable(str(path)).to_pyarrow_table()
    except Exception as e:  # noqa: BLE001 - which error it is is the point of the assertion
        assert "columnMapping" in str(e), e
        return "refused"
    got = [tuple(row[c] for c in names) for row in table.to_pylist()]
    result = compare("Mixed Case.Weird col", pg_rows, iter(got))
    assert result.equal, ("to_pyarrow_table read other values than Postgres has", result.only_in_target[:3])
    return "equal"


def protocol_commits(path: Path) -> int:
    return sum(1 for h in deltalake.DeltaTable(str(path)).history() if h.get("operation") == "SET TBLPROPERTIES")


def test_a_column_mapped_table_is_read_by_delta_rs_or_refused_and_an_old_reader_2_table_is_upgraded_once(
        pg, spark, tmp_path, monkeypatch, caplog):
    import applier.sink.schema as schema
    from applier.sink.spec import COLUMN_MAPPING_MODE

    with pg.connect() as conn:
        conn.execute(MIXED)
        target = tmp_path / "delta"
        cfg = MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="m", publication="pub"),
                           target=TargetSettings(path=str(target)), apply=ApplySettings(max_group_seconds=1.0))
        path = target / "Mixed Case" / "Weird col"

        # What an earlier applier made of it (only delta.columnMapping.mode): Delta's legacy reader
        # version 2, which delta-rs 1.6's pyarrow path reads as NULL in every column, without an error.
        monkeypatch.setattr(schema, "COLUMN_MAPPING", {COLUMN_MAPPING_MODE: "name"})
        mirror(spark, cfg, once=True)
        monkeypatch.undo()
        protocol = deltalake.DeltaTable(str(path)).protocol()
        assert (protocol.min_reader_version, protocol.reader_features) == (2, None)
        nulls = deltalake.DeltaTable(str(path)).to_pyarrow_table().to_pylist()
        assert len(nulls) == 20 and all(v is None for row in nulls for v in row.values())  # the bug being fixed
        before = protocol_commits(path)

        # The next run upgrades it with one protocol commit and says so; delta-rs then refuses it loudly
        # through pyarrow and reads the right values through its DataFusion engine.
        conn.execute('UPDATE "Mixed Case"."Weird col" SET "Weird col" = \'changed\' WHERE id <= 3;'
                     'DELETE FROM "Mixed Case"."Weird col" WHERE id = 20;'
                     'INSERT INTO "Mixed Case"."Weird col" VALUES (21, \'late\', 0.25, true)')
        caplog.set_level("WARNING", logger="applier.sink.schema")
        mirror(spark, cfg, once=True)
        assert "upgrading the Delta table's column mapping from reader version 2" in caplog.text
        protocol = deltalake.DeltaTable(str(path)).protocol()
        assert protocol.min_reader_version == 3 and "columnMapping" in (protocol.reader_features or [])
        assert protocol_commits(path) == before + 1
        assert pyarrow_read(path, conn) == "refused"
        assert assert_delta_rs_equals_postgres(conn, path, "Mixed Case", "Weird col") == 20

        # Exactly once: later runs leave the protocol alone.
        caplog.clear()
        conn.execute('UPDATE "Mixed Case"."Weird col" SET flag = NOT flag WHERE id > 15')
        mirror(spark, cfg, once=True)
        assert "upgrading" not in caplog.text
        assert protocol_commits(path) == before + 1
        assert assert_delta_rs_equals_postgres(conn, path, "Mixed Case", "Weird col") == 20

        # A new mirror creates such a table at 3/7 with the reader feature from the start (no
        # timestamp column here, which would have given it a named reader feature anyway).
        fresh = tmp_path / "fresh"
        mirror(spark, MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="m2", publication="pub"),
                                   target=TargetSettings(path=str(fresh)), apply=ApplySettings(max_group_seconds=1.0)),
               once=True)
        fresh_path = fresh / "Mixed Case" / "Weird col"
        assert reader_features(fresh_path) == ["columnMapping", "timestampNtz"]
        assert protocol_commits(fresh_path) == 0
        assert pyarrow_read(fresh_path, conn) == "refused"
        assert assert_delta_rs_equals_postgres(conn, fresh_path, "Mixed Case", "Weird col") == 20


@pytest.mark.parametrize("name", ["plain", "per%cent"])  # '%': delta-rs cannot open it, Spark reads the protocol
def test_enable_column_mapping_gives_the_reader_feature_once_and_a_renamed_column_keeps_its_values(spark, tmp_path,
                                                                                                  name):
    from applier.sink.store.sparkddl import column_mapping_state, enable_column_mapping

    path = str(tmp_path / name)
    spark.sql(f"CREATE TABLE delta.`{path}` (id int, c string) USING delta")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 'x'), (2, 'y')")
    assert column_mapping_state(spark, path).mode == "none"
    assert enable_column_mapping(spark, path) is True
    state = column_mapping_state(spark, path)
    assert (state.mode, state.min_reader_version) == ("name", 3) and "columnMapping" in state.reader_features
    versions = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").count()
    assert enable_column_mapping(spark, path) is False  # idempotent: no second commit
    assert spark.sql(f"DESCRIBE HISTORY delta.`{path}`").count() == versions
    spark.sql(f"ALTER TABLE delta.`{path}` RENAME COLUMN c TO `d e`")  # what column mapping is for
    assert sorted(tuple(r) for r in spark.read.format("delta").load(path).collect()) == [(1, "x"), (2, "y")]
    if "%" not in name:
        import pyarrow as pa

        table = deltalake.DeltaTable(path)
        with pytest.raises(Exception, match="columnMapping"):
            table.to_pyarrow_table()
        got = pa.table(deltalake.QueryBuilder().register("t", table).execute('SELECT id, "d e" FROM t').read_all())
        assert sorted(tuple(r.values()) for r in got.to_pylist()) == [(1, "x"), (2, "y")]


DV_TABLE = """
CREATE SCHEMA dv;
CREATE TABLE dv.acc (id int PRIMARY KEY, n int NOT NULL, note text);
INSERT INTO dv.acc SELECT g, g, 'row ' || g FROM generate_series(1, 3000) g;
UPDATE dv.acc SET note = (SELECT string_agg(md5(g::text), '') FROM generate_series(1, 3000) g) WHERE id = 1;
CREATE PUBLICATION dv_pub FOR TABLES IN SCHEMA dv;
"""


def test_a_table_with_deletion_vectors_is_merged_without_a_rewrite_and_read_by_every_reader(pg, spark, tmp_path):
    """``delta.enableDeletionVectors`` in a rule's properties: the copy and the stream's keyed MERGEs are
    written without Spark, marking rows instead of rewriting the copy's file (applier.sink.store.dvmerge);
    what that writer leaves to Spark (an unchanged TOAST value read from the target, a TRUNCATE) is Spark's
    MERGE into the same table. After each run Spark, delta-rs's DataFusion, Polars and ``applier status``
    find exactly Postgres's rows."""
    import polars as pl

    with pg.connect() as conn:
        conn.execute(DV_TABLE)
        target = tmp_path / "delta"
        rules = TablesSettings(rules=[TableRule(match="dv.*",
                                                table_properties={"delta.enableDeletionVectors": "true"})])
        cfg = MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="dv", publication="dv_pub"),
                           target=TargetSettings(path=str(target)), tables=rules,
                           apply=ApplySettings(max_group_seconds=1.0))
        path = target / "dv" / "acc"

        def check(*, every_reader: bool = False) -> None:
            assert assert_delta_rs_equals_postgres(conn, path, "dv", "acc") == conn.execute(
                "SELECT count(*) FROM dv.acc").fetchone()[0]
            names, source = postgres_table_rows(conn, "dv", "acc")
            pg_rows = list(source)
            assert sorted(pl.read_delta(str(path)).select(names).iter_rows()) == sorted(pg_rows)
            if every_reader:
                spark_rows = [tuple(r) for r in spark.read.format("delta").load(str(path)).select(*names).collect()]
                assert compare("dv.acc", iter(pg_rows), iter(spark_rows)).equal
                status = {t["table"]: t for t in status_without_java("--target", str(target))["tables"]}
                assert status["dv.acc"]["rows"] == len(pg_rows)
                # verify reads it through delta-rs's DataFusion scan, which applies the vectors: no Spark
                verified = verify_against_postgres(None, conn, str(target), [("dv", "acc")])
                assert [(r.equal, r.target_rows) for r in verified] == [(True, len(pg_rows))], verified

        def commits_since(version: int) -> list[dict[str, Any]]:
            return [json.loads(line) for f in sorted((path / "_delta_log").glob("*.json"))
                    if int(f.stem) > version for line in f.read_text().splitlines() if line.strip()]

        mirror(spark, cfg, once=True)  # the copy
        assert "deletionVectors" in reader_features(path)
        copied = [f.name for f in path.glob("*.parquet")]
        check()
        version = deltalake.DeltaTable(str(path)).version()
        conn.execute("UPDATE dv.acc SET n = n + 1 WHERE id % 7 = 0;"
                     "DELETE FROM dv.acc WHERE id % 11 = 0;"
                     "UPDATE dv.acc SET id = id + 10000 WHERE id = 5;"
                     "INSERT INTO dv.acc SELECT g, g, 'new' FROM generate_series(3001, 3100) g")
        mirror(spark, cfg, once=True)
        actions = commits_since(version)
        assert any(a.get("commitInfo", {}).get("engineInfo") == "applier (deletion vectors)" for a in actions)
        assert not [a for a in actions if "remove" in a and a["remove"]["path"] in copied and not any(
            "add" in b and b["add"]["path"] == a["remove"]["path"] for b in actions)], "the copy's file was rewritten"
        check(every_reader=True)
        conn.execute("UPDATE dv.acc SET n = -1 WHERE id = 1")  # its note is unchanged TOAST: read from the table
        mirror(spark, cfg, once=True)
        check()
        conn.execute("TRUNCATE dv.acc; INSERT INTO dv.acc SELECT g, g, 'again' FROM generate_series(1, 50) g;")
        conn.execute("UPDATE dv.acc SET n = 0 WHERE id <= 10; DELETE FROM dv.acc WHERE id > 45")
        mirror(spark, cfg, once=True)
        check(every_reader=True)
