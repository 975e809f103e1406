"""Upgrades (issue 73 item 9): targets, states and a raw log written by the previous release go on under
this one, and a state written by a newer release is refused (exit 2) before anything is touched.

What the release wrote comes from tests/fixtures/upgrade/v1-5593802, made by scripts/make_upgrade_fixture.py
with the release's own code (commit 5593802, the last before state formats) against a real PostgreSQL 15:
a mirror's target and ``_applier`` state as its second ``mirror --once`` left them, the raw log its
``capture`` wrote, a ``replay`` target that has applied the first half of that log, the SQL that made the
source, and a manifest. A slot cannot be packed, so the server side is made again: a fresh cluster, the same
SQL in its ``postgres`` database (the same relation OIDs and relfilenodes as the states record: checked,
since they name tables by OID), the WAL moved past what the release confirmed, and new slots of the same
names. What the new code meets is then the release's files as they were, before slots that start where it
left off; more changes follow (a column added, another rename, a TOAST value left unchanged, a key-less
table's duplicates), and the mirror and the replay must go on (no table copied again, the same Delta
tables) and end equal to Postgres.

The one thing that differs from an upgrade in place: the new slot was not made by the release, so the
mirror warns that the slot is confirmed beyond what its state confirmed (which matters only for
two-phase transactions, not used here).
"""

from __future__ import annotations

import json
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import unavailable

from applier.api import mirror, replay
from applier.checks.verify import verify_against_postgres
from applier.cli import main
from applier.config import ApplySettings, CaptureConfig, MirrorConfig, ReplayConfig, SourceSettings, TargetSettings
from applier.devtools.pgcluster import PgCluster, find_installation
from applier.drivers.capture import capture
from applier.errors import EnvironmentSetupError
from applier.infra.stateformat import CURRENT, found_format
from applier.lsn import parse_lsn
from applier.state import StateDir

pytestmark = [pytest.mark.postgres]

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "upgrade" / "v1-5593802"
MANIFEST: dict[str, Any] = json.loads((FIXTURE / "manifest.json").read_text(encoding="utf-8"))
TABLES = [tuple(name.split(".")) for name in sorted(MANIFEST["relation_oids"])]
MIRROR, CAPTURE = MANIFEST["mirror"], MANIFEST["capture"]

#: after the upgrade: a column added, a second rename (the first was the release's), the TOAST value the
#: release wrote left unchanged again, duplicates of a key-less table inserted and deleted, a key deleted
AFTER = """
UPDATE public.accounts SET owner = owner || '+' WHERE id % 3 = 0;
DELETE FROM public.accounts WHERE id = 1;
INSERT INTO public.accounts VALUES (100, 'new', 1.25, '2025-05-05', '{7}');
ALTER TABLE public.accounts ADD COLUMN tier int;
UPDATE public.accounts SET tier = 2 WHERE id % 5 = 0;
INSERT INTO public.events VALUES ('b', 2, '2024-03-01 00:00+00'), ('b', 2, '2024-03-01 00:00+00');
DELETE FROM public.events WHERE kind = 'a' AND n = 1;
UPDATE app.people SET handle = 'h' || id WHERE id % 2 = 0;
ALTER TABLE app.people RENAME COLUMN handle TO alias;
UPDATE app.people SET alias = alias || '?' WHERE id = 5;
UPDATE public.docs SET title = 'again' WHERE id IN (1, 3);
UPDATE public.docs SET body = repeat(md5('new'), 300) WHERE id = 4;
"""


def unpack(into: Path) -> Path:
    """The release's mirror target, log and replay target under ``into``, the directory they were made in
    put back as this one."""
    with tarfile.open(FIXTURE / MANIFEST["archive"]) as tar:
        tar.extractall(into, filter="data")
    for path in into.rglob("*.json"):
        text = path.read_text(encoding="utf-8")
        if MANIFEST["placeholder"] in text:
            path.write_text(text.replace(MANIFEST["placeholder"], str(into)), encoding="utf-8")
    return into


def _tree(root: Path) -> dict[str, tuple[int, bytes]]:
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(root.rglob("*"))
            if p.is_file()}


@dataclass
class OldRelease:
    dsn: str
    root: Path

    @property
    def target(self) -> Path:
        return self.root / MIRROR["target"]

    def mirror_config(self) -> MirrorConfig:
        return MirrorConfig(source=SourceSettings(dsn=self.dsn, slot=MIRROR["slot"], publication=MIRROR["publication"]),
                            target=TargetSettings(path=str(self.target)))


@pytest.fixture
def old_release(tmp_path: Path) -> Iterator[OldRelease]:
    """The fixture's source made again in a fresh cluster of the same major, with new slots after the
    release's last confirmed LSNs, and its files unpacked."""
    try:
        installation = find_installation(MANIFEST["postgres_major"])
    except EnvironmentSetupError as e:
        unavailable(str(e))
    cluster = PgCluster(installation, {"logical_decoding_work_mem": "64kB"}).start()  # as the script's
    try:
        dsn = cluster.dsn(MANIFEST["database"])
        with psycopg.connect(dsn, autocommit=True) as conn:
            for sql in MANIFEST["sql"]:
                conn.execute((FIXTURE / sql).read_text(encoding="utf-8"))
            found = {name: list(conn.execute("SELECT %s::regclass::oid, pg_relation_filenode(%s::regclass)",
                                             (name, name)).fetchone() or ()) for name in MANIFEST["relation_oids"]}
            wanted = {name: [oid, MANIFEST["relfilenodes"][name]] for name, oid in MANIFEST["relation_oids"].items()}
            assert found == wanted, ("the fixture's SQL no longer gives the relation OIDs its states record: "
                                     "remake it (scripts/make_upgrade_fixture.py)")
            confirmed = max(parse_lsn(lsn) for lsn in MANIFEST["slots_confirmed"].values())
            while parse_lsn(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]) <= confirmed:  # type: ignore[index]
                conn.execute("SELECT pg_logical_emit_message(false, 'upgrade', 'x'), pg_switch_wal()")
            for slot in MANIFEST["slots_confirmed"]:
                conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        yield OldRelease(dsn, unpack(tmp_path))
    finally:
        cluster.stop()


def _table_ids(target: Path) -> dict[str, str]:
    """Each table's Delta table id, as the state's registry holds it."""
    entries = json.loads((target / "_applier" / "tables.json").read_text())
    return {entry["table"]: entry["id"] for entry in entries.values()}


def test_a_target_of_the_previous_release_goes_on_under_this_one(old_release: OldRelease, spark, capsys) -> None:
    state = StateDir(old_release.target / "_applier")
    assert not (state.root / "format.json").exists(), "the fixture is a state of the releases before formats"
    ids = _table_ids(old_release.target)
    with psycopg.connect(old_release.dsn, autocommit=True) as conn:
        conn.execute(AFTER)
        summary = mirror(spark, old_release.mirror_config(), once=True)  # as the CLI: through target_writer
        assert summary.snapshot_lsn is None and not summary.synced_rows, "a table was copied again"
        assert set(summary.rows) == {".".join(t) for t in TABLES}, summary.rows
        assert found_format(state) == CURRENT
        assert json.loads((state.root / "format.json").read_text())["format"] == CURRENT
        assert _table_ids(old_release.target) == ids  # the same Delta tables, gone on
        assert _paths(state) == _LAYOUT  # format 2: relative to the target's root
        for r in verify_against_postgres(spark, conn, str(old_release.target), TABLES):
            assert r.equal, (r.source_name, r.source_rows, r.target_rows, r.only_in_source[:3], r.only_in_target[:3])
        conn.execute("UPDATE public.docs SET title = 'third' WHERE id = 5")
        assert mirror(spark, old_release.mirror_config(), once=True).transactions == 1  # and a later run as usual
    capsys.readouterr()
    assert main(["status", "--target", str(old_release.target), "--dsn", old_release.dsn,
                 "--slot", MIRROR["slot"]]) == 0
    assert "public.docs" in capsys.readouterr().out


#: where the release's mirror keeps its tables, relative to the target's root
_LAYOUT = sorted(f"{schema}/{table}" for schema, table in TABLES)


def _paths(state: StateDir) -> list[str]:
    """The table paths of the relation bindings, the registry and the tables' versions (each sorted), when
    the three agree; what they hold otherwise."""
    relations = sorted(b["path"] for b in json.loads((state.root / "relations.json").read_text())["tables"].values())
    registry = sorted(json.loads((state.root / "tables.json").read_text()))
    versions = sorted(json.loads((state.root / "table_versions.json").read_text())["tables"])
    return relations if relations == registry == versions else [*relations, *registry, *versions]


def test_a_target_of_the_previous_release_restored_elsewhere_goes_on_there(old_release: OldRelease, spark,
                                                                           tmp_path: Path) -> None:
    """The release's target (its tables and ``_applier`` state) made at one path and restored at another
    before this release runs: the format 1 state's absolute paths name the path it was made at, which the
    migration tells from the tables' layout; the mirror goes on at the new path, copies nothing again, and
    creates nothing at the old one."""
    made_at = tmp_path / "made-at"
    state = StateDir(old_release.target / "_applier")
    for path in state.root.glob("*.json"):
        path.write_text(path.read_text(encoding="utf-8").replace(str(old_release.root), str(made_at)), encoding="utf-8")
    assert str(made_at) in (state.root / "relations.json").read_text()
    ids = _table_ids(old_release.target)
    with psycopg.connect(old_release.dsn, autocommit=True) as conn:
        conn.execute(AFTER)
        summary = mirror(spark, old_release.mirror_config(), once=True)
        assert summary.snapshot_lsn is None and not summary.synced_rows, "a table was copied again"
        assert set(summary.rows) == {".".join(t) for t in TABLES}, summary.rows
        assert found_format(state) == CURRENT and _paths(state) == _LAYOUT
        assert json.loads((state.root / "target.json").read_text()) == {"path": str(old_release.target)}
        assert _table_ids(old_release.target) == ids
        for r in verify_against_postgres(spark, conn, str(old_release.target), TABLES):
            assert r.equal, (r.source_name, r.source_rows, r.target_rows, r.only_in_source[:3], r.only_in_target[:3])
    assert not made_at.exists()


def test_a_log_and_a_replay_target_of_the_previous_release_go_on_under_this_one(old_release: OldRelease,
                                                                                spark) -> None:
    """This release's capture appends to the release's log, and its replay applies the rest of the log (the
    release's half it had not replayed, then this release's) to the release's replay target."""
    log, target = old_release.root / CAPTURE["log"], old_release.root / CAPTURE["replay_target"]
    state = StateDir(target / "_applier")
    assert not (state.root / "format.json").exists(), "the fixture is a state of the releases before formats"
    ids = _table_ids(target)
    with psycopg.connect(old_release.dsn, autocommit=True) as conn:
        conn.execute(AFTER)
        captured = capture(spark, CaptureConfig(source=SourceSettings(dsn=old_release.dsn, slot=CAPTURE["slot"],
                                                                      publication=CAPTURE["publication"]),
                                                log_path=str(log)), once=True)
        assert captured.messages > 0
        summary = replay(spark, ReplayConfig(source_log=str(log), target=TargetSettings(path=str(target)),
                                             apply=ApplySettings(schema_changes="evolve")))  # a log's only choice
        assert set(summary.rows) == {".".join(t) for t in TABLES}, summary.rows
        assert found_format(state) == CURRENT and (state.root / "format.json").is_file()
        assert _table_ids(target) == ids
        for r in verify_against_postgres(spark, conn, str(target), TABLES):
            assert r.equal, (r.source_name, r.source_rows, r.target_rows, r.only_in_source[:3], r.only_in_target[:3])


@pytest.mark.parametrize("command", ["mirror", "resync", "status"])
def test_a_state_of_a_newer_release_is_refused_with_exit_2_and_nothing_written(pg, tmp_path, capsys,
                                                                                command: str) -> None:
    """The release's target, since run by a release of a later state format: this one refuses it before
    the lock, the write probe, the server and Spark; no slot is made."""
    target = unpack(tmp_path) / MIRROR["target"]
    (target / "_applier" / "format.json").write_text(json.dumps({"format": CURRENT + 1,
                                                                 "written_by": "applier 99.0.0"}))
    with pg.connect() as conn:
        for sql in MANIFEST["sql"]:
            conn.execute((FIXTURE / sql).read_text(encoding="utf-8"))
    before = _tree(tmp_path)
    flags = {"mirror": ["mirror", "--once", "--publication", MIRROR["publication"], "--slot", MIRROR["slot"]],
             "resync": ["resync", "--table", "public.accounts", "--publication", MIRROR["publication"],
                        "--slot", MIRROR["slot"]],
             "status": ["status", "--slot", MIRROR["slot"]]}[command]
    capsys.readouterr()
    assert main([*flags, "--dsn", pg.dsn, "--target", str(target)]) == 2
    err = capsys.readouterr().err
    assert f"state format {CURRENT + 1}, written by applier 99.0.0" in err, err
    assert f"reads state formats up to {CURRENT}" in err and f"`applier {command}` of that release" in err, err
    assert _tree(tmp_path) == before
    with pg.connect() as conn:
        assert conn.execute("SELECT count(*) FROM pg_replication_slots WHERE database = current_database()"
                            ).fetchone() == (0,)
