"""A mirror nobody has to watch (issue 73): it mends on "relation gone", whatever the error's class.

A stop whose error names a relation (``relation_oid``, or ``held_by_oid``: the one holding the Delta path
it wants) that Postgres no longer has is set aside by itself (applier.drivers.mirror ``_mend``), unless
``apply.schema_changes: stop``; an error of another class on a live relation stops the run as before. The
reproduction is the soak's (seed 1 on PostgreSQL 18, step 322): a retype Delta cannot widen, then the table
dropped, between two runs, which raised DroppedTypeChangeError (no ResyncNeededError) at every run while the
other tables waited. Also: a run leaves no connection of its live catalog behind (the soak counted one a
run), and a mend record never names a table "(relation OID None)"."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from test_unattended import _assert_equal, _config, _run

from applier.config import MirrorConfig
from applier.drivers.mirror import Mirror, mirror
from applier.errors import DroppedTypeChangeError, SinkError
from applier.infra.stops import mends
from applier.state import StateDir

pytestmark = [pytest.mark.postgres, pytest.mark.spark]

RETYPE_THEN_DROP = ("ALTER TABLE t ALTER COLUMN c TYPE text USING c::text; UPDATE t SET c = 'x' WHERE id = 1;"
                    "DROP TABLE t; INSERT INTO other VALUES (1)")


def _mends(tmp_path: Path) -> dict[str, Any]:
    return mends(StateDir.for_target(str(tmp_path / "delta"), None))


def _retype_then_drop_setup(pg, tmp_path: Path, extra: str = "") -> tuple[str, int]:
    with pg.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, c bool); CREATE TABLE other (id int PRIMARY KEY);"
                     "INSERT INTO t VALUES (1, true), (2, false); CREATE PUBLICATION rd FOR ALL TABLES")
        oid = int(conn.execute("SELECT 't'::regclass::oid::int8").fetchone()[0])
    return _config(tmp_path, pg, "rd", "rd", extra), oid


def test_a_retype_then_a_drop_between_two_runs_sets_the_table_aside_by_itself(pg, spark, tmp_path, capsys):
    """DroppedTypeChangeError is no ResyncNeededError, and used to stop every run (exit 4) while ``other``
    waited: the relation is gone, so it is set aside, and the run goes on."""
    cfg, oid = _retype_then_drop_setup(pg, tmp_path)
    assert _run(cfg, capsys)[0] == 0
    with pg.connect() as conn:
        conn.execute(RETYPE_THEN_DROP)
    code, err = _run(cfg, capsys)
    assert code == 0, err
    assert f"relation OID {oid}) was dropped in Postgres" in err, err
    _assert_equal(spark, pg, tmp_path, [("public", "other")])
    recent = _mends(tmp_path)["recent"]
    assert [m["how"] for m in recent] == ["set aside: dropped in Postgres"], recent
    assert recent[0]["tables"] == f"public.t (relation OID {oid})", recent
    with pg.connect() as conn:  # and it stays aside: the next runs go on with the others
        conn.execute("INSERT INTO other VALUES (2)")
    code, err = _run(cfg, capsys)
    assert code == 0, err
    _assert_equal(spark, pg, tmp_path, [("public", "other")])
    assert _mends(tmp_path)["count"] == 1


def test_under_stop_a_retype_then_a_drop_still_stops(pg, spark, tmp_path, capsys):
    """``schema_changes: stop``: a person decides, so nothing is set aside by itself (exit 4)."""
    cfg, oid = _retype_then_drop_setup(pg, tmp_path, "apply:\n  schema_changes: stop\n")
    assert _run(cfg, capsys)[0] == 0
    with pg.connect() as conn:
        conn.execute(RETYPE_THEN_DROP)
    code, err = _run(cfg, capsys)
    assert code == 4 and "has been dropped in Postgres since" in err and str(oid) in err, (code, err)
    assert not _mends(tmp_path).get("recent"), _mends(tmp_path)


def _mirror_config(pg, tmp_path: Path, publication: str) -> MirrorConfig:
    return MirrorConfig.model_validate({"source": {"dsn": pg.dsn, "slot": publication, "publication": publication},
                                        "target": {"path": str(tmp_path / "delta")}})


def test_an_error_of_another_class_stops_unless_its_relation_is_gone(pg, spark, tmp_path):
    """Any ApplierError naming a dropped relation is mended; the same error on a live relation, naming none,
    or when Postgres cannot be asked, is not (it stops the run as it did, with its own message)."""
    with pg.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY); CREATE TABLE gone (id int PRIMARY KEY);"
                     "INSERT INTO t VALUES (1); INSERT INTO gone VALUES (1); CREATE PUBLICATION ac FOR ALL TABLES")
        live = int(conn.execute("SELECT 't'::regclass::oid::int8").fetchone()[0])
        dropped = int(conn.execute("SELECT 'gone'::regclass::oid::int8").fetchone()[0])
    config = _mirror_config(pg, tmp_path, "ac")
    mirror(spark, config, once=True)
    with pg.connect() as conn:
        conn.execute("DROP TABLE gone")
    run = Mirror(spark, config)
    try:
        assert not run._mend(SinkError("writing failed", table="public.t", relation_oid=live))
        assert not run._mend(DroppedTypeChangeError("no relation named"))
        assert not _mends(tmp_path).get("recent")
        run.live_catalog.close()  # Postgres out of reach: the error stands as it is, nothing is set aside
        run.live_catalog.dsn = "host=127.0.0.1 port=1 dbname=none connect_timeout=2"
        assert not run._mend(SinkError("writing failed", table="public.gone", relation_oid=dropped))
        run.live_catalog.dsn = pg.dsn
        assert run._mend(SinkError("writing failed", table="public.gone", relation_oid=dropped))
    finally:
        run.live_catalog.close()
    recent = _mends(tmp_path)["recent"]
    assert [(m["tables"], m["how"]) for m in recent] == [
        (f"public.gone (relation OID {dropped})", "set aside: dropped in Postgres")], recent


def test_a_mend_record_names_the_relation_by_its_binding_never_none(pg, spark, tmp_path):
    """An error without ``relation_oid``: the OID comes from the table's binding, or is left out."""
    with pg.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY); INSERT INTO t VALUES (1); "
                     "CREATE PUBLICATION nm FOR ALL TABLES")
        oid = int(conn.execute("SELECT 't'::regclass::oid::int8").fetchone()[0])
    config = _mirror_config(pg, tmp_path, "nm")
    mirror(spark, config, once=True)
    run = Mirror(spark, config)
    assert run._named({"table": "public.t"}) == f"public.t (relation OID {oid})"
    assert run._named({"table": "public.t", "relation_oid": oid}) == f"public.t (relation OID {oid})"
    assert run._named({"table": "public.never"}) == "public.never"
    assert run._named({"relation_oid": 12345}) == "relation OID 12345"
    assert "None" not in run._named({})


def _connections(pg) -> int:
    """The server's connections to the test's database, but the one asking."""
    with pg.connect() as conn:
        return int(conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                "AND pid <> pg_backend_pid()").fetchone()[0])


def _settled(pg, expected: int) -> int:
    """The count once it reaches ``expected`` (a backend leaves pg_stat_activity a moment after its client
    closed), or what it still is after a few seconds."""
    deadline = time.monotonic() + 10
    while (count := _connections(pg)) != expected and time.monotonic() < deadline:
        time.sleep(0.2)
    return count


def test_in_process_runs_leave_no_connection_behind(pg, spark, tmp_path):
    """Each run's live catalog connection (opened by the first Relation the identity map asks about) is
    closed when the run ends, whether the Mirror is garbage at once (``mirror``) or kept (a caller that
    reads it after), so a process that runs the mirror again and again never piles them up."""
    with pg.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v int); CREATE PUBLICATION lc FOR ALL TABLES")
    config = _mirror_config(pg, tmp_path, "lc")
    baseline = _connections(pg)
    kept: list[Mirror] = []
    for i in range(4):
        with pg.connect() as conn:  # a change each time: the run's Relation message asks the live catalog
            conn.execute(f"INSERT INTO t VALUES ({i}, {i}); ALTER TABLE t ADD COLUMN c{i} int")
        if i % 2:
            kept.append(Mirror(spark, config))
            kept[-1].run(once=True)
        else:
            mirror(spark, config, once=True)
        assert _settled(pg, baseline) == baseline, f"run {i + 1}: connections left open"
    _assert_equal(spark, pg, tmp_path, [("public", "t")])
