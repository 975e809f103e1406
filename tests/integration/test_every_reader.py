"""Every kind of table applier writes, opened by every reader people use, finds Postgres's rows (issue 50
item 4): Spark, delta-rs's DataFusion engine (``QueryBuilder``), delta-rs's pyarrow path
(``to_pyarrow_table``), pandas (``to_pandas``) and Polars (``read_delta``), on a plain table, a table
with a renamed column, a table whose names need Delta column mapping, a history table, a change feed
table and a table with metadata columns and soft deletes. A column rename rewrites the table under the
new name (``apply.column_renames``), so every reader keeps it; a rewrite is made exactly once across a
crash right after it; a table above ``rename_rewrite_max_mb`` is column-mapped instead (and only
Spark and ``QueryBuilder`` read it, the others refuse it loudly). A type widened in Postgres rewrites the
table with the wider type (``apply.type_widening``), once across a crash too: no Delta type widening,
which no delta-rs reader opens."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from readers import Rows, assert_equals_postgres, polars_rows, query_builder_rows, readers, spark_rows

from applier.config import ApplySettings, MirrorConfig, SourceSettings, TableRule, TablesSettings, TargetSettings
from applier.drivers.mirror import mirror
from applier.sink.idempotence import applied_version
from applier.sink.spec import app_id_for

pytestmark = [pytest.mark.postgres, pytest.mark.spark]

deltalake = pytest.importorskip("deltalake")
pl = pytest.importorskip("polars")

REPO = Path(__file__).resolve().parents[2]

SCHEMA = """
CREATE SCHEMA rd;
CREATE TABLE rd.plain (id int PRIMARY KEY, name text, amount numeric(12, 2), at timestamptz, day date, flag boolean);
CREATE TABLE rd.renamed (id int PRIMARY KEY, old_name text, qty int, note text);
CREATE TABLE rd."with space" (id int PRIMARY KEY, "Weird col" text, "n (units)" numeric(8, 2));
CREATE TABLE rd.meta (id int PRIMARY KEY, v text, n bigint);
CREATE TABLE rd.widened (id int PRIMARY KEY, n int, r real, note text);
CREATE PUBLICATION rd_pub FOR TABLES IN SCHEMA rd;
INSERT INTO rd.plain SELECT g, 'p' || g, g * 1.25, '2026-01-01 00:00+00'::timestamptz + g * interval '1 hour',
    DATE '2026-01-01' + g, g % 2 = 0 FROM generate_series(1, 30) g;
INSERT INTO rd.renamed SELECT g, 'r' || g, g, CASE WHEN g % 3 = 0 THEN NULL ELSE 'n' || g END
    FROM generate_series(1, 30) g;
INSERT INTO rd."with space" SELECT g, 'w' || g, g * 0.5 FROM generate_series(1, 20) g;
INSERT INTO rd.meta SELECT g, 'm' || g, g::bigint * 1000000000 FROM generate_series(1, 20) g;
INSERT INTO rd.widened SELECT g, g * 1000, g / 4.0, 'w' || g FROM generate_series(1, 25) g;
"""
# after the initial copy: what the stream brings, a column rename among it
CHANGES = """
ALTER TABLE rd.plain ALTER COLUMN amount TYPE numeric(14, 2);
UPDATE rd.plain SET amount = amount + 1, at = NULL WHERE id % 4 = 0;
DELETE FROM rd.plain WHERE id > 27;
INSERT INTO rd.plain VALUES (100, 'late', 3.5, now(), NULL, NULL);
UPDATE rd.renamed SET qty = qty + 100 WHERE id <= 5;
ALTER TABLE rd.renamed RENAME COLUMN old_name TO new_name;
UPDATE rd.renamed SET new_name = 'after ' || id WHERE id BETWEEN 6 AND 8;
INSERT INTO rd.renamed VALUES (31, 'new', 31, NULL);
UPDATE rd."with space" SET "Weird col" = 'changed' WHERE id <= 3;
DELETE FROM rd.meta WHERE id > 17;
UPDATE rd.meta SET v = 'upd' WHERE id <= 2;
UPDATE rd.widened SET note = 'before' WHERE id <= 3;
ALTER TABLE rd.widened ALTER COLUMN n TYPE bigint, ALTER COLUMN r TYPE double precision;
UPDATE rd.widened SET n = 5000000000 + id, r = 0.1 WHERE id BETWEEN 4 AND 6;
INSERT INTO rd.widened VALUES (26, -9000000000, 1e300, 'wide');
"""

def fold_feed(rows: Rows, keys: list[str]) -> Rows:
    """A change feed folded as create_auto_cdc_flow folds it: the last change per key, deletes dropped."""
    last: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in sorted(rows, key=lambda r: (r["__commit_lsn"], r["__ordinal"])):
        last[tuple(row[k] for k in keys)] = row
    return [r for r in last.values() if r["__op"] != "D"]


def reader_features(path: Path) -> list[str]:
    return sorted(deltalake.DeltaTable(str(path)).protocol().reader_features or [])


def rules() -> TablesSettings:
    return TablesSettings(rules=[TableRule(match="rd.plain", history=True, changes=True),
                                 TableRule(match="rd.meta", metadata_columns=True, soft_delete=True)])


def test_every_reader_reads_every_kind_of_table_applier_writes(pg, spark, tmp_path):
    target = tmp_path / "delta"
    cfg = MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="rd", publication="rd_pub"),
                       target=TargetSettings(path=str(target)), tables=rules(),
                       apply=ApplySettings(max_group_seconds=1.0, column_renames="auto"))
    with pg.connect() as conn:
        conn.execute(SCHEMA)
        mirror(spark, cfg, once=True)  # the initial copy
        conn.execute(CHANGES)
        mirror(spark, cfg, once=True)  # the stream, with the rename

        # (table, Delta path, rows as Postgres would have them, needs column mapping)
        keep_live: Callable[[Rows], Rows] = lambda rows: [r for r in rows if not r["_applier_deleted"]]  # noqa: E731
        kinds: list[tuple[str, Path, Callable[[Rows], Rows], bool]] = [
            ("plain", target / "rd" / "plain", list, False),
            ("renamed", target / "rd" / "renamed", list, False),
            ("with space", target / "rd" / "with space", list, True),
            ("meta", target / "rd" / "meta", keep_live, False),
            ("widened", target / "rd" / "widened", list, False),
            ("plain", target / "_history" / "rd" / "plain", lambda rows: [r for r in rows if r["__end_lsn"] is None],
             False),
            ("plain", target / "_changes" / "rd" / "plain", lambda rows: fold_feed(rows, ["id"]), False),
        ]
        for table, path, as_postgres, mapped in kinds:
            assert ("columnMapping" in reader_features(path)) == mapped, (path, reader_features(path))
            assert "typeWidening" not in reader_features(path), path  # rd.plain's widening: its derived tables too
            for reader, read in readers(spark).items():
                what = f"{reader} on {path.relative_to(target)}"
                if mapped and reader in ("to_pyarrow_table", "to_pandas", "polars"):
                    with pytest.raises(Exception, match="columnMapping"):  # loudly, never NULLs
                        read(path)
                    continue
                assert assert_equals_postgres(conn, "rd", table, as_postgres(read(path)), what) > 0, what
        renamed = deltalake.DeltaTable(str(target / "rd" / "renamed"))
        assert [f.name for f in renamed.schema().fields] == ["id", "new_name", "qty", "note"]
        assert "delta.columnMapping.mode" not in renamed.metadata().configuration
        widened = deltalake.DeltaTable(str(target / "rd" / "widened"))
        assert reader_features(target / "rd" / "widened") == [], widened.protocol()
        assert [str(f.type) for f in widened.schema().fields][1:3] == ['PrimitiveType("long")',
                                                                      'PrimitiveType("double")']
        meta = pl.read_delta(str(target / "rd" / "meta"))
        assert meta.filter(pl.col("_applier_deleted")).height == 3  # soft-deleted rows are there, flagged
        assert meta["_applier_commit_lsn"].null_count() == 0


def rewrites(path: Path) -> int:
    return sum(1 for h in deltalake.DeltaTable(str(path)).history()
               if "table rewritten" in str(h.get("userMetadata") or ""))


def test_a_rename_rewrite_is_made_once_across_a_crash_and_a_large_table_is_column_mapped(pg, spark, tmp_path):
    source = {"slot": "rw", "publication": "rd_pub"}
    settings = {"source": source, "target": {"path": str(tmp_path / "rewrite")},
                "apply": {"max_group_seconds": 1.0, "column_renames": "rewrite"}}
    config = tmp_path / "rewrite.yaml"
    config.write_text(yaml.safe_dump(settings))
    rewrite_cfg = MirrorConfig.model_validate({**settings, "source": {**source, "dsn": pg.dsn}})
    # auto with a limit every table is above: column mapping
    mapped_source = {"slot": "mp", "publication": "rd_pub"}
    mapped_settings = {"source": mapped_source, "target": {"path": str(tmp_path / "mapped")},
                       "apply": {"max_group_seconds": 1.0, "column_renames": "auto", "rename_rewrite_max_mb": 0}}
    mapped_file = tmp_path / "mapped.yaml"
    mapped_file.write_text(yaml.safe_dump(mapped_settings))
    mapped_cfg = MirrorConfig.model_validate({**mapped_settings, "source": {**mapped_source, "dsn": pg.dsn}})
    rewritten, mapped = tmp_path / "rewrite" / "rd" / "renamed", tmp_path / "mapped" / "rd" / "renamed"
    with pg.connect() as conn:
        conn.execute(SCHEMA)
        mirror(spark, rewrite_cfg, once=True)
        mirror(spark, mapped_cfg, once=True)
        app_id = app_id_for("rd.renamed")
        copied = applied_version(None, str(rewritten), app_id)
        assert copied is not None
        conn.execute(CHANGES)

        # killed right after the rewrite's commit, before the group's MERGE
        env = {**os.environ, "APPLIER_DSN": pg.dsn, "PYTHONPATH": str(REPO), "APPLIER_CRASH_AT": "column_renamed:1"}
        done = subprocess.run([sys.executable, "-m", "applier.cli", "mirror", "--config", str(config), "--once"],
                              env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == -signal.SIGKILL, (done.returncode, done.stderr[-3000:])
        assert rewrites(rewritten) == 1
        table = deltalake.DeltaTable(str(rewritten))
        assert [f.name for f in table.schema().fields] == ["id", "new_name", "qty", "note"]
        assert applied_version(None, str(rewritten), app_id) == copied  # the rewrite kept the applied version
        assert sorted(r["new_name"] for r in table.to_pyarrow_table().to_pylist())[:2] == ["r1", "r10"]  # old rows

        # the other target killed right after a widening's rewrite, before the group's MERGE
        done = subprocess.run([sys.executable, "-m", "applier.cli", "mirror", "--config", str(mapped_file), "--once"],
                              env={**env, "APPLIER_CRASH_AT": "column_widened:1"}, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == -signal.SIGKILL, (done.returncode, done.stderr[-3000:])
        widened, plain = tmp_path / "mapped" / "rd" / "widened", tmp_path / "mapped" / "rd" / "plain"
        assert rewrites(plain) == 1  # the stream's first widening (rd.plain's amount), then killed

        mirror(spark, rewrite_cfg, once=True)  # the re-run: no second rewrite, the stream applied once
        mirror(spark, mapped_cfg, once=True)
        assert rewrites(plain) == 1 and rewrites(widened) == 1  # once each, across the crash
        assert reader_features(widened) == [] and "typeWidening" not in reader_features(plain)
        assert assert_equals_postgres(conn, "rd", "widened", polars_rows(widened), "polars, widened") == 26
        assert assert_equals_postgres(conn, "rd", "plain", polars_rows(plain), "polars, plain") > 0
        assert rewrites(rewritten) == 1
        assert (applied_version(None, str(rewritten), app_id) or 0) > copied
        assert "columnMapping" not in reader_features(rewritten)
        assert assert_equals_postgres(conn, "rd", "renamed", polars_rows(rewritten), "polars, rewritten") == 31

        # the large table's way: column mapping, read by Spark and QueryBuilder, refused by Polars
        assert "columnMapping" in reader_features(mapped)
        assert rewrites(mapped) == 0
        with pytest.raises(Exception, match="columnMapping"):
            polars_rows(mapped)
        assert assert_equals_postgres(conn, "rd", "renamed", query_builder_rows(mapped), "QueryBuilder, mapped") == 31
        assert assert_equals_postgres(conn, "rd", "renamed", spark_rows(spark)(mapped), "spark, mapped") == 31
