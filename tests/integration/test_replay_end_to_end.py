"""Replay real PostgreSQL change streams into Delta and compare every table with Postgres, row by row.

Each test runs a workload on a real server, reads the slot with pg_logical_slot_peek_binary_changes,
stores it as a raw log, replays it with `replay_log`, and verifies the Delta tables against
Postgres's final contents (applier.checks.verify: same values through the same values layer, multiset
comparison). A second replay must write no new Delta versions.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from applier.checks.verify import verify_against_postgres
from applier.config import ApplySettings, ReplayConfig, TargetSettings
from applier.devtools.sample import create_schema, run_workload
from applier.drivers.replay import replay_log
from applier.sources.rawlog import read_raw_log
from applier.sources.rawlog_writer import write_raw_log
from applier.sources.sql_slot import create_slot, peek, pgoutput_options

pytestmark = [pytest.mark.postgres, pytest.mark.spark]
#: the tests that also run with decoding and folding on Spark's executors (conftest ``replay_path``): the
#: ones whose logs cross ranges in every way (TOAST chains, key changes, multisets, truncates, schema
#: changes, streamed and two-phase transactions). Value conversion, majors and rules are the same code
#: on either path and run on the driver only (test_random_workloads runs both paths over random logs).
both_paths = pytest.mark.usefixtures("replay_path")


def capture(conn, slot: str, options: dict[str, str], path: Path) -> Path:
    write_raw_log(path, ((m.lsn, m.xid, m.data) for m in peek(conn, slot, options)))
    return path


def delta_versions(spark, target: Path) -> dict[str, int]:
    from delta.tables import DeltaTable

    out = {}
    for log_dir in sorted(target.glob("*/*/_delta_log")):
        table = log_dir.parent
        out[f"{table.parent.name}.{table.name}"] = DeltaTable.forPath(spark, str(table)).history(1).collect()[0].version
    return out


def replay_and_verify(spark, conn, raw_log: Path, target: Path, tables, **apply) -> None:
    cfg = ReplayConfig(source_log=str(raw_log), target=TargetSettings(path=str(target)), apply=ApplySettings(**apply))
    summary = replay_log(spark, cfg)
    assert summary.transactions > 0
    results = verify_against_postgres(spark, conn, str(target), tables)
    bad = [(r.source_name, r.only_in_source[:3], r.only_in_target[:3]) for r in results if not r.equal]
    assert not bad, bad
    assert all(r.source_rows == r.target_rows for r in results)
    # Exactly once: the same log again changes nothing.
    before = delta_versions(spark, target)
    again = replay_log(spark, cfg)
    assert again.transactions == summary.transactions
    assert delta_versions(spark, target) == before


SHOP = [("shop", "customers"), ("shop", "products"), ("shop", "orders"), ("shop", "events")]


@both_paths
def test_sample_workload_grouped_replay_equals_postgres(pg, spark, tmp_path, caplog):
    caplog.set_level("INFO", logger="applier.sink.engine")
    with pg.connect() as conn:
        create_schema(conn, "pub")
        create_slot(conn, "s")
        run_workload(conn, transactions=60, seed=11)
        raw = capture(conn, "s", pgoutput_options("pub"), tmp_path / "raw.parquet")
        lines: list[str] = []
        dry = replay_log(spark, ReplayConfig(source_log=str(raw), target=TargetSettings(path=str(tmp_path / "delta"))),
                         dry_run=lines.append)
        assert dry.dry_run and not (tmp_path / "delta").exists()  # nothing written, not even state
        assert {line.split(" ")[0] for line in lines} == {
            "shop.customers", "shop.products", "shop.orders", "shop.events"}
        assert any("TRUNCATE" in line for line in lines if line.startswith("shop.events"))
        replay_and_verify(spark, conn, raw, tmp_path / "delta", SHOP, grouping="grouped", max_group_transactions=25,
                          optimize_every_commits=2)
    # Compaction ran after every 2nd commit to a table (Delta records an OPTIMIZE commit only when a
    # table has files to compact, so the history alone cannot show it).
    optimized = [r.getMessage() for r in caplog.records if "OPTIMIZE after" in r.getMessage()]
    assert any(m.startswith("shop.orders: OPTIMIZE after 2 commits") for m in optimized), optimized


def test_binary_values_replay_equals_postgres(pg, spark, tmp_path):
    with pg.connect() as conn:
        create_schema(conn, "pub")
        create_slot(conn, "s")
        run_workload(conn, transactions=20, seed=5)
        raw = capture(conn, "s", pgoutput_options("pub", binary=True), tmp_path / "raw.parquet")
        replay_and_verify(spark, conn, raw, tmp_path / "delta", SHOP)
    # the progress lines count the log's messages against its total, with a rate
    lines: list[str] = []
    replay_log(spark, ReplayConfig(source_log=str(raw), target=TargetSettings(path=str(tmp_path / "delta"))),
               progress=lines.append, progress_every=0.0)
    total = sum(1 for _ in read_raw_log(str(raw)))
    assert any(line.startswith(f"{total:,} messages of {total:,} (100%), ") for line in lines), lines[-3:]
    # and the same numbers as fields (what --log-format json prints and a terminal's bar draws)
    last = next(line for line in reversed(lines) if line.startswith(f"{total:,} messages of"))
    assert last.fields["task"] == "replay" and last.fields["done"] == last.fields["total"] == total  # type: ignore[attr-defined]


def test_strict_per_transaction_mode_equals_postgres(pg, spark, tmp_path):
    with pg.connect() as conn:
        create_schema(conn, "pub")
        create_slot(conn, "s")
        run_workload(conn, transactions=4, seed=3)
        raw = capture(conn, "s", pgoutput_options("pub"), tmp_path / "raw.parquet")
        replay_and_verify(spark, conn, raw, tmp_path / "delta", SHOP, grouping="transaction")


EDGE_SCHEMA = '''
CREATE TABLE kv (id int PRIMARY KEY, big text, n numeric(20,5), ts timestamptz, tags int[], doc jsonb, raw bytea);
CREATE TABLE bag (a int, b text);            -- no key: a multiset with duplicates
ALTER TABLE bag REPLICA IDENTITY FULL;
CREATE TABLE parent (id int PRIMARY KEY);
CREATE TABLE child (id int PRIMARY KEY, parent_id int REFERENCES parent (id));
CREATE TABLE "Odd ""name""" ("the key" int PRIMARY KEY, "a,b" text);
CREATE PUBLICATION pub FOR ALL TABLES;
'''


def edge_workload(conn) -> None:
    big = "x" * 30000  # TOASTed: 'u' when unchanged
    conn.execute("INSERT INTO kv SELECT g, %s || g, g * 1.5, '2026-01-01 00:00:00+00', ARRAY[g, NULL], "
                 "jsonb_build_object('g', g), '\\x00ff'::bytea FROM generate_series(1, 20) g", (big,))
    with conn.transaction():
        conn.execute("UPDATE kv SET n = n + 1 WHERE id <= 5")          # 'u' for big
        conn.execute("UPDATE kv SET id = id + 100 WHERE id IN (1, 2)")  # key change + 'u'
        conn.execute("UPDATE kv SET n = NULL WHERE id = 101")           # chained on the new key
        conn.execute("DELETE FROM kv WHERE id = 3")
        conn.execute("INSERT INTO kv (id, big) VALUES (3, 'back')")     # delete + re-insert same key
    conn.execute("INSERT INTO bag VALUES (1, 'dup'), (1, 'dup'), (1, 'dup'), (2, NULL)")
    conn.execute("DELETE FROM bag WHERE ctid = (SELECT ctid FROM bag WHERE a = 1 LIMIT 1)")
    conn.execute("UPDATE bag SET b = 'changed' WHERE ctid = (SELECT ctid FROM bag WHERE a = 1 LIMIT 1)")
    conn.execute("INSERT INTO parent SELECT generate_series(1, 3)")
    conn.execute("INSERT INTO child SELECT g, g FROM generate_series(1, 3) g")
    with conn.transaction():
        conn.execute("INSERT INTO child VALUES (10, 1)")
        conn.execute("TRUNCATE parent RESTART IDENTITY CASCADE")         # lists child too
        conn.execute("INSERT INTO parent VALUES (7)")
        conn.execute("INSERT INTO child VALUES (8, 7)")
    conn.execute('INSERT INTO "Odd ""name""" VALUES (1, \'comma,here\')')
    conn.execute("ALTER TABLE kv ADD COLUMN extra text")
    conn.execute("UPDATE kv SET extra = 'added' WHERE id = 4")
    conn.execute("ALTER TABLE kv ALTER COLUMN n TYPE numeric(24,5)")
    conn.execute("UPDATE kv SET n = 123456789.12345 WHERE id = 5")


EDGE_TABLES = [("public", "kv"), ("public", "bag"), ("public", "parent"), ("public", "child"), ("public", 'Odd "name"')]


# Both paths for the grouped replay; one transaction a commit only on the driver: a replay in that mode
# never folds on executors (applier.drivers.executors.eligibility: folds_unfit), so the executors run of
# it would be the driver run again.
@pytest.mark.parametrize(("replay_path", "grouping"),
                         [("driver", "grouped"), ("executors", "grouped"), ("driver", "transaction")],
                         indirect=["replay_path"])
def test_toast_key_changes_multisets_truncate_cascade_and_schema_changes(pg, spark, tmp_path, replay_path, grouping):
    with pg.connect() as conn:
        conn.execute(EDGE_SCHEMA)
        create_slot(conn, "s")
        edge_workload(conn)
        raw = capture(conn, "s", pgoutput_options("pub"), tmp_path / "raw.parquet")
        replay_and_verify(spark, conn, raw, tmp_path / "delta", EDGE_TABLES, grouping=grouping)
    from delta.tables import DeltaTable

    for table in ("parent", "child"):
        detail = DeltaTable.forPath(spark, str(tmp_path / "delta" / "public" / table)).detail()
        props = detail.collect()[0]["properties"]
        assert props.get("applier.restartIdentityLsn"), table
        # Both bits reach the sink: the Delta commit that emptied the table says what Postgres did.
        history = DeltaTable.forPath(spark, str(tmp_path / "delta" / "public" / table)).history()
        metadata = [r["userMetadata"] or "" for r in history.select("userMetadata").collect()]
        assert any(m.endswith("TRUNCATE CASCADE RESTART IDENTITY") for m in metadata), (table, metadata)


@both_paths
def test_streamed_transactions_with_subtransaction_and_top_level_aborts(pg, spark, tmp_path):
    with pg.connect() as conn:
        conn.execute(EDGE_SCHEMA)
        create_slot(conn, "s")
        with conn.transaction():  # > 64kB: streamed in chunks; a savepoint rolled back inside
            conn.execute("INSERT INTO kv (id, big) SELECT g, repeat('s', 500) FROM generate_series(1000, 1400) g")
            conn.execute("SAVEPOINT a")
            conn.execute("INSERT INTO kv (id, big) SELECT g, repeat('t', 500) FROM generate_series(2000, 2400) g")
            conn.execute("ROLLBACK TO SAVEPOINT a")
            conn.execute("UPDATE kv SET big = 'after savepoint' WHERE id = 1000")
        try:
            with conn.transaction():  # streamed, then aborted as a whole
                conn.execute("INSERT INTO kv (id, big) SELECT g, repeat('u', 500) FROM generate_series(3000, 3400) g")
                raise RuntimeError("roll back")
        except RuntimeError:
            pass
        conn.execute("INSERT INTO kv (id) VALUES (1)")  # a commit after the abort makes it visible to peek
        raw = capture(conn, "s", pgoutput_options("pub", proto_version=2, streaming="on"), tmp_path / "raw.parquet")
        replay_and_verify(spark, conn, raw, tmp_path / "delta", [("public", "kv")])


def test_two_phase_commit_rollback_and_pending_prepared(pg, spark, tmp_path, replay_path):
    """Prepared transactions committed, rolled back, streamed, and one still pending at the log's end
    (staged, not applied). The pending one comes last: nothing after a PREPARE can be cut into a range
    until its COMMIT PREPARED, so with it first the executors case folded no range there."""
    with pg.connect() as conn:
        conn.execute(EDGE_SCHEMA)
        create_slot(conn, "s", two_phase=True)

        def prepare(gid: str, ids: tuple[int, ...], finish: str | None) -> None:
            conn.execute("BEGIN")
            for i in ids:
                conn.execute("INSERT INTO kv (id, big) VALUES (%s, %s)", (i, gid))
            conn.execute(f"PREPARE TRANSACTION '{gid}'")
            if finish:
                conn.execute(f"{finish} PREPARED '{gid}'")

        prepare("g-commit", (1, 2), "COMMIT")
        prepare("g-rollback", (3, 4), "ROLLBACK")
        conn.execute("BEGIN")  # a big streamed prepared transaction, committed
        conn.execute("INSERT INTO kv (id, big) SELECT g, repeat('p', 500) FROM generate_series(100, 400) g")
        conn.execute("PREPARE TRANSACTION 'g-streamed'")
        conn.execute("COMMIT PREPARED 'g-streamed'")
        prepare("g-pending", (5,), None)
        raw = capture(conn, "s", pgoutput_options("pub", proto_version=3, streaming="on"), tmp_path / "raw.parquet")
        replay_and_verify(spark, conn, raw, tmp_path / "delta", [("public", "kv")])
        assert (tmp_path / "delta" / "_applier" / "prepared").is_dir()
        conn.execute("ROLLBACK PREPARED 'g-pending'")
    if replay_path.name == "executors":
        assert sum(replay_path.ranges) > 0, replay_path


def test_every_postgres_major_replays_equal(pg_any, spark, tmp_path):
    """PG 15 (Debian) with protocol 3 + streaming, PG 16 and 18 (wheels) with protocol 4 'parallel'."""
    with pg_any.connect() as conn:
        conn.execute(EDGE_SCHEMA)
        create_slot(conn, "s")
        edge_workload(conn)
        with conn.transaction():  # > logical_decoding_work_mem (64kB): streamed, savepoint rolled back inside
            conn.execute("INSERT INTO kv (id, big) SELECT g, repeat('s', 300) FROM generate_series(5000, 5300) g")
            conn.execute("SAVEPOINT a")
            conn.execute("DELETE FROM kv WHERE id > 5100")
            conn.execute("ROLLBACK TO SAVEPOINT a")
        options = (pgoutput_options("pub", proto_version=4, streaming="parallel") if pg_any.major >= 16
                   else pgoutput_options("pub", proto_version=3, streaming="on"))
        raw = capture(conn, "s", options, tmp_path / "raw.parquet")
        kinds = {m.data[:1] for m in read_raw_log(raw)}
        assert {b"S", b"E", b"c"} <= kinds  # it really streamed
        replay_and_verify(spark, conn, raw, tmp_path / "delta", EDGE_TABLES)


def test_excluded_columns_and_a_rule_key_are_honoured(pg, spark, tmp_path):
    """``tables.rules``: an excluded column never reaches Delta (also after ALTER TABLE), and a table
    without a primary key merges on the rule's key_columns."""
    from applier.config import TableRule, TablesSettings

    with pg.connect() as conn:
        conn.execute("CREATE TABLE public.acct (id int PRIMARY KEY, secret text, v int);"
                     "CREATE TABLE public.nokey (code text NOT NULL, qty int);"
                     "ALTER TABLE public.nokey REPLICA IDENTITY FULL;"
                     "CREATE PUBLICATION pub FOR TABLE public.acct, public.nokey")
        create_slot(conn, "s")
        conn.execute("INSERT INTO acct SELECT g, 'pw' || g, g FROM generate_series(1, 20) g;"
                     "INSERT INTO nokey VALUES ('a', 1), ('b', 2)")
        conn.execute("UPDATE acct SET secret = 'changed', v = v * 10 WHERE id <= 5; DELETE FROM acct WHERE id = 20;"
                     "UPDATE nokey SET qty = 5 WHERE code = 'a'")
        conn.execute("ALTER TABLE acct ADD COLUMN w int; UPDATE acct SET w = id, secret = 'again' WHERE id > 15")
        raw = capture(conn, "s", pgoutput_options("pub"), tmp_path / "raw.parquet")
        catalog_name = f"default.nokey_{tmp_path.name.replace('-', '_')}"
        tables = TablesSettings(rules=[TableRule(match="public.acct", exclude_columns=["secret"]),
                                       TableRule(match="public.nokey", key_columns=["code"], table=catalog_name,
                                                 target=str(tmp_path / "elsewhere"))])
        target = tmp_path / "delta"
        cfg = ReplayConfig(source_log=str(raw), target=TargetSettings(path=str(target)), tables=tables)
        try:
            replay_log(spark, cfg)
            acct = spark.read.format("delta").load(str(target / "public" / "acct"))
            assert acct.columns == ["id", "v", "w"]
            want = {tuple(r) for r in conn.execute("SELECT id, v, w FROM acct").fetchall()}
            assert {tuple(r) for r in acct.collect()} == want
            assert sorted(tuple(r) for r in spark.table(catalog_name).collect()) == [("a", 5), ("b", 2)]
            assert not (target / "public" / "nokey").exists()
            results = verify_against_postgres(spark, conn, str(target), [("public", "acct"), ("public", "nokey")],
                                              tables)
            assert all(r.equal and r.source_rows > 0 for r in results), results
            def versions() -> tuple:
                history = spark.sql(f"DESCRIBE HISTORY {catalog_name} LIMIT 1").first()
                return delta_versions(spark, target), history["version"]

            before = versions()
            replay_log(spark, cfg)  # the catalog name now exists: resolved to its location, nothing rewritten
            assert versions() == before
        finally:
            spark.sql(f"DROP TABLE IF EXISTS {catalog_name}")
        with pytest.raises(Exception, match="key column cannot be excluded"):
            bad = TablesSettings(rules=[TableRule(match="public.acct", exclude_columns=["id"])])
            replay_log(spark, ReplayConfig(source_log=str(raw), target=TargetSettings(path=str(tmp_path / "d2")),
                                           tables=bad))


SPECIAL_ROWS = (
    "INSERT INTO sv VALUES (1, 'infinity', '-infinity', '2026-01-01 12:00+00', 'NaN', '24:00:00', 'NaN');"
    "INSERT INTO sv VALUES (2, '0044-03-15 BC', '10000-01-01 00:00', 'infinity', '-Infinity', '12:00', '1.50');"
    "INSERT INTO sv VALUES (3, '2026-11-22', '2026-11-22 10:11:12', '-infinity', 1.5, '00:00', '-Infinity');"
    "UPDATE sv SET f = 'Infinity' WHERE id = 3"
)


@pytest.mark.parametrize("policy", ["error", "null", "clamp"])
def test_special_values_under_each_policy(pg, spark, tmp_path, policy):
    """The special-value policy end to end: 'error' stops naming the column and the LSN; 'null' and
    'clamp' store what docs/types.md's table says; values Spark holds (float NaN/±Infinity, 24:00:00,
    numeric NaN in a text-mapped numeric) are kept under every policy."""
    from applier.errors import ApplierError

    with pg.connect() as conn:
        conn.execute("CREATE TABLE sv (id int PRIMARY KEY, d date, ts timestamp, tz timestamptz, f float8, t time,"
                     " n numeric); CREATE PUBLICATION pub FOR TABLE sv")
        create_slot(conn, "s")
        conn.execute(SPECIAL_ROWS)
        raw = capture(conn, "s", pgoutput_options("pub"), tmp_path / "raw.parquet")
    target = tmp_path / "delta"
    cfg = ReplayConfig(source_log=str(raw), target=TargetSettings(path=str(target)),
                       apply=ApplySettings(special_values=policy))
    if policy == "error":
        with pytest.raises(ApplierError, match="cannot hold") as e:
            replay_log(spark, cfg)
        assert e.value.column == "d" and e.value.lsn is not None, e.value.context
        return
    replay_log(spark, cfg)
    # Compared as Spark's own strings (session time zone UTC): Python's datetime cannot convert year-1
    # timestamps back from epoch microseconds, so collect() of a clamped value would fail in pyspark.
    frame = spark.read.format("delta").load(str(target / "public" / "sv"))
    got = {r["id"]: r for r in frame.selectExpr("id", "string(d) AS d", "string(ts) AS ts", "string(tz) AS tz",
                                                "f", "t", "n").collect()}
    clamp = policy == "clamp"
    low_d, high_d = ("0001-01-01", "9999-12-31") if clamp else (None, None)
    low_ts, high_ts = ("0001-01-01 00:00:00", "9999-12-31 23:59:59.999999") if clamp else (None, None)
    assert [got[i]["d"] for i in (1, 2, 3)] == [high_d, low_d, "2026-11-22"]
    assert [got[i]["ts"] for i in (1, 2, 3)] == [low_ts, high_ts, "2026-11-22 10:11:12"]
    assert [got[i]["tz"] for i in (1, 2, 3)] == ["2026-01-01 12:00:00", high_ts, low_ts]
    f = [got[i]["f"] for i in (1, 2, 3)]
    assert f[0] != f[0] and f[1:] == [float("-inf"), float("inf")]
    assert [got[i]["t"] for i in (1, 2, 3)] == ["24:00:00", "12:00:00", "00:00:00"]
    assert [got[i]["n"] for i in (1, 2, 3)] == ["NaN", "1.50", "-Infinity"]
