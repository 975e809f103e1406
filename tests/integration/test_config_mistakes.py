"""Mistakes in a mirror's config that the server shows (issue 77): each ends in a clear message, the
documented exit code and a remedy that works, before any slot is made where it can be."""

from __future__ import annotations

import logging

import pytest

from applier.cli import main as cli_main
from applier.commands.exitcodes import ExitCode
from applier.config import MirrorConfig, SourceSettings, TablesSettings, TargetSettings
from applier.drivers.mirror import mirror

pytestmark = [pytest.mark.postgres, pytest.mark.spark]


def _slots(conn) -> list[str]:
    return [r[0] for r in conn.execute("SELECT slot_name::text FROM pg_replication_slots")]


def test_a_mixed_case_publication_hint_names_it_quoted_and_its_sql_works(pg, tmp_path, capsys):
    target = str(tmp_path / "delta")
    with pg.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        args = ["mirror", "--dsn", pg.dsn, "--slot", "s", "--target", target, "--once"]
        assert cli_main([*args, "--publication", "MyPub"]) == ExitCode.USAGE
        err = capsys.readouterr().err
        assert 'CREATE PUBLICATION "MyPub" ...' in err and """'"MyPub"'""" in err, err
        conn.execute('CREATE PUBLICATION "MyPub" FOR TABLE t')  # the printed SQL, as printed
        assert cli_main([*args, "--publication", "MyPub"]) == ExitCode.USAGE
        err = capsys.readouterr().err
        assert """"MyPub" does: to use it, write its name in double quotes""" in err, err
        assert _slots(conn) == []


def test_a_partition_column_the_table_lacks_is_exit_2_before_any_slot(pg, tmp_path, capsys):
    config = tmp_path / "m.yaml"
    config.write_text(f"source: {{dsn: '{pg.dsn}', slot: s, publication: pub}}\ntarget: {{path: delta}}\n"
                      "tables:\n  rules:\n    - {match: 'public.t', partition_by: [region]}\n")
    with pg.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, day date)")
        conn.execute("CREATE PUBLICATION pub FOR TABLE t")
        assert cli_main(["mirror", "--config", str(config), "--once"]) == ExitCode.USAGE
        err = capsys.readouterr().err
        assert "tables.rules.0 (match 'public.t'): partition_by names 'region'" in err, err
        assert "it has: id, day" in err and "fix the rule" in err, err
        assert _slots(conn) == []


def test_a_partition_column_a_table_joining_later_lacks_is_exit_2(pg, spark, tmp_path, capsys):
    config = tmp_path / "m.yaml"
    config.write_text(f"source: {{dsn: '{pg.dsn}', slot: s, publication: pub}}\ntarget: {{path: delta}}\n"
                      "tables:\n  rules:\n    - {match: 'public.late', partition_by: [region]}\n")
    with pg.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        conn.execute("CREATE TABLE late (id int PRIMARY KEY, day date)")
        conn.execute("CREATE PUBLICATION pub FOR TABLE t")
        assert cli_main(["mirror", "--config", str(config), "--once"]) == ExitCode.OK
        conn.execute("ALTER PUBLICATION pub ADD TABLE late")
        conn.execute("INSERT INTO late VALUES (1, now())")
        capsys.readouterr()
        assert cli_main(["mirror", "--config", str(config), "--once"]) == ExitCode.USAGE
        assert "tables.rules.0 (match 'public.late'): partition_by names 'region'" in capsys.readouterr().err
        assert _slots(conn) == ["s"]  # no copy's slot left behind


def test_an_include_glob_matching_nothing_is_warned_once(pg, spark, tmp_path, caplog):
    config = MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="s", publication="pub"),
                          target=TargetSettings(path=str(tmp_path / "delta")),
                          tables=TablesSettings(include=["public.t", "public.order"]))
    with pg.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY)")
        conn.execute("CREATE PUBLICATION pub FOR TABLE t, orders")
        with caplog.at_level(logging.WARNING):
            mirror(spark, config, once=True)
    warned = [r.getMessage() for r in caplog.records if "matches no table" in r.getMessage()]
    assert len(warned) == 1 and "'public.order'" in warned[0] and "public.orders" in warned[0], warned


def test_a_table_taken_out_of_the_publication_is_warned_once_per_run(pg, tmp_path, capsys):
    """The mirror says so once (not again in the next run), and ``applier resync --table`` of it once: it
    printed its line twice, as a warning and again as a progress line."""
    config = tmp_path / "m.yaml"
    config.write_text(f"source: {{dsn: '{pg.dsn}', slot: s, publication: pub}}\ntarget: {{path: delta}}\n")
    with pg.connect() as conn:
        conn.execute("CREATE TABLE gone (id int PRIMARY KEY)")
        conn.execute("CREATE TABLE other (id int PRIMARY KEY)")
        conn.execute("INSERT INTO gone VALUES (1)")
        conn.execute("CREATE PUBLICATION pub FOR TABLE gone, other")
        assert cli_main(["mirror", "--config", str(config), "--once"]) == ExitCode.OK
        conn.execute("ALTER PUBLICATION pub DROP TABLE gone")
        conn.execute("INSERT INTO other VALUES (1)")
        capsys.readouterr()
        for _ in range(2):
            assert cli_main(["mirror", "--config", str(config), "--once"]) == ExitCode.OK
        err = capsys.readouterr().err
        assert err.count("public.gone is no longer in publication pub") == 1, err
        assert cli_main(["resync", "--config", str(config), "--table", "public.gone"]) == ExitCode.OK
        err = capsys.readouterr().err
        assert err.count("public.gone (relation OID") == 1 and "is no longer published" in err, err
