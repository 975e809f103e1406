"""A rename with no row change since reaches Delta by the end of the run (applier.drivers.unsentshapes)
once the slot is confirmed past where the catalog was read. The soak (seed 2 on PostgreSQL 18) ended runs
with exit 0 and the rename not applied when the slot's walsender was terminated at the end of a drain:
the server never took the run's last confirmation ("the replication connection had ended before it was
closed"), and the end of run went by the server's position alone. The run's own confirmation counts now:
the mirror confirms a position only once every Delta commit before it exists."""

from __future__ import annotations

import pytest
from test_unattended import _assert_equal, _config, _run

from applier.drivers import unsentshapes
from applier.sources.slots import SlotInfo, slot_info

pytestmark = [pytest.mark.postgres, pytest.mark.spark]


def test_a_rename_reaches_delta_when_the_server_missed_the_runs_last_confirmation(pg, tmp_path, capsys,
                                                                                 monkeypatch):
    with pg.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, a int); INSERT INTO t VALUES (1, 1), (2, 2);"
                     "CREATE TABLE other (id int PRIMARY KEY); CREATE PUBLICATION uc FOR ALL TABLES")
    cfg = _config(tmp_path, pg, "uc", "uc")
    assert _run(cfg, capsys)[0] == 0
    with pg.connect() as conn:
        before = slot_info(conn, "uc")
        conn.execute("ALTER TABLE t RENAME COLUMN a TO r")
        conn.execute("INSERT INTO other VALUES (1)")
    assert before is not None

    def as_if_never_confirmed(conn, slot: str) -> SlotInfo | None:  # the run's confirmations lost on the way
        info = slot_info(conn, slot)
        return None if info is None else SlotInfo(info.plugin, before.confirmed_flush_lsn, info.slot_type)

    monkeypatch.setattr(unsentshapes, "slot_info", as_if_never_confirmed)
    code, err = _run(cfg, capsys)
    assert code == 0, err
    assert "may not be in Delta yet" not in err, err
    _assert_equal(None, pg, tmp_path, [("public", "t"), ("public", "other")])
