"""The life of a real schema on a live mirror (issue 30): renames of columns, tables and schemas, a
name reused by a new table. Each workload runs on a real PostgreSQL, is mirrored with ``mirror --once``
before and after the DDL, and every table is compared with Postgres row by row; a run that cannot
follow a change must stop (exit 4), never end with a difference."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import deltalake
import pytest

from applier.catalog.relations import rename_candidates
from applier.checks.verify import verify_against_postgres
from applier.commands.exitcodes import ExitCode, for_exception
from applier.config import ApplySettings, MirrorConfig, SourceSettings, TargetSettings
from applier.drivers.mirror import mirror
from applier.sink.identity import IdentityError, TableIdentities
from applier.sink.naming import table_location
from applier.sink.targets import TableTargets
from applier.state import StateDir

pytestmark = [pytest.mark.postgres, pytest.mark.spark]


def _config(pg, target: Path) -> MirrorConfig:
    return MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="life", publication="life_pub"),
                        target=TargetSettings(path=str(target)),
                        apply=ApplySettings(max_group_transactions=50, max_group_seconds=1.0))


def _assert_equal(spark, conn, target: Path, tables: list[tuple[str, str]]) -> None:
    for result in verify_against_postgres(spark, conn, str(target), tables):
        assert result.equal, (result.source_name, result.source_rows, result.target_rows,
                              result.only_in_source[:3], result.only_in_target[:3])


def _rows(spark, path: Path, order: str = "id") -> list[tuple]:
    return [tuple(r) for r in spark.read.format("delta").load(str(path)).orderBy(order).collect()]


def test_a_renamed_column_keeps_its_values(pg, spark, tmp_path):
    target = tmp_path / "delta"
    with pg.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, a text, n int)")
        conn.execute("INSERT INTO t SELECT g, 'v' || g, g FROM generate_series(1, 20) g")
        conn.execute("CREATE PUBLICATION life_pub FOR ALL TABLES")
        mirror(spark, _config(pg, target), once=True)
        conn.execute("ALTER TABLE t RENAME COLUMN a TO b")
        conn.execute("UPDATE t SET n = n + 100 WHERE id <= 5")
        conn.execute("INSERT INTO t VALUES (21, 'new', 21)")
        mirror(spark, _config(pg, target), once=True)
        _assert_equal(spark, conn, target, [("public", "t")])
        path = Path(table_location(target, "public", "t"))
        columns = spark.read.format("delta").load(str(path)).columns
        assert "b" in columns and "a" not in columns
        assert _rows(spark, path)[9][1] == "v10"  # an untouched row kept its value under the new name


def test_a_dropped_and_added_column_is_not_a_rename(pg, spark, tmp_path):
    target = tmp_path / "delta"
    with pg.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, a text)")
        conn.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 10) g")
        conn.execute("CREATE PUBLICATION life_pub FOR ALL TABLES")
        mirror(spark, _config(pg, target), once=True)
        conn.execute("ALTER TABLE t DROP COLUMN a")
        conn.execute("ALTER TABLE t ADD COLUMN b text")
        conn.execute("UPDATE t SET b = 'x' WHERE id = 1")
        mirror(spark, _config(pg, target), once=True)
        _assert_equal(spark, conn, target, [("public", "t")])
        rows = {r["id"]: r["b"] for r in spark.read.format("delta").load(
            str(Path(table_location(target, "public", "t")))).collect()}
        assert rows[1] == "x" and rows[2] is None  # never the dropped column's values


def test_a_renamed_table_whose_name_is_reused_keeps_two_delta_tables(pg, spark, tmp_path):
    target = tmp_path / "delta"
    with pg.connect() as conn:
        conn.execute("CREATE TABLE t1 (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t1 SELECT g, 'old' || g FROM generate_series(1, 5) g")
        conn.execute("CREATE PUBLICATION life_pub FOR ALL TABLES")
        mirror(spark, _config(pg, target), once=True)
        conn.execute("ALTER TABLE t1 RENAME TO t2")
        conn.execute("CREATE TABLE t1 (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t1 VALUES (1, 'new1'), (100, 'new100')")
        conn.execute("INSERT INTO t2 VALUES (6, 'old6')")
        conn.execute("UPDATE t2 SET v = 'changed' WHERE id = 1")
        mirror(spark, _config(pg, target), once=True)
        _assert_equal(spark, conn, target, [("public", "t1"), ("public", "t2")])
        # a later run goes on with both, exactly
        conn.execute("INSERT INTO t1 VALUES (2, 'new2')")
        conn.execute("DELETE FROM t2 WHERE id = 2")
        mirror(spark, _config(pg, target), once=True)
        _assert_equal(spark, conn, target, [("public", "t1"), ("public", "t2")])
        assert len(_rows(spark, Path(table_location(target, "public", "t1")))) == 3


def test_a_renamed_schema_whose_name_is_reused(pg, spark, tmp_path):
    target = tmp_path / "delta"
    with pg.connect() as conn:
        conn.execute("CREATE SCHEMA sch1")
        conn.execute("CREATE TABLE sch1.t1 (a int PRIMARY KEY)")
        conn.execute("INSERT INTO sch1.t1 VALUES (1), (2)")
        conn.execute("CREATE PUBLICATION life_pub FOR ALL TABLES")
        mirror(spark, _config(pg, target), once=True)
        conn.execute("ALTER SCHEMA sch1 RENAME TO sch2")
        conn.execute("CREATE SCHEMA sch1")
        conn.execute("CREATE TABLE sch1.t1 (a int PRIMARY KEY)")
        conn.execute("INSERT INTO sch1.t1 VALUES (3)")
        conn.execute("INSERT INTO sch2.t1 VALUES (4)")
        mirror(spark, _config(pg, target), once=True)
        _assert_equal(spark, conn, target, [("sch1", "t1"), ("sch2", "t1")])
        assert _rows(spark, Path(table_location(target, "sch1", "t1")), "a") == [(3,)]


def test_a_renamed_table_leaves_no_stale_table_behind(pg, spark, tmp_path):
    target = tmp_path / "delta"
    with pg.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t SELECT g, 'v' FROM generate_series(1, 5) g")
        conn.execute("CREATE SCHEMA other")
        conn.execute("CREATE PUBLICATION life_pub FOR ALL TABLES")
        mirror(spark, _config(pg, target), once=True)
        conn.execute("ALTER TABLE t RENAME TO t_renamed")
        conn.execute("ALTER TABLE t_renamed SET SCHEMA other")
        conn.execute("INSERT INTO other.t_renamed VALUES (6, 'w')")
        mirror(spark, _config(pg, target), once=True)
        _assert_equal(spark, conn, target, [("other", "t_renamed")])
        assert not (Path(table_location(target, "public", "t")) / "_delta_log").exists()
        assert (Path(table_location(target, "other", "t_renamed")) / "_delta_log").is_dir()


def test_a_dropped_table_whose_name_is_reused_is_retired(pg, spark, tmp_path):
    target = tmp_path / "delta"
    with pg.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t SELECT g, 'old' FROM generate_series(1, 5) g")
        conn.execute("CREATE PUBLICATION life_pub FOR ALL TABLES")
        mirror(spark, _config(pg, target), once=True)
        conn.execute("DROP TABLE t")
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t VALUES (1, 'new')")
        mirror(spark, _config(pg, target), once=True)
        _assert_equal(spark, conn, target, [("public", "t")])
        retired = list((target / "_retired" / "public").iterdir())
        assert len(retired) == 1 and retired[0].name.startswith("t@")


def test_without_a_catalog_a_reused_name_stops(tmp_path):
    """A stored log has no catalog to ask: a new relation taking a mirrored name stops the run."""
    from applier.config import TablesSettings

    target = tmp_path / "delta"
    state = StateDir.for_target(target)
    ids = TableIdentities(state, TableTargets(None, str(target), TablesSettings()))
    path = ids.path_of(16384, "public", "t")
    (Path(path) / "_delta_log").mkdir(parents=True)
    assert ids.path_of(16384, "public", "t") == path
    with pytest.raises(IdentityError, match="renamed or dropped"):
        ids.path_of(16999, "public", "t")
    # [id, a] -> [id, b]: a rename or a drop and an add. Noted as undecided, not decided; the sink stops
    # when it applies a change past it (a table copied again past it goes on)
    assert ids.columns_changed(16384, "public.t", ("a",), ("b",), rename_candidates(["id", "a"], ["id", "b"])) == {}
    with pytest.raises(IdentityError, match="no catalog to ask") as stopped:
        ids.renames_for(16384, "public.t", ("a",), ("b",), {"a": ("b",)})
    assert stopped.value.context["table"] == "public.t" and for_exception(stopped.value) == ExitCode.BAD_DATA
    ids.copied_anew(16384)  # a fresh copy (applier resync): the undecided change is behind it
    # [id, a, n] -> [id, n, b]: b comes after n, so it was added; a was dropped, provably, without a catalog
    assert rename_candidates(["id", "a", "n"], ["id", "n", "b"]) == {}
    assert ids.columns_changed(16384, "public.t", ("a",), ("b",), {}) == {}
    with pytest.raises(IdentityError, match="no catalog told"):  # the sink never guesses either
        ids.renames_for(16384, "public.t", ("x",), ("y",), {"x": ("y",)})
    assert ids.renames_for(16384, "public.t", ("a",), ("b",), {"a": ("b",)}) == {}  # noted as dropped


def test_identity_lookups_by_name_and_path_follow_every_change_of_the_bindings(tmp_path):
    """bound_by_name and holder_of answer from indexes: after each bind, rename, swap (parking), retire
    and reload from relations.json they answer what a scan of every binding answers."""
    from applier.config import TablesSettings
    from applier.sink.identity import Bound

    def there(bound: Bound | None) -> Bound:
        assert bound is not None
        return bound

    class Catalog:
        def __init__(self) -> None:
            self.names: dict[int, tuple[str, str]] = {}

        def relation(self, oid: int) -> tuple[str, str] | None:
            return self.names.get(oid)

        def attnums(self, oid: int) -> dict[str, int]:
            return {}

        def dropped_attnums(self, oid: int) -> set[int]:
            return set()

        def rewrite_witness(self, oid: int, columns: Sequence[str]) -> None:
            return None

        def rewritten_rows(self, oid: int, key: Sequence[str], columns: Sequence[str],
                           xid: str) -> Iterator[tuple[str | None, ...]]:
            return iter(())

    target = tmp_path / "delta"
    state = StateDir.for_target(target)
    catalog = Catalog()
    moves: list[tuple[str, str]] = []

    def make(lookup: Catalog | None = catalog) -> TableIdentities:
        return TableIdentities(state, TableTargets(None, str(target), TablesSettings()), lookup=lookup,
                               mover=lambda src, dst, _old, _new: moves.append((src, dst)))

    def check(ids: TableIdentities) -> None:
        bindings = list(ids._bound.values())
        keys = {b.name for b in bindings} | {"public.nope"}
        for name in keys:
            assert ids.bound_by_name(name) is next((b for b in bindings if b.name == name and not b.retired), None)
        for path in {b.path for b in bindings} | {str(target / "public" / "nope")}:
            assert ids.holder_of(path) is next((b for b in bindings if b.path == path), None), path
        assert {n for n, oids in ids._by_name.items() if oids} == {b.name for b in bindings if not b.retired}
        assert set(ids._by_path) == {b.path for b in bindings}
        reloaded = make()  # and the same from relations.json
        assert {o: (b.name, b.path, b.retired) for o, b in reloaded._bound.items()} == \
            {o: (b.name, b.path, b.retired) for o, b in ids._bound.items()}
        assert reloaded._by_name == ids._by_name and reloaded._by_path == ids._by_path

    def delta(path: str) -> None:
        (Path(path) / "_delta_log").mkdir(parents=True, exist_ok=True)

    ids = make()
    for oid, name in ((1, "t1"), (2, "t2"), (3, "t3")):
        catalog.names[oid] = ("public", name)
        delta(ids.path_of(oid, "public", name))
    check(ids)
    catalog.names[1] = ("public", "t1b")  # a rename: the table moves
    assert ids.path_of(1, "public", "t1b") == str(target / "public" / "t1b")
    assert ids.bound_by_name("public.t1") is None and there(ids.bound_by_name("public.t1b")).oid == 1
    assert ids.holder_of(str(target / "public" / "t1")) is None
    check(ids)
    catalog.names[2], catalog.names[3] = ("public", "t3"), ("public", "t2")  # names swapped: one is parked
    assert ids.path_of(2, "public", "t3") == str(target / "public" / "t3")
    assert there(ids.bound_by_name("public.t3")).oid == 2 and there(ids.bound_by_name("public.t2")).oid == 3
    assert any(".parking" in dst for _src, dst in moves)
    check(ids)
    del catalog.names[2]  # dropped, and its name taken by a new table: retired
    catalog.names[4] = ("public", "t3")
    delta(ids.path_of(4, "public", "t3"))
    assert there(ids.bound(2)).retired and there(ids.bound_by_name("public.t3")).oid == 4
    assert there(ids.holder_of(there(ids.bound(2)).path)).oid == 2
    check(ids)
    catalog.names[5] = ("public", "t5")  # bound before its Delta table exists, then renamed: no move
    ids.path_of(5, "public", "t5")
    catalog.names[5] = ("public", "t6")
    assert ids.path_of(5, "public", "t6") == str(target / "public" / "t6")
    assert ids.bound_by_name("public.t5") is None and ids.holder_of(str(target / "public" / "t5")) is None
    check(ids)


def test_the_cli_follows_a_rename_and_its_registry_check_passes_afterwards(pg, tmp_path):
    """Through the CLI (which keeps the target registry, tables.json): a moved table is not reported as
    gone on the next run, and status lists it under its new name only."""
    import os
    import subprocess
    import sys

    import yaml

    target = tmp_path / "delta"
    config = tmp_path / "mirror.yaml"
    config.write_text(yaml.safe_dump({"source": {"slot": "life", "publication": "life_pub"},
                                      "target": {"path": str(target)}}))
    env = {**os.environ, "APPLIER_DSN": pg.dsn, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "applier.cli", *args, "--config", str(config)], env=env,
                              capture_output=True, text=True, timeout=600)

    with pg.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t VALUES (1, 'a')")
        conn.execute("CREATE PUBLICATION life_pub FOR ALL TABLES")
        assert run("mirror", "--once").returncode == 0
        conn.execute("ALTER TABLE t RENAME TO t2")
        conn.execute("INSERT INTO t2 VALUES (2, 'b')")
        second = run("mirror", "--once")
        assert second.returncode == 0, second.stderr[-3000:]
        conn.execute("INSERT INTO t2 VALUES (3, 'c')")
        third = run("mirror", "--once")
        assert third.returncode == 0, third.stderr[-3000:]
        registry = json.loads((target / "_applier" / "tables.json").read_text())
        assert [e["table"] for e in registry.values()] == ["public.t2"]
        status = run("status", "--json")
        assert status.returncode == 0, status.stderr[-3000:]
        tables = [t["table"] for t in json.loads(status.stdout)["tables"]]
        assert tables == ["public.t2"]


def test_a_rename_killed_mid_move_then_its_old_name_reused_ends_equal_to_postgres(pg, tmp_path):
    """SIGKILL after the renamed table's directory moved, before its app id and the table sync's records
    followed: the restart finishes the move, knows the table as copied under its new name, and copies
    the new table that took the old name from the stream."""
    import os
    import subprocess
    import sys

    import yaml
    from deltalake import DeltaTable

    target = tmp_path / "delta"
    config = tmp_path / "mirror.yaml"
    config.write_text(yaml.safe_dump({"source": {"slot": "life_kill", "publication": "life_kill_pub"},
                                      "target": {"path": str(target)}}))
    env = {**os.environ, "APPLIER_DSN": pg.dsn, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}

    def run(*extra: str, **more_env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "applier.cli", "mirror", "--once", "--config", str(config),
                               *extra], env={**env, **more_env}, capture_output=True, text=True, timeout=600)

    with pg.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 20) g")
        conn.execute("CREATE PUBLICATION life_kill_pub FOR ALL TABLES")
        assert run().returncode == 0
        conn.execute("ALTER TABLE t RENAME TO t2")
        conn.execute("UPDATE t2 SET v = 'after' WHERE id <= 5")
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, w int)")
        conn.execute("INSERT INTO t VALUES (1, 100), (2, 200)")
        killed = run(APPLIER_CRASH_AT="table_moved:1")
        assert killed.returncode == -9, killed.stderr[-3000:]
        done = run()
        assert done.returncode == 0, done.stderr[-3000:]
        assert "public.t2 joined the publication" not in done.stderr, done.stderr  # known: not copied again
        for name, columns in (("t2", "id, v"), ("t", "id, w")):
            expected = sorted(conn.execute(f"SELECT {columns} FROM {name}").fetchall())
            rows = DeltaTable(str(target / "public" / name)).to_pyarrow_table().to_pylist()
            assert sorted(tuple(r.values()) for r in rows) == expected, name


def test_two_tables_that_swap_names_keep_their_rows(pg, spark, tmp_path):
    target = tmp_path / "delta"
    with pg.connect() as conn:
        conn.execute("CREATE TABLE t1 (id int PRIMARY KEY, v text)")
        conn.execute("CREATE TABLE t2 (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t1 VALUES (1, 'one')")
        conn.execute("INSERT INTO t2 VALUES (2, 'two')")
        conn.execute("CREATE PUBLICATION life_pub FOR ALL TABLES")
        mirror(spark, _config(pg, target), once=True)
        conn.execute("ALTER TABLE t1 RENAME TO tmp")
        conn.execute("ALTER TABLE t2 RENAME TO t1")
        conn.execute("ALTER TABLE tmp RENAME TO t2")
        conn.execute("INSERT INTO t1 VALUES (3, 'three')")
        conn.execute("INSERT INTO t2 VALUES (4, 'four')")
        mirror(spark, _config(pg, target), once=True)
        _assert_equal(spark, conn, target, [("public", "t1"), ("public", "t2")])
        assert _rows(spark, Path(table_location(target, "public", "t1"))) == [(2, "two"), (3, "three")]


def _replay_captured(spark, conn, tmp_path: Path) -> Path:
    from applier.config import ReplayConfig
    from applier.drivers.replay import replay_log
    from applier.sources.rawlog_writer import write_raw_log
    from applier.sources.sql_slot import peek, pgoutput_options

    raw = tmp_path / "raw.parquet"
    write_raw_log(raw, ((m.lsn, m.xid, m.data) for m in peek(conn, "s", pgoutput_options("life_pub"))))
    target = tmp_path / "replayed"
    replay_log(spark, ReplayConfig(source_log=str(raw), target=TargetSettings(path=str(target)),
                                   apply=ApplySettings(max_group_transactions=2)))
    return target


@pytest.mark.usefixtures("replay_path")  # on the driver, and with ranges folded on executors
def test_a_stored_log_follows_a_rename_by_oid(pg, spark, tmp_path):
    """A replay has no catalog, but the OID proves a rename: the renamed table's rows (before and after)
    end in one Delta table under its new name, and a new table that takes the old name afterwards in
    the log gets its own."""
    from applier.sources.sql_slot import create_slot

    with pg.connect() as conn:
        conn.execute("CREATE TABLE t1 (id int PRIMARY KEY, v text)")
        conn.execute("CREATE PUBLICATION life_pub FOR ALL TABLES")
        create_slot(conn, "s")
        conn.execute("INSERT INTO t1 VALUES (1, 'a'), (2, 'b')")
        conn.execute("ALTER TABLE t1 RENAME TO t2")
        conn.execute("UPDATE t2 SET v = 'bb' WHERE id = 2")
        conn.execute("CREATE TABLE t1 (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t1 VALUES (1, 'new')")
        target = _replay_captured(spark, conn, tmp_path)
        _assert_equal(spark, conn, target, [("public", "t1"), ("public", "t2")])


@pytest.mark.usefixtures("replay_path")
def test_a_stored_log_that_cannot_prove_identity_stops(pg, spark, tmp_path):
    """t1 renamed away with no change after the rename, and a new t1 written: in the log, the new t1
    simply appears with another OID; without a catalog nobody can say whether the old one was renamed or
    dropped, and the replay stops (exit 4) instead of merging the two."""
    from applier.sources.sql_slot import create_slot

    with pg.connect() as conn:
        conn.execute("CREATE TABLE t1 (id int PRIMARY KEY, v text)")
        conn.execute("CREATE PUBLICATION life_pub FOR ALL TABLES")
        create_slot(conn, "s")
        conn.execute("INSERT INTO t1 VALUES (1, 'a')")
        conn.execute("ALTER TABLE t1 RENAME TO t2")
        conn.execute("CREATE TABLE t1 (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t1 VALUES (1, 'new')")
        with pytest.raises(IdentityError) as stopped:
            _replay_captured(spark, conn, tmp_path)
    assert for_exception(stopped.value) == ExitCode.BAD_DATA
    assert "renamed or dropped" in str(stopped.value)


def test_history_follows_a_renamed_table_and_a_new_table_with_its_name_starts_its_own(pg, spark, tmp_path):
    """A renamed table keeps its history (the history table moves with it and goes on); the new table
    that takes the old name, and the one that takes it after a DROP, get histories of their own; the
    dropped table's history is retired beside its mirror table. Never one table's versions in
    another's history."""
    import deltalake

    from applier.config import TableRule, TablesSettings

    target = tmp_path / "delta"
    config = _config(pg, target).model_copy(update={
        "tables": TablesSettings(rules=[TableRule(match="public.*", history=True)])})
    history = target / "_history" / "public"

    def versions(table: str) -> list[tuple[int, str]]:
        rows = deltalake.DeltaTable(str(history / table)).to_pyarrow_table(columns=["id", "v"]).to_pylist()
        return sorted((r["id"], r["v"]) for r in rows)

    with pg.connect() as conn:
        conn.execute("CREATE TABLE h (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO h VALUES (1, 'a'), (2, 'b')")
        conn.execute("CREATE PUBLICATION life_pub FOR ALL TABLES")
        mirror(spark, config, once=True)
        conn.execute("UPDATE h SET v = 'a2' WHERE id = 1")
        mirror(spark, config, once=True)
        conn.execute("ALTER TABLE h RENAME TO h2")
        conn.execute("CREATE TABLE h (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO h VALUES (1, 'new')")
        conn.execute("UPDATE h2 SET v = 'a3' WHERE id = 1")
        mirror(spark, config, once=True)
        _assert_equal(spark, conn, target, [("public", "h"), ("public", "h2")])
        assert versions("h2") == [(1, "a"), (1, "a2"), (1, "a3"), (2, "b")]
        assert versions("h") == [(1, "new")]
        conn.execute("DROP TABLE h")
        conn.execute("CREATE TABLE h (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO h VALUES (5, 'x')")
        mirror(spark, config, once=True)
        _assert_equal(spark, conn, target, [("public", "h"), ("public", "h2")])
        assert versions("h") == [(5, "x")]
        retired = sorted(p.name for p in (target / "_retired" / "public").iterdir())
        assert len(retired) == 2 and retired[1] == f"{retired[0]}.history", retired
        retired_history = deltalake.DeltaTable(str(target / "_retired" / "public" / retired[1]))
        assert sorted(r["id"] for r in retired_history.to_pyarrow_table(columns=["id"]).to_pylist()) == [1]


def test_publication_edits_are_followed_or_stated(pg, spark, tmp_path, capsys):
    """Issue 47: a narrowed row filter left rows the filter now excludes (exit 0; verify found them), and a
    table taken out of the publication stayed in Delta, stale, listed by status like a followed table. A
    changed row filter copies the table again; a table no longer published is marked and status says so;
    published again, it is copied and followed again."""
    from applier.cli import main as cli_main

    target = tmp_path / "delta"
    config = MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="pubs", publication="pub17"),
                          target=TargetSettings(path=str(target)))
    with pg.connect() as conn:
        conn.execute("CREATE TABLE p17b (id int PRIMARY KEY, v int)")
        conn.execute("CREATE TABLE other (id int PRIMARY KEY)")
        conn.execute("INSERT INTO p17b SELECT g, g FROM generate_series(1, 100) g")
        conn.execute("CREATE PUBLICATION pub17 FOR TABLE p17b, other")
        mirror(spark, config, once=True)
        conn.execute("ALTER PUBLICATION pub17 SET TABLE p17b WHERE (id > 50), other")
        conn.execute("UPDATE p17b SET v = v + 1000 WHERE id IN (1, 2, 60, 61)")
        mirror(spark, config, once=True)
        results = verify_against_postgres(spark, conn, str(target), [("public", "p17b")], publication="pub17")
        assert all(r.equal for r in results), [(r.source_rows, r.target_rows) for r in results]
        assert deltalake.DeltaTable(str(target / "public" / "p17b")).to_pyarrow_table().num_rows == 50

        conn.execute("ALTER PUBLICATION pub17 DROP TABLE p17b")
        conn.execute("INSERT INTO other VALUES (1)")  # a change of a table still published: a group
        mirror(spark, config, once=True)
        props = deltalake.DeltaTable(str(target / "public" / "p17b")).metadata().configuration
        assert props["applier.publication"].startswith("not published since"), props
        capsys.readouterr()
        assert cli_main(["status", "--target", str(target), "--json"]) == 0
        statuses = {t["table"]: t for t in json.loads(capsys.readouterr().out)["tables"]}
        assert statuses["public.p17b"]["publication"].startswith("not published since"), statuses
        assert cli_main(["status", "--target", str(target)]) == 0
        assert "public.p17b: NOT FOLLOWED: not published since" in capsys.readouterr().out

        conn.execute("ALTER PUBLICATION pub17 ADD TABLE p17b")
        conn.execute("UPDATE p17b SET v = -1 WHERE id = 3")
        conn.execute("INSERT INTO other VALUES (2)")
        mirror(spark, config, once=True)
        props = deltalake.DeltaTable(str(target / "public" / "p17b")).metadata().configuration
        assert props["applier.publication"] == "published", props
        results = verify_against_postgres(spark, conn, str(target), [("public", "p17b")], publication="pub17")
        assert all(r.equal for r in results), [(r.source_rows, r.target_rows) for r in results]


def test_partitions_attached_and_detached_under_the_published_root_are_copied(pg, spark, tmp_path):
    """Issue 47 (repro 23): under ``publish_via_partition_root`` an attached partition's rows and a detached
    one's reach no stream; the run ended with exit 0, the attached rows missing and the detached ones kept.
    The root table is copied again, and the run says why."""
    target = tmp_path / "delta"
    config = MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="parts", publication="pub23"),
                          target=TargetSettings(path=str(target)))
    with pg.connect() as conn:
        conn.execute("CREATE TABLE pt (id int, k int, v text, PRIMARY KEY (id, k)) PARTITION BY LIST (k)")
        conn.execute("CREATE TABLE pt1 PARTITION OF pt FOR VALUES IN (1)")
        conn.execute("CREATE TABLE pt2 PARTITION OF pt FOR VALUES IN (2)")
        conn.execute("INSERT INTO pt SELECT g, 1 + g % 2, 'v' FROM generate_series(1, 100) g")
        conn.execute("CREATE PUBLICATION pub23 FOR TABLE pt WITH (publish_via_partition_root = true)")
        mirror(spark, config, once=True)
        conn.execute("CREATE TABLE pt3 (id int, k int, v text, PRIMARY KEY (id, k))")
        conn.execute("INSERT INTO pt3 SELECT g, 3, 'attached' FROM generate_series(1, 50) g")
        conn.execute("ALTER TABLE pt ATTACH PARTITION pt3 FOR VALUES IN (3)")
        conn.execute("ALTER TABLE pt DETACH PARTITION pt2")
        conn.execute("UPDATE pt SET v = 'changed' WHERE id IN (1, 3, 5)")
        lines: list[str] = []
        mirror(spark, config, once=True, progress=lines.append)
        said = "\n".join(lines)
        assert "partitions public.pt3 were attached and partitions public.pt2 were detached" in said, said
        _assert_equal(spark, conn, target, [("public", "pt")])
        assert deltalake.DeltaTable(str(target / "public" / "pt")).to_pyarrow_table().num_rows == 100
        conn.execute("INSERT INTO pt VALUES (1000, 3, 'after')")  # followed from the stream after the copy
        mirror(spark, config, once=True)
        _assert_equal(spark, conn, target, [("public", "pt")])


def test_a_changed_column_list_is_copied_again_and_said_for_what_it_is(pg, spark, tmp_path):
    """Issue 47 (repro 17d): a narrowed column list was reported as "columns b were dropped in the
    source", the rows kept their old b and new rows had NULL; a widened list would have left the newly
    published column NULL in every existing row. Either way the table is copied again, and the run says
    which columns are (no longer) published."""
    target = tmp_path / "delta"
    config = MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="collist", publication="pub17d"),
                          target=TargetSettings(path=str(target)))
    with pg.connect() as conn:
        conn.execute("CREATE TABLE p17c (id int PRIMARY KEY, a int, b text)")
        conn.execute("INSERT INTO p17c SELECT g, g, 'b' || g FROM generate_series(1, 20) g")
        conn.execute("CREATE PUBLICATION pub17d FOR TABLE p17c")
        mirror(spark, config, once=True)
        conn.execute("ALTER PUBLICATION pub17d SET TABLE p17c (id, a)")
        conn.execute("UPDATE p17c SET a = -a, b = 'new' WHERE id <= 5")
        conn.execute("INSERT INTO p17c VALUES (1000, 1000, 'x')")
        lines: list[str] = []
        mirror(spark, config, once=True, progress=lines.append)
        said = "\n".join(lines)
        assert "column list changed: b no longer published; only id, a published now" in said, said
        assert "dropped in the source" not in said
        table = deltalake.DeltaTable(str(target / "public" / "p17c"))
        assert table.schema().to_arrow().names == ["id", "a"]
        assert sorted(table.to_pyarrow_table().to_pylist(), key=lambda r: r["id"]) == [
            {"id": i, "a": -i if i <= 5 else i} for i in range(1, 21)] + [{"id": 1000, "a": 1000}]
        conn.execute("ALTER PUBLICATION pub17d SET TABLE p17c")  # every column again: b's values are copied
        conn.execute("UPDATE p17c SET a = 0 WHERE id = 20")
        lines.clear()
        mirror(spark, config, once=True, progress=lines.append)
        said = "\n".join(lines)
        assert "column list was removed" in said, said
        _assert_equal(spark, conn, target, [("public", "p17c")])
