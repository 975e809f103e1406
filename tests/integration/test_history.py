"""SCD type 2 history tables (issue 19 item 3) against a real PostgreSQL, read back with delta-rs.

The expected history comes from Postgres itself: the test reads the whole table after every
transaction, and a key's version changes exactly where its tracked columns differ between two
commits (or it appears, disappears, or a TRUNCATE closes everything); untracked changes update the
open version in place. The history table must hold exactly those versions, with their values, their
start and end commits (mapped from LSNs to the transactions in commit order), commit times in the
same order, and nothing more; the mirror runs twice over the workload (so versions the history
already holds are closed and changed by a later commit) and a third time writes nothing.
"""

from __future__ import annotations

from typing import Any

import pytest

from applier.config import (
    ApplySettings,
    MirrorConfig,
    SnapshotSettings,
    SourceSettings,
    TableRule,
    TablesSettings,
    TargetSettings,
)
from applier.drivers.mirror import mirror
from applier.errors import ApplierError

pytestmark = [pytest.mark.postgres, pytest.mark.spark]

deltalake = pytest.importorskip("deltalake")

BIG = "y" * 5000
COLUMNS = ("id", "v", "note", "big")
TRACKED = (1, 3)  # v and big: a change to note alone updates the open version in place


def _state(conn) -> dict[int, tuple[Any, ...]]:
    return {r[0]: tuple(r) for r in conn.execute("SELECT id, v, note, big FROM h")}


def _expected(states: list[dict[int, tuple[Any, ...]]], truncates: set[int]) -> set[tuple[Any, ...]]:
    """(values..., start k, end k or None) of every version, from the table after each commit."""
    opened: dict[int, tuple[int, tuple[Any, ...]]] = {key: (0, row) for key, row in states[0].items()}
    versions: set[tuple[Any, ...]] = set()
    for k in range(1, len(states)):
        before, after = states[k - 1], states[k]
        if k in truncates:
            for start, row in opened.values():
                versions.add((*row, start, k))
            opened = {key: (k, row) for key, row in after.items()}
            continue
        for key in set(before) | set(after):
            if key not in after:
                start, row = opened.pop(key)
                versions.add((*row, start, k))
            elif key not in before:
                opened[key] = (k, after[key])
            elif any(before[key][i] != after[key][i] for i in TRACKED):
                start, row = opened.pop(key)
                versions.add((*row, start, k))
                opened[key] = (k, after[key])
            else:
                opened[key] = (opened[key][0], after[key])  # in place
    return versions | {(*row, start, None) for start, row in opened.values()}


def test_history_table_holds_every_version_postgres_had_at_commit_boundaries(pg, spark, tmp_path):
    target = tmp_path / "delta"
    config = MirrorConfig(
        source=SourceSettings(dsn=pg.dsn, slot="hs", publication="hs_pub"),
        target=TargetSettings(path=str(target)),
        tables=TablesSettings(rules=[TableRule(match="public.h", history=True, history_columns=["v", "big"])]),
        apply=ApplySettings(max_group_transactions=1000))
    history = target / "_history" / "public" / "h"
    with pg.connect() as conn:
        conn.execute("CREATE TABLE h (id int PRIMARY KEY, v int, note text, big text)")
        conn.execute("ALTER TABLE h ALTER COLUMN big SET STORAGE EXTERNAL")
        conn.execute("INSERT INTO h SELECT g, g, 'n', %s FROM generate_series(1, 10) g", (BIG,))
        conn.execute("CREATE PUBLICATION hs_pub FOR TABLE h")
        first = mirror(spark, config, once=True)
        states = [_state(conn)]
        truncates: set[int] = set()

        def txn(*statements: str) -> None:
            with conn.transaction():
                for sql in statements:
                    conn.execute(sql)
            if any(sql.startswith("TRUNCATE") for sql in statements):
                truncates.add(len(states))
            states.append(_state(conn))

        txn("UPDATE h SET v = v + 1 WHERE id <= 3")  # big unchanged: 'u', from the copy's versions
        txn("UPDATE h SET note = 'n2' WHERE id = 4")  # untracked: in place
        txn("DELETE FROM h WHERE id = 5")
        txn("UPDATE h SET id = 105 WHERE id = 6")  # key change: 6 ends, 105 starts
        txn("INSERT INTO h VALUES (20, 20, 'a', 'b')", "UPDATE h SET v = 21 WHERE id = 20")  # one version
        txn("DELETE FROM h WHERE id = 7", f"INSERT INTO h VALUES (7, 7, 'n', '{BIG}')",  # unchanged: none
            "UPDATE h SET v = 80 WHERE id = 8")
        mirror(spark, config, once=True)
        txn("UPDATE h SET v = 0 WHERE id = 1")  # ends a version the history already holds
        txn("UPDATE h SET note = 'x' WHERE id = 2")  # in place, in the history table
        txn("UPDATE h SET v = 3 WHERE id = 3", "TRUNCATE h", "INSERT INTO h VALUES (1, 0, 'n', 'c'), (2, 2, 'x', 'd')")
        txn("UPDATE h SET v = 5 WHERE id = 1")
        mirror(spark, config, once=True)

        rows = deltalake.DeltaTable(str(history)).to_pyarrow_table().to_pylist()
        lsns = sorted({r["__start_lsn"] for r in rows} | {r["__end_lsn"] for r in rows if r["__end_lsn"]})
        assert lsns[0] == first.snapshot_lsn
        expected = _expected(states, truncates)
        ks = sorted({v[-2] for v in expected} | {v[-1] for v in expected if v[-1] is not None})
        assert len(lsns) == len(ks), (lsns, ks)
        k_of = dict(zip(lsns, ks, strict=True))
        got = {(*(r[c] for c in COLUMNS), k_of[r["__start_lsn"]], k_of.get(r["__end_lsn"])) for r in rows}
        assert len(got) == len(rows)  # no version twice
        assert got == expected, (sorted(got - expected)[:5], sorted(expected - got)[:5])
        at_of = {k_of[r["__start_lsn"]]: r["__start_at"] for r in rows}
        at_of.update({k_of[r["__end_lsn"]]: r["__end_at"] for r in rows if r["__end_lsn"]})
        assert at_of[0] is None and None not in [at_of[k] for k in ks[1:]]
        assert [at_of[k] for k in ks[1:]] == sorted(at_of[k] for k in ks[1:])

        version = deltalake.DeltaTable(str(history)).version()
        mirror(spark, config, once=True)  # nothing new: the history is not written again
        assert deltalake.DeltaTable(str(history)).version() == version

        from applier.checks.status import table_status
        from applier.sink.derived import derived_table_dirs

        (kind, path), = derived_table_dirs(target)
        status = table_status(path, kind=kind.name)
        assert (status.kind, status.source_name, status.rows) == ("history", "public.h", len(rows))
        assert status.applied_lsn == table_status(target / "public" / "h").applied_lsn  # caught up


def test_history_columns_must_exist_and_the_table_needs_a_key(pg, spark, tmp_path):
    config = MirrorConfig(
        source=SourceSettings(dsn=pg.dsn, slot="hk", publication="hk_pub"),
        target=TargetSettings(path=str(tmp_path / "delta")),
        tables=TablesSettings(rules=[TableRule(match="public.bag", history=True)]))
    with pg.connect() as conn:
        conn.execute("CREATE TABLE bag (a int, b text)")
        conn.execute("ALTER TABLE bag REPLICA IDENTITY FULL")
        conn.execute("CREATE PUBLICATION hk_pub FOR TABLE bag")
        with pytest.raises(ApplierError, match="needs a key"):
            mirror(spark, config, once=True)


@pytest.mark.parametrize("on_executors", [False, True], ids=["driver", "executors"])
def test_history_turned_on_for_a_copied_table_starts_at_a_new_copy(pg, spark, tmp_path, on_executors):
    """Versions before the history existed are unknown; the mirror copies the table again at a known
    position and the history starts there, one open version per row, instead of a history that
    silently lacks the rows nobody changed since. ``executors``: that table sync's copy, of the history
    table and then the mirror table, on Spark's executors."""
    plain = MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="hl", publication="hl_pub"),
                         target=TargetSettings(path=str(tmp_path / "delta")),
                         snapshot=SnapshotSettings(on_executors=on_executors))
    with_history = plain.model_copy(update={"tables": TablesSettings(rules=[TableRule(match="public.h",
                                                                                      history=True)])})
    with pg.connect() as conn:
        conn.execute("CREATE TABLE h (id int PRIMARY KEY, v int, note text, big text)")
        conn.execute("INSERT INTO h SELECT g, g, 'n', 'b' FROM generate_series(1, 10) g")
        conn.execute("CREATE PUBLICATION hl_pub FOR TABLE h")
        mirror(spark, plain, once=True)
        conn.execute("UPDATE h SET v = -1 WHERE id = 1")
        summary = mirror(spark, with_history, once=True)
        assert summary.synced_rows == {"public.h": 10}
        conn.execute("UPDATE h SET v = -2 WHERE id = 2")
        mirror(spark, with_history, once=True)
        rows = deltalake.DeltaTable(str(tmp_path / "delta" / "_history" / "public" / "h")).to_pyarrow_table()
        opened = {tuple(r[c] for c in COLUMNS) for r in rows.to_pylist() if r["__end_lsn"] is None}
        assert opened == set(_state(conn).values())
        assert len(rows) == 11  # ten from the copy, the second version of key 2


def test_a_column_with_a_default_on_a_table_with_history_stops_the_mirror_with_a_way_forward(pg, spark, tmp_path):
    """Such a column needs the table copied again (its existing rows hold the default, which the
    stream never sends); a copy would wipe what the history holds, so the mirror stops and says what
    to do instead of overwriting it or leaving NULL there."""
    config = MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="hd", publication="hd_pub"),
                          target=TargetSettings(path=str(tmp_path / "delta")),
                          tables=TablesSettings(rules=[TableRule(match="public.h", history=True)]))
    with pg.connect() as conn:
        conn.execute("CREATE TABLE h (id int PRIMARY KEY, v int)")
        conn.execute("INSERT INTO h SELECT g, g FROM generate_series(1, 5) g")
        conn.execute("CREATE PUBLICATION hd_pub FOR TABLE h")
        mirror(spark, config, once=True)
        conn.execute("ALTER TABLE h ADD COLUMN d int DEFAULT 7")
        conn.execute("INSERT INTO h VALUES (6, 6, 6)")
        history = tmp_path / "delta" / "_history" / "public" / "h"
        version = deltalake.DeltaTable(str(history)).version()
        with pytest.raises(ApplierError, match="cannot take a copy without losing what it holds"):
            mirror(spark, config, once=True)
        assert deltalake.DeltaTable(str(history)).version() == version  # untouched
