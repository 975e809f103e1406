"""Issue 31 item 2: Spark only when needed.

``applier mirror --once`` runs the real command in-process. On a publication whose tables all have a
key and common types (delta-rs writes them), the initial copy, a run applying an UPDATE, INSERT and
DELETE, and a run with nothing to do never start Spark (``no_spark`` makes starting it a failure);
the Delta tables, read with delta-rs, equal Postgres. A key-less table (REPLICA IDENTITY FULL: a
multiset) of such types is merged by delta-rs too; one with a floating-point column (NaN and -0.0
compare differently in DataFusion) still works: Spark starts then, once, and says why.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from applier.checks.verify import compare, postgres_table_rows
from applier.cli import main

pytestmark = [pytest.mark.postgres]

deltalake = pytest.importorskip("deltalake")

SETUP = """
CREATE TABLE items (
    id bigint PRIMARY KEY, name text, qty int, price numeric(12, 2), ratio double precision, flag boolean,
    born date, seen timestamptz, at timestamp, doc jsonb, raw bytea, tags text[], uid uuid, small smallint);
INSERT INTO items SELECT g, 'item ' || g, g % 7, g * 1.25, g / 3.0, g % 2 = 0, date '2024-01-01' + g,
    timestamptz '2024-01-01 00:00:00+00' + g * interval '1 hour', timestamp '2024-01-01' + g * interval '1 minute',
    jsonb_build_object('g', g), decode(md5(g::text), 'hex'), ARRAY['a' || g, 'b'], md5(g::text)::uuid, g % 100
FROM generate_series(1, 500) g;
CREATE TABLE notes (k text PRIMARY KEY, body text);
INSERT INTO notes VALUES ('a', 'first'), ('b', NULL);
CREATE PUBLICATION pub FOR TABLE items, notes;
"""

CHANGES = """
UPDATE items SET name = 'renamed ' || id, price = price + 1, tags = NULL WHERE id % 10 = 0;
INSERT INTO items (id, name, qty, seen, doc)
    VALUES (1001, 'new', 1, now(), '{"x": [1, 2]}'), (1002, NULL, NULL, NULL, NULL);
DELETE FROM items WHERE id BETWEEN 400 AND 450;
UPDATE notes SET body = 'second' WHERE k = 'b';
INSERT INTO notes VALUES ('c', 'third');
DELETE FROM notes WHERE k = 'a';
"""


@pytest.fixture(autouse=True)
def no_dsn_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("APPLIER_DSN", raising=False)


def mirror_once(dsn: str, target: Path, capsys: pytest.CaptureFixture[str]) -> str:
    code = main(["mirror", "--once", "--dsn", dsn, "--publication", "pub", "--slot", "lazy", "--target", str(target)])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def assert_equal_to_postgres(pg: Any, target: Path, tables: list[str]) -> None:
    with pg.connect() as conn:
        for table in tables:
            names, pg_rows = postgres_table_rows(conn, "public", table)
            rows = deltalake.DeltaTable(str(target / "public" / table)).to_pyarrow_table().to_pylist()
            result = compare(f"public.{table}", pg_rows, iter([tuple(r[c] for c in names) for r in rows]))
            assert result.equal, (table, result.only_in_source[:3], result.only_in_target[:3])


def test_a_mirror_of_keyed_tables_copies_follows_and_idles_without_starting_spark(
        pg: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], no_spark: None) -> None:
    with pg.connect() as conn:
        conn.execute(SETUP)
    target = tmp_path / "delta"

    out = mirror_once(pg.dsn, target, capsys)  # the initial copy
    assert "502 rows in 2 tables" in out, out
    assert_equal_to_postgres(pg, target, ["items", "notes"])

    with pg.connect() as conn:
        conn.execute(CHANGES)
    out = mirror_once(pg.dsn, target, capsys)  # applies them
    assert "transactions applied: 1" in out, out
    assert_equal_to_postgres(pg, target, ["items", "notes"])

    out = mirror_once(pg.dsn, target, capsys)  # up to date
    assert "transactions applied: 0" in out, out
    assert_equal_to_postgres(pg, target, ["items", "notes"])


def test_a_key_less_table_merges_without_spark_and_one_with_a_float_column_starts_it_once_and_says_why(
        pg: Any, spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    started: list[object] = []

    def build(config: object, locations: tuple[str, ...] = ()) -> Any:  # the test run's session (getOrCreate
        # would return it)
        started.append(config)
        return spark

    monkeypatch.setattr("applier.spark.session.build_spark_session_for", build)
    tables = ["bag", "fbag", "keyed"]
    with pg.connect() as conn:
        conn.execute("CREATE TABLE bag (v text, n int); ALTER TABLE bag REPLICA IDENTITY FULL;"
                     "INSERT INTO bag VALUES ('a', 1), ('a', 1), ('b', 2), (NULL, 3), (NULL, 3);"
                     "CREATE TABLE fbag (x float8); ALTER TABLE fbag REPLICA IDENTITY FULL;"
                     "INSERT INTO fbag VALUES (1.5), (1.5);"
                     "CREATE TABLE keyed (id int PRIMARY KEY, v text); INSERT INTO keyed VALUES (1, 'x');"
                     "CREATE PUBLICATION pub FOR TABLE bag, fbag, keyed")
    target = tmp_path / "delta"
    mirror_once(pg.dsn, target, capsys)  # the copy: delta-rs creates and writes all three
    assert started == []
    assert_equal_to_postgres(pg, target, tables)

    with pg.connect() as conn:  # one copy of a duplicated row (NULLs included) goes, another changes
        conn.execute("DELETE FROM bag WHERE ctid = (SELECT min(ctid) FROM bag WHERE v = 'a');"
                     "UPDATE bag SET n = 4 WHERE ctid = (SELECT min(ctid) FROM bag WHERE v IS NULL);"
                     "INSERT INTO bag VALUES ('c', 3); UPDATE keyed SET v = 'y'")
    mirror_once(pg.dsn, target, capsys)  # delta-rs's multiset MERGE
    assert started == []
    assert_equal_to_postgres(pg, target, tables)

    with pg.connect() as conn:
        conn.execute("DELETE FROM fbag WHERE ctid = (SELECT min(ctid) FROM fbag); INSERT INTO bag VALUES ('d', 5)")
    with caplog.at_level(logging.INFO, logger="applier.spark"):
        mirror_once(pg.dsn, target, capsys)  # a float column's multiset: a Spark MERGE
    assert len(started) == 1
    assert any(r.getMessage().startswith("starting Spark: public.fbag: a MERGE delta-rs does not write")
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    assert_equal_to_postgres(pg, target, tables)


def test_a_replay_of_keyed_tables_creates_and_writes_them_without_starting_spark(
        pg: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], no_spark: None) -> None:
    from applier.sources.rawlog_writer import write_raw_log
    from applier.sources.sql_slot import create_slot, peek, pgoutput_options

    with pg.connect() as conn:
        conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, name text, qty int, price numeric(12, 2), "
                     "seen timestamptz, doc jsonb); CREATE PUBLICATION pub FOR TABLE items")
        create_slot(conn, "s")
        conn.execute("INSERT INTO items SELECT g, 'item ' || g, g % 7, g * 1.25, now(), jsonb_build_object('g', g) "
                     "FROM generate_series(1, 300) g")
        conn.execute("UPDATE items SET name = 'renamed ' || id, price = price + 1 WHERE id % 10 = 0;"
                     "INSERT INTO items (id, name) VALUES (1001, 'new'); DELETE FROM items WHERE id BETWEEN 40 AND 60")
        raw = tmp_path / "raw.parquet"
        write_raw_log(raw, ((m.lsn, m.xid, m.data) for m in peek(conn, "s", pgoutput_options("pub"))))
    target = tmp_path / "delta"
    for _ in range(2):  # the second replay finds everything applied
        code = main(["replay", "--source", str(raw), "--target", str(target)])
        out, err = capsys.readouterr()
        assert code == 0, err
    assert_equal_to_postgres(pg, target, ["items"])


def test_history_and_change_feed_tables_are_written_without_starting_spark(
        pg: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], no_spark: None) -> None:
    """The derived tables of a table of many types (instants with and without a zone, jsonb, bytea,
    arrays, uuid, floats): the copy, a transaction of updates, inserts and deletes, then a TRUNCATE, all
    without a JVM. What a CDC consumer makes of the feed, and the history's open versions, equal Postgres
    after each run; the history closes exactly the versions the transaction ended."""
    import yaml

    with pg.connect() as conn:
        conn.execute(SETUP)
    target = tmp_path / "delta"
    config = tmp_path / "mirror.yaml"
    config.write_text(yaml.safe_dump({
        "source": {"dsn": pg.dsn, "publication": "pub", "slot": "lazy"}, "target": {"path": str(target)},
        "tables": {"rules": [{"match": "public.items", "history": True, "changes": True}]}}))

    def derived(kind: str) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = deltalake.DeltaTable(
            str(target / kind / "public" / "items")).to_pyarrow_table().to_pylist()
        return rows

    def assert_derived_equal_postgres() -> None:
        last: dict[int, dict[str, Any]] = {}
        for change in sorted(derived("_changes"), key=lambda r: (r["__commit_lsn"], r["__ordinal"])):
            last[change["id"]] = change
        consumed = [r for r in last.values() if r["__op"] != "D"]
        opened = [r for r in derived("_history") if r["__end_lsn"] is None]
        with pg.connect() as conn:
            for what, rows in (("feed", consumed), ("history", opened)):
                names, pg_rows = postgres_table_rows(conn, "public", "items")
                result = compare(what, pg_rows, iter([tuple(r[c] for c in names) for r in rows]))
                assert result.equal, (what, result.only_in_source[:2], result.only_in_target[:2])

    for statements in (None, CHANGES, "TRUNCATE items"):
        if statements is not None:
            with pg.connect() as conn:
                conn.execute(statements)
        assert main(["mirror", "--once", "--config", str(config)]) == 0, capsys.readouterr().err
        assert_derived_equal_postgres()
        if statements == CHANGES:  # 50 updated (6 of them then deleted), 51 deleted, 2 inserted
            assert sum(r["__end_lsn"] is not None for r in derived("_history")) == 44 + 51
            assert sorted(r["__op"] for r in derived("_changes") if r["__op"] != "R") == \
                ["D"] * 51 + ["I"] * 2 + ["U"] * 50
    history = derived("_history")
    assert history and all(r["__end_lsn"] is not None and r["__end_at"] is not None for r in history)
    assert {r["__op"] for r in derived("_changes")} == {"R", "I", "U", "D"}
