"""A table's merge key changing between transactions of one group (issue 30, row 10): a key-less
multiset table that gets a primary key, and a keyed one that loses it or goes to REPLICA IDENTITY
FULL, must end as one commit per transaction would leave it: equal to Postgres, row by row (as a
multiset for the key-less phases)."""

from __future__ import annotations

import os
import random
from pathlib import Path

import psycopg
import pytest

from applier.catalog.batches import TableBatch
from applier.checks.verify import verify_against_postgres
from applier.config import ApplySettings, MirrorConfig, ReplayConfig, SourceSettings, TablesSettings, TargetSettings
from applier.drivers.mirror import mirror
from applier.drivers.replay import replay_log
from applier.sink.fold import key_runs, split_ends
from applier.sources.rawlog_writer import write_raw_log
from applier.sources.sql_slot import create_slot, peek, pgoutput_options

pytestmark = [pytest.mark.postgres, pytest.mark.spark]

ROW_10 = [  # the batch, each statement its own transaction
    "ALTER TABLE k2 REPLICA IDENTITY FULL",
    "UPDATE k2 SET v = 'c' WHERE ctid = (SELECT min(ctid) FROM k2 WHERE id = 1)",  # one of the duplicates
    "DELETE FROM k2 WHERE id = 1 AND v = 'a'",  # the other one
    "ALTER TABLE k2 ADD PRIMARY KEY (id)",
    "ALTER TABLE k2 REPLICA IDENTITY DEFAULT",
    "UPDATE k2 SET v = 'd' WHERE id = 2",
]


def _assert_equal(spark, conn, target: Path, tables: list[tuple[str, str]]) -> None:
    for r in verify_against_postgres(spark, conn, str(target), tables):
        assert r.equal, (r.source_name, r.source_rows, r.target_rows, r.only_in_source[:5], r.only_in_target[:5])


@pytest.mark.parametrize("grouping", ["grouped", "transaction"])
def test_a_multiset_table_that_gets_a_primary_key_mid_group_ends_equal(pg, spark, tmp_path, grouping):
    with pg.connect() as conn:
        conn.execute("CREATE TABLE k2 (id int, v text); INSERT INTO k2 VALUES (1, 'a'), (1, 'a'), (2, 'b');"
                     "CREATE PUBLICATION kp FOR TABLE k2")
        target = tmp_path / "delta"
        cfg = MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="k", publication="kp", read_mode="sql"),
                           target=TargetSettings(path=str(target)), apply=ApplySettings(grouping=grouping))
        mirror(spark, cfg, once=True)
        for statement in ROW_10:
            conn.execute(statement)
        summary = mirror(spark, cfg, once=True)
        assert summary.transactions >= 3
        assert sorted(conn.execute("SELECT id, v FROM k2").fetchall()) == [(1, "c"), (2, "d")]
        _assert_equal(spark, conn, target, [("public", "k2")])  # without the fix: (1, 'c') missing


# --- a randomized history of key changes ----------------------------------------------------------

KEY_SCHEMA = """
CREATE TABLE kc_bag (id int NOT NULL, v text);
ALTER TABLE kc_bag REPLICA IDENTITY FULL;
CREATE TABLE kc_keyed (id int PRIMARY KEY, v text);
CREATE PUBLICATION kc_pub FOR TABLE kc_bag, kc_keyed;
"""
KEY_TABLES = [("public", "kc_bag"), ("public", "kc_keyed")]
#: how each table may be identified: no key (FULL), a primary key (DEFAULT), a primary key with FULL,
#: a unique index (USING INDEX, on (v2) which is not the primary key)
STATES = ("full", "pk", "pk_full", "index")


def _go_to(conn: psycopg.Connection, table: str, state: str, now: str) -> str:
    """DDL (each statement its own transaction) from the table's identity ``now`` to ``state``."""
    if now in ("pk", "pk_full") and state not in ("pk", "pk_full"):
        conn.execute(f"ALTER TABLE {table} REPLICA IDENTITY FULL")
        conn.execute(f"ALTER TABLE {table} DROP CONSTRAINT {table}_pkey")
    if now == "index" and state != "index":
        conn.execute(f"ALTER TABLE {table} REPLICA IDENTITY FULL")
        conn.execute(f"DROP INDEX {table}_v_key")
    if state in ("pk", "pk_full") and now not in ("pk", "pk_full"):
        # the rows must be unique on id first: a transaction of its own removes the extra copies
        conn.execute(f"DELETE FROM {table} a USING {table} b WHERE a.id = b.id AND a.ctid > b.ctid")
        conn.execute(f"ALTER TABLE {table} ADD PRIMARY KEY (id)")
    if state == "index" and now != "index":
        conn.execute(f"DELETE FROM {table} a USING {table} b WHERE a.v = b.v AND a.ctid > b.ctid")
        conn.execute(f"UPDATE {table} SET v = 'v' || id || '-' || ctid::text WHERE v IS NULL")
        conn.execute(f"ALTER TABLE {table} ALTER COLUMN v SET NOT NULL")
        conn.execute(f"CREATE UNIQUE INDEX {table}_v_key ON {table} (v)")
        conn.execute(f"ALTER TABLE {table} REPLICA IDENTITY USING INDEX {table}_v_key")
    if state != "index" and now == "index":
        conn.execute(f"ALTER TABLE {table} ALTER COLUMN v DROP NOT NULL")
    identity = {"full": "FULL", "pk": "DEFAULT", "pk_full": "FULL", "index": None}[state]
    if identity is not None:
        conn.execute(f"ALTER TABLE {table} REPLICA IDENTITY {identity}")
    return state


def _dml(conn: psycopg.Connection, rng: random.Random, table: str, state: str, counter: list[int]) -> None:
    """One transaction of a few row changes that the table's current identity allows."""
    keyed_on_id = state in ("pk", "pk_full")
    with conn.transaction():
        for _ in range(rng.randint(1, 4)):
            what = rng.random()
            counter[0] += 1
            n = counter[0]
            if what < 0.4:
                existing = conn.execute(f"SELECT id FROM {table} ORDER BY random() LIMIT 1").fetchone()
                if keyed_on_id or existing is None or rng.random() < 0.5:
                    new_id = 1000 + n
                else:
                    new_id = existing[0]  # a duplicate id: the multiset phases keep copies
                value = f"v{n}" if state == "index" or rng.random() < 0.7 else None
                copies = 2 if state == "full" and rng.random() < 0.3 else 1
                for _c in range(copies):
                    conn.execute(f"INSERT INTO {table} VALUES (%s, %s)", (new_id, value))
                    if state == "index":
                        break
            elif what < 0.75:  # update one row (one copy of a duplicate), sometimes its id
                set_id = "id = id + 100000, " if keyed_on_id and rng.random() < 0.2 else ""
                conn.execute(f"UPDATE {table} SET {set_id}v = %s WHERE ctid = (SELECT ctid FROM {table} "
                             "ORDER BY random() LIMIT 1)", (f"u{n}",))
            else:  # delete one row (one copy of a duplicate)
                conn.execute(f"DELETE FROM {table} WHERE ctid = (SELECT ctid FROM {table} ORDER BY random() LIMIT 1)")


def key_change_workload(conn: psycopg.Connection, seed: int, steps: int = 40) -> list[tuple[str, str, str]]:
    """Returns the identity changes made: (table, from, to)."""
    rng = random.Random(seed)
    changes: list[tuple[str, str, str]] = []
    now = {"kc_bag": "full", "kc_keyed": "pk"}
    counter = [0]
    for table in now:
        for i in range(6):
            conn.execute(f"INSERT INTO {table} VALUES (%s, %s)", (i % 4, f"s{i}" if table == "kc_keyed" else "a"))
            if table == "kc_keyed" and i == 3:
                break
    for _ in range(steps):
        table = rng.choice(sorted(now))
        if rng.random() < 0.25:
            state = rng.choice([s for s in STATES if s != now[table]])
            changes.append((table, now[table], state))
            now[table] = _go_to(conn, table, state, now[table])
        else:
            _dml(conn, rng, table, now[table], counter)
    return changes


SEEDS = [int(s) for s in os.environ.get("APPLIER_KEY_CHANGE_SEEDS", "").split(",") if s.strip()] or [1]
#: seeds 1 to 4 passed on both replay paths on 2026-11-25; seed 1 fails without the fold's cut by key


@pytest.mark.usefixtures("replay_path")
@pytest.mark.parametrize("seed", SEEDS)
def test_random_key_and_replica_identity_changes_fold_like_one_commit_per_transaction(pg, spark, tmp_path, seed):
    with pg.connect() as conn:
        conn.execute(KEY_SCHEMA)
        create_slot(conn, "s")
        changes = key_change_workload(conn, seed)
        # the history is worth replaying: a table went to a multiset and one from it, at least once
        assert {(a == "full", b == "full") for _t, a, b in changes} >= {(True, False), (False, True)}, changes
        conn.execute("INSERT INTO kc_keyed VALUES (-1, 'last')")
        raw = tmp_path / "raw.parquet"
        write_raw_log(raw, ((m.lsn, m.xid, m.data) for m in peek(conn, "s", pgoutput_options("kc_pub"))))
        target = tmp_path / "delta"
        # one group for the whole history: every key change falls inside it
        replay_log(spark, ReplayConfig(source_log=str(raw), target=TargetSettings(path=str(target)),
                                       apply=ApplySettings(grouping="grouped")))
        _assert_equal(spark, conn, target, KEY_TABLES)


def test_a_key_change_between_the_changes_of_one_transaction_cuts_the_transaction_apart():
    """A run ends where the merge key changes, inside a transaction too: that transaction's part before
    the cut is a run of its own (committed with a piece marker), the transactions before it another."""
    from applier.catalog import RelationCache
    from applier.protocol.messages import Relation, RelationColumn

    def schema(identity: str, key: bool):
        cache = RelationCache()
        cache.update(Relation(None, 16384, "public", "t", identity,
                              (RelationColumn(1 if key else 0, "id", 23, -1), RelationColumn(0, "v", 25, -1))))
        return cache.get(16384)

    full, keyed = schema("f", False), schema("d", True)

    def batch(sv, end: int) -> TableBatch:
        return TableBatch(16384, "public", "t", sv, end - 1, end, ())

    tables = TablesSettings()
    runs = key_runs([(10, batch(full, 10)), (20, batch(full, 20)), (30, batch(keyed, 30)),
                     (40, batch(keyed, 40))], tables)
    assert [[lsn for lsn, _b in run] for run in runs] == [[10, 20], [30, 40]]
    assert len(key_runs([(10, batch(keyed, 10)), (20, batch(keyed, 20))], tables)) == 1
    inside = [(10, batch(full, 10)), (20, batch(full, 20)), (20, batch(keyed, 20)), (30, batch(keyed, 30))]
    assert [[lsn for lsn, _b in run] for run in key_runs(inside, tables)] == [[10], [20], [20, 30]]
    assert split_ends([(10, [batch(full, 10)]), (20, [batch(full, 20), batch(keyed, 20)])], tables) == {20}


def _key_added_mid_transaction(conn: psycopg.Connection) -> None:
    """The issue's transaction: a multiset's duplicates updated and deleted, then a key, then a keyed update."""
    with conn.transaction():
        conn.execute("UPDATE kt SET v = 'x' WHERE ctid = (SELECT min(ctid) FROM kt WHERE id = 1)")
        conn.execute("DELETE FROM kt WHERE id = 1 AND v = 'a'")
        conn.execute("ALTER TABLE kt ADD PRIMARY KEY (id)")
        conn.execute("ALTER TABLE kt REPLICA IDENTITY DEFAULT")
        conn.execute("UPDATE kt SET v = 'y' WHERE id = 2")


def test_a_key_added_between_the_changes_of_one_transaction_replays_equal(pg, spark, tmp_path):
    """PostgreSQL 15 sends the new Relation (identity DEFAULT, key id) between the transaction's changes;
    a replay (no source to copy from) applies the two parts as PostgreSQL's subscriber does, under either
    grouping (it stopped with exit 4 before: issue 73)."""
    with pg.connect() as conn:
        conn.execute("CREATE TABLE kt (id int NOT NULL, v text); ALTER TABLE kt REPLICA IDENTITY FULL;"
                     "CREATE PUBLICATION ktp FOR TABLE kt")
        create_slot(conn, "s")
        conn.execute("INSERT INTO kt VALUES (1, 'a'), (1, 'a'), (2, 'b')")
        _key_added_mid_transaction(conn)
        conn.execute("INSERT INTO kt VALUES (3, 'after')")
        raw = tmp_path / "raw.parquet"
        write_raw_log(raw, ((m.lsn, m.xid, m.data) for m in peek(conn, "s", pgoutput_options("ktp"))))
        for grouping in ("grouped", "transaction"):
            target = tmp_path / grouping
            replay_log(spark, ReplayConfig(source_log=str(raw), target=TargetSettings(path=str(target)),
                                           apply=ApplySettings(grouping=grouping)))
            _assert_equal(spark, conn, target, [("public", "kt")])


#: each: the table's first shape, then a transaction with a key change between its row changes
MID_TRANSACTION_KEY_CHANGES = {
    "add primary key": ("CREATE TABLE kt (id int NOT NULL, v text); ALTER TABLE kt REPLICA IDENTITY FULL",
                        ["UPDATE kt SET v = 'x' WHERE ctid = (SELECT min(ctid) FROM kt WHERE id = 1)",
                         "DELETE FROM kt WHERE id = 1 AND v = 'a'", "ALTER TABLE kt ADD PRIMARY KEY (id)",
                         "ALTER TABLE kt REPLICA IDENTITY DEFAULT", "UPDATE kt SET v = 'y' WHERE id = 2",
                         "INSERT INTO kt SELECT g, 'n' FROM generate_series(10, 400) g"]),
    "drop primary key": ("CREATE TABLE kt (id int PRIMARY KEY, v text)",
                         ["UPDATE kt SET v = 'x' WHERE id = 2", "ALTER TABLE kt DROP CONSTRAINT kt_pkey",
                          "ALTER TABLE kt REPLICA IDENTITY FULL", "INSERT INTO kt VALUES (2, 'x'), (2, 'x')",
                          "DELETE FROM kt WHERE ctid = (SELECT min(ctid) FROM kt WHERE id = 2)",
                          "UPDATE kt SET v = 'z' WHERE id = 3"]),
    "identity to full and back": ("CREATE TABLE kt (id int PRIMARY KEY, v text)",
                                  ["UPDATE kt SET v = 'p' WHERE id = 1", "ALTER TABLE kt REPLICA IDENTITY FULL",
                                   "UPDATE kt SET v = 'q' WHERE id = 2", "DELETE FROM kt WHERE id = 3",
                                   "ALTER TABLE kt REPLICA IDENTITY DEFAULT", "UPDATE kt SET v = 'r' WHERE id = 2",
                                   "INSERT INTO kt VALUES (3, 'back')"]),
}


@pytest.mark.parametrize("case", sorted(MID_TRANSACTION_KEY_CHANGES))
@pytest.mark.parametrize("mode", ["plain", "streamed", "two-phase", "pieces"])
def test_a_mirror_applies_a_key_change_inside_a_transaction_as_postgres_does(pg, spark, tmp_path, case, mode):
    """Issue 73, item 3: REPLICA IDENTITY changes and ADD/DROP PRIMARY KEY between the row changes of one
    transaction end equal without a stop, with the default config, whether the transaction is streamed
    in progress (protocol 2, a small logical_decoding_work_mem), prepared and committed later (two-phase),
    or applied in pieces (apply.memory_budget_mb: 1, over 1,000 row changes)."""
    create, statements = MID_TRANSACTION_KEY_CHANGES[case]
    slot = f"km_{abs(hash((case, mode))) % 100000}"
    source: dict[str, object] = {"dsn": pg.dsn, "slot": slot, "publication": "km_pub"}
    if mode == "streamed":
        source |= {"proto_version": 2, "streaming": "on"}
    elif mode == "two-phase":
        source |= {"proto_version": 3, "two_phase": True}
    apply = ApplySettings(memory_budget_mb=1) if mode == "pieces" else ApplySettings()
    config = MirrorConfig(source=SourceSettings(**source), target=TargetSettings(path=str(tmp_path / "delta")),
                          apply=apply)
    tables = [("public", "kt"), ("public", "other")]
    with pg.connect() as conn:
        conn.execute(f"{create}; CREATE TABLE other (id int PRIMARY KEY, pad text);"
                     "CREATE PUBLICATION km_pub FOR TABLE kt, other")
        conn.execute("INSERT INTO kt VALUES (1, 'a'), (1, 'a'), (2, 'b'), (3, 'c')" if "NOT NULL" in create
                     else "INSERT INTO kt VALUES (1, 'a'), (2, 'b'), (3, 'c')")
        mirror(spark, config, once=True)
        if mode == "streamed":
            conn.execute("ALTER SYSTEM SET logical_decoding_work_mem = '64kB'")
            conn.execute("SELECT pg_reload_conf()")
        big = "INSERT INTO other SELECT g, repeat('o', 200) FROM generate_series(1, 3000) g"
        if mode == "two-phase":
            conn.execute("BEGIN")
            conn.execute(big)
            for statement in statements:
                conn.execute(statement)
            conn.execute("PREPARE TRANSACTION 'km'")
            conn.execute("COMMIT PREPARED 'km'")
        else:
            with conn.transaction():
                if mode in ("streamed", "pieces"):
                    conn.execute(big)
                for statement in statements:
                    conn.execute(statement)
                if mode in ("streamed", "pieces"):
                    conn.execute("UPDATE other SET pad = 'u' WHERE id % 3 = 0")
        conn.execute("INSERT INTO other VALUES (-1, 'after')")
        lines: list[str] = []
        mirror(spark, config, once=True, progress=lines.append)
        if mode == "pieces":
            assert any(": applying piece " in line for line in lines), lines
        _assert_equal(spark, conn, tmp_path / "delta", tables)
        if mode == "streamed":
            conn.execute("ALTER SYSTEM RESET logical_decoding_work_mem")
            conn.execute("SELECT pg_reload_conf()")


def test_a_crash_between_the_parts_of_a_transaction_cut_by_a_key_change_applies_each_once(pg, spark, tmp_path):
    """Killed once the part before the key change is committed (its piece marker written), the next run
    gets the whole transaction again: the multiset part must not be applied twice (a duplicate row)."""
    import signal
    import subprocess
    import sys

    import yaml

    repo = Path(__file__).resolve().parents[2]
    target = tmp_path / "delta"
    config_file = tmp_path / "mirror.yaml"
    config_file.write_text(yaml.safe_dump({"source": {"slot": "kc_crash", "publication": "kc_crash_pub"},
                                           "target": {"path": str(target)}}))
    config = MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="kc_crash", publication="kc_crash_pub"),
                          target=TargetSettings(path=str(target)))
    with pg.connect() as conn:
        conn.execute("CREATE TABLE kt (id int NOT NULL, v text); ALTER TABLE kt REPLICA IDENTITY FULL;"
                     "CREATE PUBLICATION kc_crash_pub FOR TABLE kt")
        conn.execute("INSERT INTO kt VALUES (1, 'a'), (1, 'a'), (2, 'b')")
        mirror(spark, config, once=True)
        with conn.transaction():
            conn.execute("INSERT INTO kt VALUES (5, 'dup'), (5, 'dup')")
            conn.execute("DELETE FROM kt WHERE id = 5")
            conn.execute("INSERT INTO kt VALUES (4, 'once')")
            conn.execute("DELETE FROM kt WHERE ctid = (SELECT min(ctid) FROM kt WHERE id = 1)")
            conn.execute("ALTER TABLE kt ADD PRIMARY KEY (id)")
            conn.execute("ALTER TABLE kt REPLICA IDENTITY DEFAULT")
            conn.execute("UPDATE kt SET v = 'y' WHERE id = 2")
        env = {**os.environ, "APPLIER_DSN": pg.dsn, "PYTHONPATH": str(repo), "APPLIER_CRASH_AT": "key_run_committed:1"}
        done = subprocess.run([sys.executable, "-m", "applier.cli", "mirror", "--config", str(config_file), "--once"],
                              env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == -signal.SIGKILL, (done.returncode, done.stdout[-2000:], done.stderr[-3000:])
        mirror(spark, config, once=True)
        _assert_equal(spark, conn, target, [("public", "kt")])
        conn.execute("UPDATE kt SET v = 'later' WHERE id = 4")
        mirror(spark, config, once=True)
        _assert_equal(spark, conn, target, [("public", "kt")])
