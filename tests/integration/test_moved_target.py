"""A target copied, restored or moved to another path with its state (issue 73, "a mirror nobody has to
watch"): the next run goes on under the new path, copies nothing again, and never writes under the old one.

Before, the state kept every table path absolute (the relation bindings, the target registry, the tables'
versions). A copy of the target (the old one still there) went on writing into the OLD directory with exit
0 while the new one stayed behind (verify of the new path differed); a moved one stopped with "table
public.t ... directory is gone", whose remedy of removing the entry made the next run recreate each table
under the old path from later changes alone (exit 0, 1 of 10 rows). The state keeps them relative to the
target's root now (state format 2), and the root it was last used with, so that a state directory kept
outside the target (``target.state_dir``) that is pointed at another root goes on only when that root
holds the same Delta tables, and stops (exit 2, naming both paths) otherwise.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from applier.checks.verify import verify_against_postgres
from applier.cli import main as cli_main
from applier.sink.registry import delta_table_id
from applier.state import resolved_path, stored_path

pytestmark = [pytest.mark.postgres, pytest.mark.spark]

TABLES = [("public", "t"), ("public", "u")]


def _config(tmp_path: Path, pg, root: Path, extra: str = "") -> str:
    cfg = tmp_path / "mirror.yaml"
    cfg.write_text(f"source:\n  dsn: '{pg.dsn}'\n  publication: mv\n  slot: mv\n"
                   f"target:\n  path: {root}\n{extra}")
    return str(cfg)


def _run(cfg: str, capsys) -> tuple[int, str]:
    capsys.readouterr()
    code = cli_main(["mirror", "--config", cfg, "--once"])
    return code, capsys.readouterr().err


def _assert_equal(spark, pg, root: Path, tables: list[tuple[str, str]]) -> None:
    with pg.connect() as conn:
        for r in verify_against_postgres(spark, conn, str(root), tables):
            assert r.equal, (r.source_name, r.source_rows, r.target_rows, r.only_in_source[:3], r.only_in_target[:3])


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root`` with its mtime and size: what "nothing written there" compares."""
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, p.stat().st_size) for p in sorted(root.rglob("*"))
            if p.is_file()}


def _ids(root: Path, tables: list[tuple[str, str]]) -> dict[str, str | None]:
    return {f"{s}.{t}": delta_table_id(root / s / t) for s, t in tables}


def _mirrored(pg, tmp_path: Path, capsys, extra: str = "") -> tuple[Path, str]:
    """Two tables mirrored at ``<tmp>/a`` by two runs (a copy, then changes followed)."""
    a = tmp_path / "a"
    with pg.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v int); INSERT INTO t SELECT g, g FROM "
                     "generate_series(1, 10) g; CREATE TABLE u (id int PRIMARY KEY); INSERT INTO u VALUES (1);"
                     "CREATE PUBLICATION mv FOR ALL TABLES")
    cfg = _config(tmp_path, pg, a, extra)
    assert _run(cfg, capsys)[0] == 0
    with pg.connect() as conn:
        conn.execute("UPDATE t SET v = 100 WHERE id = 1; INSERT INTO u VALUES (2)")
    assert _run(cfg, capsys)[0] == 0
    return a, cfg


@pytest.mark.parametrize("how", ["copied", "moved"])
def test_a_target_copied_or_moved_with_its_state_goes_on_where_it_is(pg, spark, tmp_path, capsys, how):
    """The old directory kept (a copy, or a restore elsewhere) is never written again, and nothing is copied
    again from Postgres: the same Delta tables go on under the new path, through changes, a rename (the
    Delta table moves within the new root) and a second run."""
    a, _ = _mirrored(pg, tmp_path, capsys)
    ids = _ids(a, TABLES)
    b = tmp_path / "b"
    if how == "copied":
        shutil.copytree(a, b, symlinks=True)
    else:
        shutil.move(a, b)
    before = _tree(a) if a.exists() else None
    with pg.connect() as conn:
        conn.execute("UPDATE t SET v = 200 WHERE id = 2; DELETE FROM t WHERE id = 3; INSERT INTO u VALUES (3)")
    cfg = _config(tmp_path, pg, b)
    code, err = _run(cfg, capsys)
    assert code == 0, err
    assert "snapshot:" not in err and "copying" not in err, err  # nothing copied again
    _assert_equal(spark, pg, b, TABLES)
    assert _ids(b, TABLES) == ids  # the same Delta tables, gone on
    with pg.connect() as conn:
        conn.execute("ALTER TABLE u RENAME TO u2; INSERT INTO u2 VALUES (4); UPDATE t SET v = 300 WHERE id = 4")
    code, err = _run(cfg, capsys)
    assert code == 0, err
    _assert_equal(spark, pg, b, [("public", "t"), ("public", "u2")])
    assert _ids(b, [("public", "u2")]) == {"public.u2": ids["public.u"]}  # moved within b, not copied
    if before is None:
        assert not a.exists()
    else:
        assert _tree(a) == before  # nothing written under the old path
    state = b / "_applier"
    relations = json.loads((state / "relations.json").read_text())
    assert sorted(b["path"] for b in relations["tables"].values()) == ["public/t", "public/u2"], relations
    assert sorted(json.loads((state / "tables.json").read_text())) == ["public/t", "public/u2"]
    assert sorted(json.loads((state / "table_versions.json").read_text())["tables"]) == ["public/t", "public/u2"]
    assert json.loads((state / "target.json").read_text()) == {"path": str(b)}


def test_a_state_outside_the_target_follows_it_to_a_root_with_the_same_tables(pg, spark, tmp_path, capsys):
    """``target.state_dir`` outside the target, the target moved and target.path changed: the tables under the
    new root are the same Delta tables (their ids), so the run goes on there, and says so."""
    state_dir = tmp_path / "state"
    a, _ = _mirrored(pg, tmp_path, capsys, f"  state_dir: {state_dir}\n")
    b = tmp_path / "b"
    shutil.move(a, b)
    with pg.connect() as conn:
        conn.execute("UPDATE t SET v = 200 WHERE id = 2; INSERT INTO u VALUES (3)")
    code, err = _run(_config(tmp_path, pg, b, f"  state_dir: {state_dir}\n"), capsys)
    assert code == 0, err
    assert f"last used with the target at {a}, and target.path is {b} now" in err, err
    _assert_equal(spark, pg, b, TABLES)
    assert not a.exists()
    assert json.loads((state_dir / "target.json").read_text()) == {"path": str(b)}


@pytest.mark.parametrize("other", ["empty", "another_mirror"])
def test_a_state_outside_the_target_pointed_at_other_tables_stops_naming_both_paths(pg, spark, tmp_path, capsys,
                                                                                      other):
    """``target.state_dir`` kept, target.path changed to a directory that does not hold this state's tables
    (an empty one, or a copy of other Delta tables of the same names): exit 2 before anything is written under
    either path, with both paths named and remedies that work (target.path set back goes on)."""
    state_dir = tmp_path / "state"
    extra = f"  state_dir: {state_dir}\n"
    a, _ = _mirrored(pg, tmp_path, capsys, extra)
    c = tmp_path / "c"
    c.mkdir()
    if other == "another_mirror":
        for schema, table in TABLES:  # the same layout and names, other Delta tables (other ids)
            shutil.copytree(a / schema / table, c / schema / table)
            log = c / schema / table / "_delta_log" / "00000000000000000000.json"
            lines = [json.loads(line) for line in log.read_text().splitlines()]
            for action in lines:
                if "metaData" in action:
                    action["metaData"]["id"] = "00000000-0000-0000-0000-000000000000"
            log.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
            for checkpoint in (c / schema / table / "_delta_log").glob("*.checkpoint*"):
                checkpoint.unlink()
            (c / schema / table / "_delta_log" / "_last_checkpoint").unlink(missing_ok=True)
    with pg.connect() as conn:
        conn.execute("UPDATE t SET v = 200 WHERE id = 2; INSERT INTO u VALUES (3)")
    before_a, before_c, before_state = _tree(a), _tree(c), _tree(state_dir)
    code, err = _run(_config(tmp_path, pg, c, extra), capsys)
    assert code == 2, err
    assert f"last used with the target at {a}, and target.path is {c} now" in err, err
    assert f"set target.path back to {a}" in err and "state directory of its own" in err, err
    assert _tree(a) == before_a and _tree(c) == before_c
    assert {k: v for k, v in _tree(state_dir).items() if k != "writer.lock"} == \
        {k: v for k, v in before_state.items() if k != "writer.lock"}
    code, err = _run(_config(tmp_path, pg, a, extra), capsys)  # the remedy: target.path back where the tables are
    assert code == 0, err
    _assert_equal(spark, pg, a, TABLES)


def test_an_object_store_target_moved_to_another_prefix_goes_on_with_its_former_state(s3_server, pg, tmp_path,
                                                                                        capsys, monkeypatch, no_spark):
    """s3:// (delta-rs, no JVM): the target's objects copied to another prefix, and ``target.state_dir`` set to
    the local state directory the old URI had (an object-store target's state is named by its URI, so the new
    one has none: docs/operations.md): the mirror goes on under the new prefix, writes nothing under the old."""
    from deltalake import DeltaTable

    from applier.state import local_state_dir
    from applier.storage.objects import ObjectStore

    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state-home"))
    bucket = f"s3://{s3_server.new_bucket()}"
    a, b = f"{bucket}/a", f"{bucket}/b"
    with pg.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v int); INSERT INTO t SELECT g, g FROM "
                     "generate_series(1, 10) g; CREATE PUBLICATION mv FOR ALL TABLES")
    cfg = tmp_path / "mirror.yaml"
    cfg.write_text(f"source:\n  dsn: '{pg.dsn}'\n  publication: mv\n  slot: mv\ntarget:\n  path: {a}\n")
    assert _run(str(cfg), capsys)[0] == 0
    with pg.connect() as conn:
        conn.execute("UPDATE t SET v = 100 WHERE id = 1")
    assert _run(str(cfg), capsys)[0] == 0
    store = ObjectStore(bucket)
    for key in store.keys("a/"):
        store.copy(key, "b/" + key[len("a/"):])
    old = {key: store.get(key) is not None for key in store.keys("a/")}
    table_id = DeltaTable(f"{a}/public/t").metadata().id
    with pg.connect() as conn:
        conn.execute("UPDATE t SET v = 200 WHERE id = 2; DELETE FROM t WHERE id = 3; ALTER TABLE t RENAME TO t2;"
                     "INSERT INTO t2 VALUES (11, 11)")
        expected = sorted(conn.execute("SELECT id, v FROM t2").fetchall())
    cfg.write_text(f"source:\n  dsn: '{pg.dsn}'\n  publication: mv\n  slot: mv\ntarget:\n  path: {b}\n"
                   f"  state_dir: {local_state_dir(a)}\n")
    code, err = _run(str(cfg), capsys)
    assert code == 0, err
    assert "snapshot:" not in err, err
    moved = DeltaTable(f"{b}/public/t2")
    assert moved.metadata().id == table_id  # the same Delta table, moved within b by the rename
    assert sorted((r["id"], r["v"]) for r in moved.to_pyarrow_table().to_pylist()) == expected
    assert {key: store.get(key) is not None for key in store.keys("a/")} == old  # nothing written under a
    relations = json.loads((local_state_dir(a) / "relations.json").read_text())
    assert [b["path"] for b in relations["tables"].values()] == ["public/t2"]


@pytest.mark.parametrize("root", ["/lake/a", "s3://bucket/lake/a", "s3://bucket/lake/a/"])
def test_a_store_target_keeps_its_paths_relative_too(root: str) -> None:
    """Object-store targets: paths kept relative to the root URI, joined back as URIs (never folded by a
    Path); a path outside the root stays as it is."""
    base = root.rstrip("/")
    assert stored_path(root, f"{base}/public/t") == "public/t"
    assert resolved_path(root, "public/t") == f"{base}/public/t"
    assert resolved_path(root.replace("/a", "/b"), "public/t") == f"{base[:-1]}b/public/t"
    assert stored_path(root, f"{base}x/public/t") == f"{base}x/public/t"  # a sibling whose name starts alike
    assert stored_path(root, "s3://other/t") == "s3://other/t" and resolved_path(root, "s3://other/t") == "s3://other/t"


def test_the_format_2_migration_takes_the_root_from_the_layout_keeps_outside_paths_and_can_run_again(
        tmp_path: Path) -> None:
    """A format 1 state made at ``/made/at`` and found under another root: its layout paths become relative
    (the root recorded first, so a run killed half-way goes on with it), a ``tables.rules`` target outside the
    root stays absolute, and running the step again changes nothing."""
    from applier.infra.stateformat import MIGRATIONS, found_format, upgrade
    from applier.state import StateDir

    made = "/made/at"
    state = StateDir(tmp_path / "T" / "_applier", tmp_path / "T")
    state.save("relations", {"moving": {"oid": "1", "from": f"{made}/public/a", "to": f"{made}/public/b",
                                        "old_name": "public.a", "new_name": "public.b"},
                             "tables": {"1": {"name": "public.a", "path": f"{made}/public/a", "attnums": {}},
                                        "2": {"name": "public.r", "path": "/elsewhere/r", "attnums": {}},
                                        "3": {"name": "public.d", "path": f"{made}/_retired/public/d@3",
                                              "attnums": {}, "retired": True}}})
    state.save("tables", {f"{made}/public/a": {"table": "public.a", "id": "x"}})
    state.save("table_versions", {"cut_lsn": None, "tables": {f"{made}/public/a": {"table": "public.a"},
                                                              "/elsewhere/r": {"table": "public.r"}}})
    assert upgrade(state, "mirror") == [MIGRATIONS[0].what] and found_format(state) == 2
    relations, versions = state.load("relations") or {}, state.load("table_versions") or {}
    assert [t["path"] for t in relations["tables"].values()] == ["public/a", "/elsewhere/r", "_retired/public/d@3"]
    assert (relations["moving"]["from"], relations["moving"]["to"]) == ("public/a", "public/b")
    assert list(state.load("tables") or {}) == ["public/a"]
    assert sorted(versions["tables"]) == ["/elsewhere/r", "public/a"]
    assert state.load("target") == {"path": made}
    before = {p.name: p.read_bytes() for p in state.root.glob("*.json") if p.name != "format.json"}
    MIGRATIONS[0].apply(state)  # again, as after a kill before the stamp
    assert {p.name: p.read_bytes() for p in state.root.glob("*.json") if p.name != "format.json"} == before
