"""Issue 77's weak cases that touch a real server: each ends in a clear message, the right exit code and
a remedy that works, and a run that stops before its first commit leaves no slot behind."""

from __future__ import annotations

import pytest
from pgroles import role_with_password
from psycopg import sql

from applier.cli import main as cli_main

pytestmark = [pytest.mark.postgres, pytest.mark.spark]

PASSWORD = "weak-cases-pw"


def _slots(pg, name: str) -> int:
    with pg.connect() as conn:
        row = conn.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (name,)).fetchone()
    return int(row[0]) if row else 0


def test_a_role_that_cannot_read_a_published_table_is_told_so_and_leaves_no_slot(pg, tmp_path, capsys,
                                                                                  monkeypatch):
    """A role without SELECT on one published table: the first run exited 3 (a restart cures nothing) and
    left its slot behind; verify by that role exited 5 with a traceback."""
    with pg.connect() as conn:
        conn.execute("CREATE TABLE readable (id int PRIMARY KEY)")
        conn.execute("CREATE TABLE secret (id int PRIMARY KEY)")
        conn.execute("INSERT INTO readable VALUES (1)")
        conn.execute("INSERT INTO secret VALUES (1)")
        conn.execute("CREATE PUBLICATION wk FOR TABLE readable, secret")
    with role_with_password(pg, f"wk_{pg.name}", PASSWORD, replication=True) as role:
        with pg.connect() as conn:
            conn.execute(sql.SQL("GRANT SELECT ON readable TO {}").format(sql.Identifier(role)))
        try:
            monkeypatch.setenv("APPLIER_DSN", pg.cluster.dsn(pg.name, user=role, password=PASSWORD))
            target = tmp_path / "delta"
            code = cli_main(["mirror", "--publication", "wk", "--slot", "wk", "--target", str(target), "--once"])
            err = capsys.readouterr().err
            print(err)
            assert code == 2, err
            assert "public.secret" in err and "GRANT SELECT" in err and "Traceback" not in err, err
            assert _slots(pg, "wk") == 0 and not (target / "public" / "readable").exists()
            # verify by that role, of a target the owner mirrored: a clear stop, no traceback
            monkeypatch.setenv("APPLIER_DSN", pg.dsn)
            assert cli_main(["mirror", "--publication", "wk", "--slot", "wk", "--target", str(target), "--once"]) == 0
            monkeypatch.setenv("APPLIER_DSN", pg.cluster.dsn(pg.name, user=role, password=PASSWORD))
            capsys.readouterr()
            code = cli_main(["verify", "--target", str(target)])
            err = capsys.readouterr().err
            assert code == 2 and "Traceback" not in err and "table secret" in err and "GRANT SELECT" in err, (code,
                                                                                                           err)
        finally:
            with pg.connect() as conn:
                conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                             "WHERE slot_name = 'wk' AND NOT active")
                conn.execute(sql.SQL("REVOKE ALL ON readable FROM {}").format(sql.Identifier(role)))


def test_a_removed_table_directory_is_mended_by_the_resync_the_stop_names(pg, spark, tmp_path, capsys, monkeypatch):
    """Weak case: after a table's Delta directory is removed, mirror stops (the registry), and resync
    refused too: the only way out was editing state files by hand."""
    import shutil

    from applier.checks.verify import verify_against_postgres

    target = tmp_path / "delta"
    with pg.connect() as conn:
        conn.execute("CREATE TABLE gone (id int PRIMARY KEY, v int)")
        conn.execute("CREATE TABLE kept (id int PRIMARY KEY, v int)")
        conn.execute("INSERT INTO gone SELECT g, g FROM generate_series(1, 10) g")
        conn.execute("INSERT INTO kept SELECT g, g FROM generate_series(1, 10) g")
        conn.execute("CREATE PUBLICATION rm FOR TABLE gone, kept")
    cfg = tmp_path / "mirror.yaml"
    cfg.write_text(f"source:\n  dsn: '{pg.dsn}'\n  publication: rm\n  slot: rm\ntarget:\n  path: {target}\n")
    assert cli_main(["mirror", "--config", str(cfg), "--once"]) == 0
    shutil.rmtree(target / "public" / "gone")
    with pg.connect() as conn:
        conn.execute("UPDATE gone SET v = -v WHERE id = 1")
    capsys.readouterr()
    code = cli_main(["mirror", "--config", str(cfg), "--once"])
    err = capsys.readouterr().err
    assert code == 2 and "applier resync" in err, (code, err)
    assert cli_main(["resync", "--config", str(cfg), "--table", "public.gone"]) == 0, capsys.readouterr().err
    assert cli_main(["mirror", "--config", str(cfg), "--once"]) == 0, capsys.readouterr().err
    with pg.connect() as conn:
        results = verify_against_postgres(spark, conn, str(target), [("public", "gone"), ("public", "kept")])
    assert all(r.equal for r in results), results


def test_a_table_published_only_between_two_runs_is_marked_not_followed(pg, tmp_path, capsys):
    """Weak case: a table created in a ``TABLES IN SCHEMA`` schema and moved out before the next run got a Delta
    table from the stream's changes that looked followed (status listed it as any other) but was not."""
    target = tmp_path / "delta"
    with pg.connect() as conn:
        conn.execute("CREATE SCHEMA s; CREATE TABLE s.a (id int PRIMARY KEY); CREATE PUBLICATION tis FOR TABLES IN "
                     "SCHEMA s")
    cfg = tmp_path / "mirror.yaml"
    cfg.write_text(f"source:\n  dsn: '{pg.dsn}'\n  publication: tis\n  slot: tis\ntarget:\n  path: {target}\n")
    assert cli_main(["mirror", "--config", str(cfg), "--once"]) == 0
    with pg.connect() as conn:
        conn.execute("CREATE TABLE s.x (id int PRIMARY KEY, v int); INSERT INTO s.x VALUES (1, 1), (2, 2);"
                     "ALTER TABLE s.x SET SCHEMA public; INSERT INTO public.x VALUES (3, 3);"
                     "INSERT INTO s.a VALUES (1)")
    for _ in range(2):
        assert cli_main(["mirror", "--config", str(cfg), "--once"]) == 0
    capsys.readouterr()
    assert cli_main(["status", "--config", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "public.x: NOT FOLLOWED: not published since" in out, out
