"""A mirror nobody has to watch (issue 73, items 1 and 2): the reproductions of the seeded schema walks
(../shared/repro/t5/), each run through the CLI as a supervisor would, with the default config. Each
ended with a stop a person had to mend (exit 4 forever, or a printed remedy that never worked); now the
default (``apply.schema_changes: resync``) mends what it can prove (a relation dropped since is set
aside, its Delta table retired; a table that cannot follow is copied again at a new position), says
so in the log, the metrics and ``applier status``, and every table ends equal to Postgres. Under
``schema_changes: stop`` the run stops, and the remedy it prints works on the first try, by name and
by relation OID."""

from __future__ import annotations

import pytest

from applier.checks.verify import verify_against_postgres
from applier.cli import main as cli_main

pytestmark = [pytest.mark.postgres, pytest.mark.spark]


def _config(tmp_path, pg, slot: str, publication: str, extra: str = "") -> str:
    cfg = tmp_path / "mirror.yaml"
    cfg.write_text(f"source:\n  dsn: '{pg.dsn}'\n  publication: {publication}\n  slot: {slot}\n"
                   f"target:\n  path: {tmp_path / 'delta'}\n{extra}")
    return str(cfg)


def _run(cfg: str, capsys) -> tuple[int, str]:
    capsys.readouterr()
    code = cli_main(["mirror", "--config", cfg, "--once"])
    return code, capsys.readouterr().err


def _assert_equal(spark, pg, tmp_path, tables: list[tuple[str, str]]) -> None:
    with pg.connect() as conn:
        for r in verify_against_postgres(spark, conn, str(tmp_path / "delta"), tables):
            assert r.equal, (r.source_name, r.source_rows, r.target_rows, r.only_in_source[:3], r.only_in_target[:3])


REUSED_NAME = """
ALTER TABLE notes REPLICA IDENTITY FULL;
ALTER TABLE notes ADD COLUMN a timestamptz DEFAULT clock_timestamp();
BEGIN;
DELETE FROM notes WHERE id = 2;
DROP TABLE notes;
CREATE TABLE notes (id int PRIMARY KEY, v bool);
INSERT INTO notes VALUES (1, true);
COMMIT;
INSERT INTO other VALUES (2);
"""


def _reused_name_setup(pg, tmp_path, extra: str = "") -> tuple[str, int]:
    with pg.connect() as conn:
        conn.execute("CREATE TABLE notes (id int PRIMARY KEY, c int); INSERT INTO notes SELECT g, g FROM "
                     "generate_series(1, 5) g; CREATE TABLE other (id int PRIMARY KEY); INSERT INTO other VALUES (1);"
                     "CREATE PUBLICATION rn FOR ALL TABLES")
        old = conn.execute("SELECT 'notes'::regclass::oid::int8").fetchone()[0]
    cfg = _config(tmp_path, pg, "rn", "rn", extra)
    return cfg, old


def test_a_name_reused_in_the_transaction_that_dropped_it_ends_equal_by_default(pg, spark, tmp_path, capsys):
    """reused-name-in-one-txn: the old relation's delete (its image carries a volatile default the stream
    never sent) cannot be applied, and the relation is gone: it is set aside, the new table of that name
    goes on; it used to stop every run with a remedy that copied the new table and changed nothing."""
    cfg, old = _reused_name_setup(pg, tmp_path)
    assert _run(cfg, capsys)[0] == 0
    with pg.connect() as conn:
        conn.execute(REUSED_NAME)
    code, err = _run(cfg, capsys)
    assert code == 0, err
    assert f"relation OID {old}) was dropped in Postgres" in err, err
    assert _run(cfg, capsys)[0] == 0
    _assert_equal(spark, pg, tmp_path, [("public", "notes"), ("public", "other")])
    capsys.readouterr()
    assert cli_main(["status", "--config", cfg, "--dsn", pg.dsn]) == 0
    out = capsys.readouterr().out
    assert "MENDED BY ITSELF: 1 time(s)" in out and f"relation OID {old}, dropped): SET ASIDE" in out, out
    with pg.connect() as conn:  # and the new table of the name is followed, not left out with the old one
        conn.execute("UPDATE notes SET v = false WHERE id = 1; INSERT INTO notes VALUES (2, NULL)")
    assert _run(cfg, capsys)[0] == 0
    _assert_equal(spark, pg, tmp_path, [("public", "notes"), ("public", "other")])


@pytest.mark.parametrize("remedy", ["name", "oid"])
def test_under_stop_the_printed_remedy_for_a_reused_name_works_at_once(pg, spark, tmp_path, capsys, remedy):
    """``schema_changes: stop``: exit 4, and `applier resync --table public.notes` (what the message says) or
    `--table <old OID>` sets the dropped relation's changes aside; the next run ends equal."""
    cfg, old = _reused_name_setup(pg, tmp_path, "apply:\n  schema_changes: stop\n")
    assert _run(cfg, capsys)[0] == 0
    with pg.connect() as conn:
        conn.execute(REUSED_NAME)
    code, err = _run(cfg, capsys)
    assert code == 4 and "applier resync" in err and "public.notes" in err, (code, err)
    capsys.readouterr()
    table = "public.notes" if remedy == "name" else str(old)
    assert cli_main(["resync", "--config", cfg, "--table", table]) == 0, capsys.readouterr().err
    code, err = _run(cfg, capsys)
    assert code == 0, err
    _assert_equal(spark, pg, tmp_path, [("public", "notes"), ("public", "other")])


def test_a_dropped_key_less_table_whose_changes_cannot_apply_never_blocks_the_others(pg, spark, tmp_path, capsys):
    """dropped-keyless-table: old images carry a default the stream never sent, then the table is dropped,
    all between two runs: exit 4 "diverged" for a table that is gone. Now set aside, the run goes on."""
    with pg.connect() as conn:
        conn.execute("CREATE TABLE bag (id int, c int); ALTER TABLE bag REPLICA IDENTITY FULL;"
                     "INSERT INTO bag VALUES (1, 1), (2, 2), (3, 3); CREATE TABLE other (id int PRIMARY KEY, v int);"
                     "INSERT INTO other VALUES (1, 1); CREATE PUBLICATION dk FOR ALL TABLES")
    cfg = _config(tmp_path, pg, "dk", "dk")
    assert _run(cfg, capsys)[0] == 0
    with pg.connect() as conn:
        conn.execute("BEGIN; ALTER TABLE bag ADD COLUMN a text DEFAULT 'dflt'; UPDATE bag SET c = 10 WHERE id = 1;"
                     "DELETE FROM bag WHERE id = 2; COMMIT; DROP TABLE bag; INSERT INTO other VALUES (2, 2)")
    code, err = _run(cfg, capsys)
    assert code == 0, err
    _assert_equal(spark, pg, tmp_path, [("public", "other")])
    capsys.readouterr()
    assert cli_main(["resync", "--config", cfg, "--table", "public.bag"]) == 0, capsys.readouterr().err


def test_two_relations_claiming_one_path_are_mended_by_default(pg, spark, tmp_path, capsys):
    """both-claim-one-path: a schema renamed and its name reused, then one transaction writes to the new
    app.notes, drops it and creates another: every run stopped, naming no remedy."""
    with pg.connect() as conn:
        conn.execute("CREATE SCHEMA app; CREATE PUBLICATION bc FOR ALL TABLES;"
                     "CREATE TABLE app.notes (id int PRIMARY KEY, c int); INSERT INTO app.notes VALUES (1, 1), (2, 2);"
                     "CREATE TABLE public.other (id int PRIMARY KEY)")
    cfg = _config(tmp_path, pg, "bc", "bc")
    assert _run(cfg, capsys)[0] == 0
    with pg.connect() as conn:
        conn.execute("BEGIN; ALTER SCHEMA app RENAME TO app_29; CREATE SCHEMA app;"
                     "CREATE TABLE app.notes (id int PRIMARY KEY, c30 int); COMMIT")
        conn.execute("BEGIN; INSERT INTO app.notes VALUES (14, 1); DROP TABLE app.notes;"
                     "CREATE TABLE app.notes (id int, c43 int); ALTER TABLE app.notes REPLICA IDENTITY FULL; COMMIT")
        conn.execute("INSERT INTO app.notes VALUES (1, 1), (2, 2), (3, 3); DELETE FROM app.notes WHERE id = 2;"
                     "INSERT INTO public.other VALUES (1)")
    for _ in range(2):
        code, err = _run(cfg, capsys)
        assert code == 0, err
    _assert_equal(spark, pg, tmp_path, [("app", "notes"), ("app_29", "notes"), ("public", "other")])
    with pg.connect() as conn:
        conn.execute("BEGIN; ALTER SCHEMA app RENAME TO app_61; CREATE SCHEMA app; COMMIT;"
                     "UPDATE app_61.notes SET c43 = 30 WHERE id = 3; DELETE FROM app_61.notes WHERE id = 1;"
                     "DROP TABLE app_61.notes; INSERT INTO public.other VALUES (2)")
    code, err = _run(cfg, capsys)
    assert code == 0, err
    _assert_equal(spark, pg, tmp_path, [("app_29", "notes"), ("public", "other")])


def test_a_live_table_that_cannot_follow_is_copied_again_and_counted(pg, spark, tmp_path, capsys):
    """A type change Delta cannot widen (int to text) on one table: by default the table is copied again at a
    new position while the other goes on, and status says so."""
    with pg.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v int);"
                     "INSERT INTO t SELECT g, g FROM generate_series(1, 20) g;"
                     "CREATE TABLE other (id int PRIMARY KEY); CREATE PUBLICATION lt FOR ALL TABLES")
    cfg = _config(tmp_path, pg, "lt", "lt")
    assert _run(cfg, capsys)[0] == 0
    with pg.connect() as conn:
        conn.execute("ALTER TABLE t ALTER COLUMN v TYPE text; UPDATE t SET v = 'x' || v WHERE id <= 3;"
                     "INSERT INTO other VALUES (1)")
    code, err = _run(cfg, capsys)
    assert code == 0, err
    assert "copying the table again" in err, err
    _assert_equal(spark, pg, tmp_path, [("public", "t"), ("public", "other")])
    capsys.readouterr()
    assert cli_main(["status", "--config", cfg, "--dsn", pg.dsn]) == 0
    out = capsys.readouterr().out
    assert "MENDED BY ITSELF: 1 time(s)" in out and "copied again" in out, out
