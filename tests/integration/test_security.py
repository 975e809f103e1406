"""Security: hostile identifiers survive the whole path quoted, and the DSN's password never shows.

Real PostgreSQL, real Spark: a schema, table and columns named with quotes, spaces, backticks,
dots, unicode and an SQL keyword are mirrored (snapshot, then streamed inserts, TOAST-unchanged
updates, key changes, deletes) and must equal PostgreSQL; values that look like SQL are just data.
A role with only LOGIN, REPLICATION and SELECT, authenticated by password (scram-sha-256), runs the
mirror and status; its password must not appear in any output, log record, error, state file or
Delta log entry.
"""

from __future__ import annotations

import logging

import pytest
from pgroles import role_with_password
from psycopg import sql

from applier.checks.verify import verify_against_postgres
from applier.cli import main as cli_main
from applier.config import ApplySettings, MirrorConfig, SourceSettings, TargetSettings
from applier.drivers.mirror import mirror

pytestmark = [pytest.mark.postgres, pytest.mark.spark]

SCHEMA = 'sch ".`ü'
TABLE = 'tab le."q"`ü'
COLUMNS = ["id.key", "col with space", "back`tick", 'dq"uote', "ünï", "select"]
EVIL = "'); DROP TABLE t; -- `x` \"y\""


def _table() -> sql.Composed:
    return sql.SQL("{}.{}").format(sql.Identifier(SCHEMA), sql.Identifier(TABLE))


def test_hostile_identifiers_are_quoted_everywhere(pg, spark, tmp_path):
    ident = [sql.Identifier(c) for c in COLUMNS]
    with pg.connect() as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(SCHEMA)))
        conn.execute(sql.SQL("CREATE TABLE {} ({} int PRIMARY KEY, {} text, {} int, {} text, {} text, {} int)")
                     .format(_table(), *ident))
        conn.execute(sql.SQL("CREATE PUBLICATION p FOR TABLE {}").format(_table()))
        insert = sql.SQL("INSERT INTO {} VALUES (%s, %s, %s, %s, %s, %s)").format(_table())
        for i in range(1, 6):
            conn.execute(insert, (i, ("big " * 4000) if i == 1 else EVIL, i, EVIL, "ü" * i, i))
        cfg = MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="s", publication="p", read_mode="replication",
                                                 proto_version=2, streaming="on"),
                           target=TargetSettings(path=str(tmp_path / "delta")),
                           apply=ApplySettings(max_group_seconds=1.0))
        mirror(spark, cfg, once=True)  # snapshot
        upd = sql.SQL("UPDATE {} SET {} = {} + 100 WHERE {} = %s").format(_table(), ident[2], ident[2], ident[0])
        conn.execute(upd, (1,))  # 'col with space' is TOASTed and unchanged: kept from the target row
        conn.execute(sql.SQL("UPDATE {} SET {} = 10 WHERE {} = 2").format(_table(), ident[0], ident[0]))
        conn.execute(sql.SQL("DELETE FROM {} WHERE {} = 3").format(_table(), ident[0]))
        conn.execute(insert, (6, EVIL, 6, EVIL, "ü", 6))
        mirror(spark, cfg, once=True)  # the stream
        [result] = verify_against_postgres(spark, conn, str(tmp_path / "delta"), [(SCHEMA, TABLE)])
        assert result.equal and result.source_rows == 5, (result.only_in_source[:2], result.only_in_target[:2])
    df = spark.read.format("delta").load(str(tmp_path / "delta" / SCHEMA / TABLE))
    assert df.columns == COLUMNS
    rows = {r["id.key"]: r for r in df.collect()}
    assert rows[1]["col with space"] == "big " * 4000 and rows[1]["back`tick"] == 101
    assert rows[6]['dq"uote'] == EVIL and set(rows) == {1, 4, 5, 6, 10}


PASSWORD = "pw-Sup3r$ecret-9x"


@pytest.fixture
def password_role(pg):
    """A role with LOGIN, REPLICATION and SELECT on the published table only, that must give its password."""
    with pg.connect() as conn:
        conn.execute("CREATE TABLE acct (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO acct VALUES (1, 'one'), (2, 'two')")
        conn.execute("CREATE PUBLICATION sec FOR TABLE acct")
    with role_with_password(pg, f"sec_{pg.name}", PASSWORD, replication=True) as role:
        with pg.connect() as conn:
            conn.execute(sql.SQL("GRANT SELECT ON acct TO {}").format(sql.Identifier(role)))
        try:
            yield role
        finally:
            with pg.connect() as conn:
                conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                             "WHERE slot_name = 'sec' AND NOT active")
                conn.execute(sql.SQL("REVOKE ALL ON acct FROM {}").format(sql.Identifier(role)))


def test_password_never_appears_and_a_minimal_role_suffices(pg, spark, tmp_path, password_role, capsys,
                                                          caplog, monkeypatch):
    dsn = pg.cluster.dsn(pg.name, user=password_role, password=PASSWORD)
    wrong = pg.cluster.dsn(pg.name, user=password_role, password=PASSWORD + "-wrong")
    target = tmp_path / "delta"
    caplog.set_level(logging.DEBUG)
    outputs: list[str] = []

    monkeypatch.setenv("APPLIER_DSN", wrong)  # a refused login (exit 3): no DSN echoed
    assert cli_main(["mirror", "--publication", "sec", "--slot", "sec", "--target", str(target), "--once"]) == 3
    outputs.append(capsys.readouterr().err)
    assert "password authentication failed" in outputs[-1], outputs[-1]

    monkeypatch.setenv("APPLIER_DSN", dsn)
    assert cli_main(["mirror", "--publication", "sec", "--slot", "sec", "--target", str(target), "--once"]) == 0
    with pg.connect() as conn:
        conn.execute("INSERT INTO acct VALUES (3, 'three')")
        conn.execute("UPDATE acct SET v = 'uno' WHERE id = 1")
    assert cli_main(["mirror", "--publication", "sec", "--slot", "sec", "--target", str(target), "--once",
                     "--sql"]) == 0
    assert cli_main(["status", "--target", str(target), "--slot", "sec", "--json"]) == 0
    assert cli_main(["verify", "--target", str(target)]) == 0
    assert cli_main(["mirror", "--publication", "no_such_pub", "--slot", "sec2", "--target",
                     str(tmp_path / "other"), "--once"]) == 2  # a publication the server lacks, with the DSN set
    captured = capsys.readouterr()
    outputs += [captured.out, captured.err, "\n".join(r.getMessage() for r in caplog.records)]
    rows = {r["id"]: r["v"] for r in spark.read.format("delta").load(str(target / "public" / "acct")).collect()}
    assert rows == {1: "uno", 2: "two", 3: "three"}

    files = [p for p in target.rglob("*") if p.is_file() and p.suffix in (".json", ".crc", ".checkpoint", "")]
    assert any("_delta_log" in str(p) for p in files)
    for p in files:
        outputs.append(p.read_text(errors="replace"))
    history = [str(r.asDict()) for r in spark.sql(f"DESCRIBE HISTORY delta.`{target / 'public' / 'acct'}`").collect()]
    outputs += history
    leaks = [o for o in outputs if PASSWORD in o]
    assert not leaks, leaks[0][:500]
