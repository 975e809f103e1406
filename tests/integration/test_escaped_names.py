"""Schema and table names that need an escape in a directory name, mirrored from a real PostgreSQL
(issue 77, items 6 and 7): a table name holding a newline (delta-rs refuses control characters in any
path: every run stopped with exit 5), a schema ``..`` with a table ``..`` (its directory used to be
``%2E./%2E.``, which delta-rs decoded to ``T/../..``), a backslash (read as ``/`` in a local path), and
a schema ``_applier`` with a table ``cuts`` (``%5Fapplier/cuts``: applier's own cuts table to delta-rs).
Each is copied, followed, verified equal to Postgres, and opened by path with delta-rs, which must
find that very table. A target an earlier release wrote with URL escapes goes on where it is."""

from __future__ import annotations

import json

import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder
from named_tables import change_tables, create_tables

from applier.checks.verify import verify_against_postgres
from applier.cli import main as cli_main
from applier.config import MirrorConfig, SourceSettings, TargetSettings
from applier.drivers.mirror import mirror
from applier.sink import naming
from applier.sink.naming import mirrored_table_dirs, source_name_of, table_location

pytestmark = [pytest.mark.postgres, pytest.mark.spark]

FORGED = "x\n2026-12-07T00:00:00.000Z ERROR applier.fake: forged"
TABLES = [("public", FORGED), ("..", ".."), ("public", "a\\b"), ("_applier", "cuts"), ("public", "tab\there\x7f")]


def _assert_equal(spark, conn, target, tables) -> None:
    results = verify_against_postgres(spark, conn, str(target), tables)
    assert all(r.equal for r in results), [(r.source_name, r.only_in_source[:2], r.only_in_target[:2])
                                           for r in results]


def test_names_that_need_an_escape_are_mirrored_and_no_reader_is_sent_elsewhere(pg, spark, tmp_path, capsys):
    target = tmp_path / "delta"
    config = MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="esc", publication="esc_pub"),
                          target=TargetSettings(path=str(target)))
    with pg.connect() as conn:
        create_tables(conn, TABLES)
        conn.execute("CREATE PUBLICATION esc_pub FOR ALL TABLES")
        first = mirror(spark, config, once=True)
        assert first.snapshot_rows == {f"{s}.{t}": 5 for s, t in TABLES}
        change_tables(conn, TABLES)
        second = mirror(spark, config, once=True)
        assert second.transactions == 3 * len(TABLES)
        _assert_equal(spark, conn, target, TABLES)

    assert table_location(target, "..", "..") == str(target / "%u2E." / "%u2E.")
    assert table_location(target, "public", FORGED) == str(target / "public" / FORGED.replace("\n", "%u0A"))
    assert sorted(source_name_of(d) for d in mirrored_table_dirs(target)) == sorted(TABLES)
    for schema, table in TABLES:  # delta-rs, given each directory, reads that table's log and rows
        path = table_location(target, schema, table)
        assert "\\" not in path and "\n" not in path
        opened = DeltaTable(path)
        assert opened.metadata().configuration["applier.source"] == f"{schema}.{table}"
        assert sorted(opened.to_pyarrow_table().column("id").to_pylist()) == [1, 3, 4, 5, 6]
        queried = QueryBuilder().register("t", DeltaTable(path)).execute("SELECT id FROM t").read_all()
        assert sorted(pa.table(queried).column("id").to_pylist()) == [1, 3, 4, 5, 6]
    with pytest.raises(FileNotFoundError):  # Polars escapes the '%' again (README's table of readers)
        pl.read_delta(table_location(target, "..", ".."))
    assert DeltaTable(str(target / "_applier" / "cuts")).metadata().configuration.get("applier.source") is None

    capsys.readouterr()
    assert cli_main(["verify", "--dsn", pg.dsn, "--target", str(target)]) == 0, capsys.readouterr()
    capsys.readouterr()
    assert cli_main(["status", "--target", str(target), "--json"]) == 0, capsys.readouterr()
    assert {t["table"] for t in json.loads(capsys.readouterr().out)["tables"]} == {f"{s}.{t}" for s, t in TABLES}


def test_a_target_an_earlier_release_wrote_goes_on_where_its_tables_are(pg, spark, tmp_path, monkeypatch, capsys):
    """The first run escapes names as releases before the ``%u`` escape did (``%2E.``, ``%5Fapplier``,
    ``100%25``); the runs after it find those tables there, write no second copy, and verify equal."""
    old = [("..", ".."), ("_applier", "spill"), ("public", "100%"), ("public", "a/b")]
    target = tmp_path / "delta"
    config = MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="old", publication="old_pub"),
                          target=TargetSettings(path=str(target)))
    with pg.connect() as conn:
        create_tables(conn, old)
        conn.execute("CREATE PUBLICATION old_pub FOR ALL TABLES")
        with monkeypatch.context() as patch:
            patch.setattr(naming, "_path_component", naming._legacy_path_component)
            mirror(spark, config, once=True)
        written = sorted(f"{d.parent.name}/{d.name}" for d in mirrored_table_dirs(target))
        assert written == ["%2E./%2E.", "%5Fapplier/spill", "public/100%25", "public/a%2Fb"]
        change_tables(conn, old)
        again = mirror(spark, config, once=True)
        assert again.snapshot_rows == {} and again.transactions == 3 * len(old)
        assert sorted(f"{d.parent.name}/{d.name}" for d in mirrored_table_dirs(target)) == written
        _assert_equal(spark, conn, target, old)
    capsys.readouterr()
    assert cli_main(["verify", "--dsn", pg.dsn, "--target", str(target)]) == 0, capsys.readouterr()
    capsys.readouterr()
    assert cli_main(["status", "--target", str(target), "--json"]) == 0, capsys.readouterr()
    assert {t["table"] for t in json.loads(capsys.readouterr().out)["tables"]} == {f"{s}.{t}" for s, t in old}


def test_a_mirror_an_earlier_release_stopped_on_a_newline_goes_on(pg, spark, tmp_path, monkeypatch, capsys):
    """An earlier release bound the table to its path with the newline in it, then stopped there on every
    run (delta-rs: "illegal character sequence", exit 5). The next run copies and follows the table at
    that bound path (through Spark: delta-rs is not given a path it refuses) and verifies equal."""
    import applier.sink.store.deltars as deltars

    target = tmp_path / "delta"
    config = MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="nl", publication="nl_pub"),
                          target=TargetSettings(path=str(target)))
    tables = [("public", "a\nb"), ("public", "plain")]
    with pg.connect() as conn:
        create_tables(conn, tables)
        conn.execute("CREATE PUBLICATION nl_pub FOR ALL TABLES")
        with monkeypatch.context() as patch:
            patch.setattr(naming, "_path_component", naming._legacy_path_component)
            patch.setattr(deltars, "_NOT_IN_LOCAL_PATHS", frozenset("%[]^|\\"))
            with pytest.raises(Exception, match="illegal character sequence"):
                mirror(spark, config, once=True)
        change_tables(conn, tables)
        mirror(spark, config, once=True)
        assert (target / "public" / "a\nb" / "_delta_log").is_dir()  # where the binding says
        _assert_equal(spark, conn, target, tables)
    capsys.readouterr()
    assert cli_main(["verify", "--dsn", pg.dsn, "--target", str(target)]) == 0, capsys.readouterr()
    capsys.readouterr()
    assert cli_main(["status", "--target", str(target), "--json"]) == 0, capsys.readouterr()
    assert {t["table"] for t in json.loads(capsys.readouterr().out)["tables"]} == {"public.a\nb", "public.plain"}
