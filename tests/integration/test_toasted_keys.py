"""A key column stored out of line (TOAST) and not changed by an update arrives as 'u' in the new image,
with the old key ('K') sent in full: the row is merged on that key (it used to stop with "a key column
arrived as unchanged TOAST"). Compared with PostgreSQL after a replay of the captured stream, in both
groupings and both Delta engines (one with the other)."""

from __future__ import annotations

import pytest
from background import captured_log

from applier.config import ApplySettings, ReplayConfig, TargetSettings
from applier.drivers.replay import replay_log
from applier.protocol.decoder import MessageDecoder
from applier.protocol.messages import COL_UNCHANGED_TOAST, Update
from applier.sink.store import DELTARS
from applier.sources.rawlog import read_raw_log

pytestmark = [pytest.mark.postgres, pytest.mark.spark]

# md5 hex is incompressible enough that EXTERNAL storage keeps 2.5 kB out of line (the btree index on the
# key takes up to ~2.7 kB); the tuple passes TOAST's 2 kB threshold, so the key column is toasted
KEY = "(SELECT string_agg(md5(i::text || '{n}'), '') FROM generate_series(1, 78) i)"


@pytest.mark.parametrize(("grouping", "engine"), [("transaction", "auto"), ("grouped", "spark")])
def test_an_update_that_keeps_a_toasted_key_is_merged_on_it(pg, spark, tmp_path, grouping, engine):
    log = captured_log(pg, tmp_path, "CREATE TABLE k (id text PRIMARY KEY, v int); "
                       "ALTER TABLE k ALTER COLUMN id SET STORAGE EXTERNAL", [
                           f"INSERT INTO k VALUES ({KEY.format(n=1)}, 1), ({KEY.format(n=2)}, 2), ('short', 3)",
                           "UPDATE k SET v = v + 10",
                           f"UPDATE k SET v = 100 WHERE id = {KEY.format(n=1)}",
                           f"DELETE FROM k WHERE id = {KEY.format(n=2)}"])
    decoder = MessageDecoder()
    updates = [m for m in (decoder.decode(r.data, r.lsn) for r in read_raw_log(log)) if isinstance(m, Update)]
    assert any(COL_UNCHANGED_TOAST == u.new.kinds[0] and u.old is not None for u in updates), \
        "the server did not send the key as unchanged TOAST: the test does not test it"
    target = tmp_path / "delta"
    replay_log(spark, ReplayConfig(source_log=str(log), target=TargetSettings(path=str(target)),
                                   apply=ApplySettings(grouping=grouping, merge_engine=engine)))
    table = DELTARS.open(str(target / "public" / "k")).to_pyarrow_table()
    got = sorted(zip(table.column("id").to_pylist(), table.column("v").to_pylist(), strict=True))
    with pg.connect() as conn:
        want = sorted(conn.execute("SELECT id, v FROM k").fetchall())
    assert got == want and len(want) == 2
