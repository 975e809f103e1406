"""Metadata columns and soft deletes (issue 19 item 2) against a real PostgreSQL, read back with delta-rs.

The workload writes, in every transaction k, ``w = k`` into the rows it touches, and the test keeps what
each deleted row last held in Postgres (read just before the delete). So after the mirror:
- the rows with the deleted flag off equal Postgres (``applier verify``, which leaves kept deletes out);
- the kept rows are exactly the deleted keys not inserted again, with their last values, op 'D';
- a row's commit LSN and time are those of the transaction that last wrote it: one LSN per k, growing
  with k, commit times in the same order; rows of the initial copy have op 'R', no time and the copy's
  position; all of it while many transactions are folded into one Delta commit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from applier.checks.verify import verify_against_postgres
from applier.config import ApplySettings, MirrorConfig, SourceSettings, TableRule, TablesSettings, TargetSettings
from applier.drivers.mirror import mirror
from applier.errors import ApplierError

pytestmark = [pytest.mark.postgres, pytest.mark.spark]

deltalake = pytest.importorskip("deltalake")

BIG = "x" * 6000  # stored out of line (STORAGE EXTERNAL): an update that leaves it alone sends 'u'


def _rows(path: Path) -> dict[int, dict[str, Any]]:
    table = deltalake.DeltaTable(str(path)).to_pyarrow_table()
    return {r["id"]: r for r in table.to_pylist()}


def _pg(conn, key: int) -> dict[str, Any]:
    cur = conn.execute("SELECT id, v, big, w FROM acct WHERE id = %s", (key,))
    names = [d.name for d in cur.description]
    return dict(zip(names, cur.fetchone(), strict=True))


@pytest.mark.parametrize("engine", ["auto", "spark"])
def test_metadata_columns_name_the_last_writer_and_soft_deletes_keep_rows(pg, spark, tmp_path, engine):
    target = tmp_path / "delta"
    config = MirrorConfig(
        source=SourceSettings(dsn=pg.dsn, slot="md", publication="md_pub"),
        target=TargetSettings(path=str(target)),
        tables=TablesSettings(metadata_columns=True, soft_delete=True,
                              rules=[TableRule(match="public.plain", metadata_columns=False, soft_delete=False)]),
        apply=ApplySettings(merge_engine=engine, max_group_transactions=1000))
    kept: dict[int, tuple[dict[str, Any], int]] = {}  # deleted key -> (its last row in Postgres, k of the delete)
    with pg.connect() as conn:
        conn.execute("CREATE TABLE acct (id int PRIMARY KEY, v int, big text, w int)")
        conn.execute("ALTER TABLE acct ALTER COLUMN big SET STORAGE EXTERNAL")
        conn.execute("INSERT INTO acct SELECT g, g, %s, 0 FROM generate_series(1, 20) g", (BIG,))
        conn.execute("CREATE TABLE plain (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO plain SELECT g, 'p' FROM generate_series(1, 5) g")
        conn.execute("CREATE PUBLICATION md_pub FOR TABLE acct, plain")
        first = mirror(spark, config, once=True)
        copied = _rows(target / "public" / "acct")
        assert {r["_applier_op"] for r in copied.values()} == {"R"}
        assert {r["_applier_commit_time"] for r in copied.values()} == {None}
        assert {r["_applier_commit_lsn"] for r in copied.values()} == {first.snapshot_lsn}
        assert not any(r["_applier_deleted"] for r in copied.values())

        k = 0

        def txn(*statements: str, deletes: tuple[int, ...] = ()) -> None:
            nonlocal k
            k += 1
            with conn.transaction():
                for sql in statements:
                    if sql.startswith("DELETE"):
                        for key in deletes:
                            kept[key] = (_pg(conn, key), k)
                    conn.execute(sql.replace("{k}", str(k)))

        txn("UPDATE acct SET v = v + 1, w = {k} WHERE id <= 5")  # big stays: 'u'
        txn("DELETE FROM acct WHERE id IN (6, 7)", deletes=(6, 7))  # values from the target
        txn("UPDATE acct SET id = 108, w = {k} WHERE id = 8")  # key change: the old key is kept, deleted
        kept[8] = ({**_pg(conn, 108), "id": 8, "w": 0}, k)  # what key 8 held: the copy's row
        txn("INSERT INTO acct VALUES (30, 30, 'short', {k})", "UPDATE acct SET v = 31, w = {k} WHERE id = 30",
            "DELETE FROM acct WHERE id = 30", deletes=(30,))  # resolved from the earlier image
        txn("DELETE FROM acct WHERE id = 9", deletes=(9,))
        txn("INSERT INTO acct VALUES (9, 99, 'back', {k})")  # revived
        del kept[9]
        txn("UPDATE acct SET w = {k} WHERE id = 1", "DELETE FROM acct WHERE id = 1", deletes=(1,))
        txn("INSERT INTO acct VALUES (40, 40, %s, {k})".replace("%s", f"'{BIG}'"),
            "UPDATE acct SET id = 41, w = {k} WHERE id = 40")
        kept[40] = ({**_pg(conn, 41), "id": 40}, k)
        txn("UPDATE acct SET v = -v, w = {k} WHERE id BETWEEN 10 AND 12")
        txn("DELETE FROM plain WHERE id = 1", "UPDATE plain SET v = 'q' WHERE id = 2")
        summary = mirror(spark, config, once=True)
        assert summary.transactions >= k

        for reader in ("auto", "spark"):  # delta-rs's and Spark's reading both leave the deleted rows out
            results = verify_against_postgres(spark, conn, str(target), [("public", "acct"), ("public", "plain")],
                                              config.tables, reader=reader)
            assert all(r.equal for r in results), [(reader, r.source_name, r.only_in_source[:3],
                                                    r.only_in_target[:3]) for r in results]
        rows = _rows(target / "public" / "acct")
        written = _rows(target / "public" / "acct")
        deleted = {key: r for key, r in rows.items() if r["_applier_deleted"]}
        assert set(deleted) == set(kept)
        for key, (last, when) in kept.items():
            assert {c: deleted[key][c] for c in ("id", "v", "big", "w")} == last, key
            assert deleted[key]["_applier_op"] == "D"
            deleted[key]["w"] = when  # the transaction that deleted it wrote it last
        live = {key: r for key, r in rows.items() if not r["_applier_deleted"]}
        ops = {key: r["_applier_op"] for key, r in live.items()}
        assert (ops[9], ops[41], ops[2], ops[10], ops[108], ops[15]) == ("I", "U", "U", "U", "U", "R")
        lsn_of: dict[int, set[int]] = {}
        time_of: dict[int, set[Any]] = {}
        for r in rows.values():
            lsn_of.setdefault(r["w"], set()).add(r["_applier_commit_lsn"])
            time_of.setdefault(r["w"], set()).add(r["_applier_commit_time"])
        assert all(len(v) == 1 for v in lsn_of.values()), lsn_of  # one transaction, one LSN
        order = sorted(lsn_of)
        lsns = [next(iter(lsn_of[w])) for w in order]
        assert lsns == sorted(lsns) and len(set(lsns)) == len(lsns)  # and they follow the commit order
        times = [next(iter(time_of[w])) for w in order if w]
        assert None not in times and times == sorted(times)
        assert set(_rows(target / "public" / "plain")[2]) == {"id", "v"}  # the rule turned them off

        mirror(spark, config, once=True)  # nothing new: nothing written, same rows
        assert _rows(target / "public" / "acct") == written


def test_a_table_without_a_key_cannot_have_metadata_columns(pg, spark, tmp_path):
    config = MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="mk", publication="mk_pub"),
                          target=TargetSettings(path=str(tmp_path / "delta")),
                          tables=TablesSettings(metadata_columns=True))
    with pg.connect() as conn:
        conn.execute("CREATE TABLE bag (a int, b text)")
        conn.execute("ALTER TABLE bag REPLICA IDENTITY FULL")
        conn.execute("CREATE PUBLICATION mk_pub FOR TABLE bag")
        with pytest.raises(ApplierError, match="need a key"):
            mirror(spark, config, once=True)


def test_hostile_names_meet_the_added_and_derived_tables(pg, spark, tmp_path):
    """A source schema named ``_history`` (with a table named ``public``) does not land inside the
    history tables' directory, and source columns named like the added ones stop the run, naming the
    column and what to do, instead of being overwritten."""
    rules = [TableRule(match="public.h", history=True, changes=True, metadata_columns=True, soft_delete=True)]
    config = MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="hn", publication="hn_pub"),
                          target=TargetSettings(path=str(tmp_path / "delta")), tables=TablesSettings(rules=rules))
    with pg.connect() as conn:
        conn.execute('CREATE SCHEMA "_history"')
        conn.execute('CREATE TABLE "_history"."public" (id int PRIMARY KEY, v text)')
        conn.execute("CREATE TABLE public.h (id int PRIMARY KEY, v text)")
        conn.execute('INSERT INTO "_history"."public" VALUES (1, \'x\')')
        conn.execute("INSERT INTO public.h VALUES (1, 'a'), (2, 'b')")
        conn.execute("CREATE PUBLICATION hn_pub FOR TABLE \"_history\".\"public\", public.h")
        mirror(spark, config, once=True)
        conn.execute('UPDATE "_history"."public" SET v = \'y\'')
        conn.execute("DELETE FROM public.h WHERE id = 1")
        mirror(spark, config, once=True)
        tables = [("_history", "public"), ("public", "h")]
        results = verify_against_postgres(spark, conn, str(tmp_path / "delta"), tables, config.tables)
        assert all(r.equal for r in results), [(r.source_name, r.only_in_source, r.only_in_target) for r in results]
        assert (tmp_path / "delta" / "%u5Fhistory" / "public" / "_delta_log").is_dir()
        versions = _rows(tmp_path / "delta" / "_history" / "public" / "h")
        assert {r["id"] for r in versions.values()} == {1, 2}

        for n, (column, rule, message) in enumerate([
                ("_applier_op", TableRule(match="public.c", metadata_columns=True), "choose other names"),
                ("__start_lsn", TableRule(match="public.c", history=True), "cannot have a history table"),
                ("__op", TableRule(match="public.c", changes=True), "cannot have a change feed table")]):
            conn.execute("DROP TABLE IF EXISTS public.c")
            conn.execute(f'CREATE TABLE public.c (id int PRIMARY KEY, "{column}" text)')
            conn.execute("DROP PUBLICATION IF EXISTS c_pub")
            conn.execute("CREATE PUBLICATION c_pub FOR TABLE public.c")
            slot = f"c{n}"
            named = MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot=slot, publication="c_pub"),
                                 target=TargetSettings(path=str(tmp_path / slot)),
                                 tables=TablesSettings(rules=[rule]))
            with pytest.raises(ApplierError, match=message):
                mirror(spark, named, once=True)
