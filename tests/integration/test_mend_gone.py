"""A mirror run leaves no connection behind: its live catalog's (applier.sources.catalog_lookup.LiveCatalog)
is closed when ``Mirror.run`` ends, so a process that runs the mirror again and again (a test, the soak) never
piles them up (the soak counted one a run, ``connections_left_by_a_run``)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from test_unattended import _assert_equal

from applier.config import MirrorConfig
from applier.drivers.mirror import Mirror, mirror

pytestmark = [pytest.mark.postgres, pytest.mark.spark]


def _mirror_config(pg, tmp_path: Path, publication: str) -> MirrorConfig:
    return MirrorConfig.model_validate({"source": {"dsn": pg.dsn, "slot": publication, "publication": publication},
                                        "target": {"path": str(tmp_path / "delta")}})


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
