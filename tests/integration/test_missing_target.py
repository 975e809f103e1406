"""A mirrored table whose directory is gone, or that is no longer the Delta table earlier runs wrote
(another table id), stops the next run before it writes anything, with the way to re-copy it - not
exit 0 with a table recreated from later changes only (1 of 100 rows)."""

from __future__ import annotations

import json
import shutil

import pytest

from applier.cli import main as cli_main
from applier.sink.registry import delta_table_id

pytestmark = [pytest.mark.postgres, pytest.mark.spark]


def test_deleted_or_replaced_target_table_stops_the_mirror(pg, spark, tmp_path, capsys, monkeypatch):
    target = tmp_path / "delta"
    with pg.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("CREATE TABLE u (id int PRIMARY KEY)")
        conn.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 100) g")
        conn.execute("INSERT INTO u VALUES (1)")
        conn.execute("CREATE PUBLICATION pub FOR TABLE t, u")
    monkeypatch.setenv("APPLIER_DSN", pg.dsn)
    argv = ["mirror", "--publication", "pub", "--slot", "s", "--target", str(target), "--once"]
    assert cli_main(argv) == 0, capsys.readouterr().err
    table = target / "public" / "t"
    recorded = json.loads((target / "_applier" / "tables.json").read_text())
    assert recorded["public/t"] == {"table": "public.t", "id": delta_table_id(table)}  # relative to the target

    # Replaced by another Delta table (here: the mirror of u): a different table id.
    saved = tmp_path / "saved-t"
    shutil.move(table, saved)
    shutil.copytree(target / "public" / "u", table)
    with pg.connect() as conn:
        conn.execute("INSERT INTO t VALUES (101, 'new')")
    capsys.readouterr()
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert "table public.t is no longer the Delta table earlier runs wrote" in err, err
    assert "pg_drop_replication_slot" in err and "tables.json" in err, err

    # Gone: the same stop, nothing recreated from the one later change.
    shutil.rmtree(table)
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert "table public.t was written by an earlier run but its directory is gone" in err, err
    assert not table.exists()

    # The original table back in place: the mirror carries on and ends equal to Postgres.
    shutil.move(saved, table)
    assert cli_main(argv) == 0, capsys.readouterr().err
    assert spark.read.format("delta").load(str(table)).count() == 101
    assert cli_main(["verify", "--dsn", pg.dsn, "--target", str(target)]) == 0

    # The advice's per-table re-copy: directory and both entries gone, the next run copies t alone.
    shutil.rmtree(table)
    with pg.connect() as conn:
        conn.execute("INSERT INTO t VALUES (102, 'while gone')")
    for name in ("tables.json", "copied_tables.json"):
        path = target / "_applier" / name
        entries = json.loads(path.read_text())
        path.write_text(json.dumps({k: v for k, v in entries.items() if k not in ("public/t", "public.t")}))
    capsys.readouterr()
    assert cli_main(argv) == 0
    assert "table sync: public.t" in capsys.readouterr().err
    assert spark.read.format("delta").load(str(table)).count() == 102
    assert cli_main(["verify", "--dsn", pg.dsn, "--target", str(target)]) == 0
