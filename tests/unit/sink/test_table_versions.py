"""A table whose Delta history went backwards (applier.sink.tableversions), on Delta tables delta-rs writes
here: what is recorded (the state's file, the newest cut), what counts as behind, and the legitimate
changes that must never (a copy anew, another table at the path, a pending copy, a parked table, an entry
removed to accept the table)."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from applier.commands.exitcodes import ExitCode, for_exception
from applier.lsn import format_lsn
from applier.sink.cuts import Cut, CutLog, CutTable
from applier.sink.tableversions import FILE, TableVersions
from applier.state import StateDir

OID = 16390
#: the table's key in the state's file: its path relative to the target's root (state format 2)
KEY = "public/t"


def _commit(path: Path, applied: int) -> None:
    """One commit of the table, as the sink's: its rows and its applied LSN (``txn``) together."""
    write_deltalake(str(path), pa.table({"id": [applied]}), mode="append",
                    commit_properties=CommitProperties(app_transactions=[Transaction("applier:public.t", applied)]))


@pytest.fixture
def target(tmp_path: Path) -> Path:
    root = tmp_path / "T"
    for applied in (1000, 2000, 3000):  # versions 0, 1, 2
        _commit(root / "public" / "t", applied)
    return root


def _table(target: Path) -> Path:
    return target / "public" / "t"


def _state(target: Path) -> StateDir:
    return StateDir.for_target(target)


def _write(state: StateDir, name: str, payload: object) -> None:
    state.root.mkdir(parents=True, exist_ok=True)
    (state.root / f"{name}.json").write_text(json.dumps(payload))


def _bind(state: StateDir, target: Path, oid: int = OID) -> None:
    _write(state, "relations", {"tables": {str(oid): {"name": "public.t", "path": str(_table(target)),
                                                      "attnums": {"id": 1}}}})


def _cut(target: Path, lsn: int, version: int, oid: int = OID) -> None:
    now = datetime.now(UTC)
    assert CutLog(str(target)).append(Cut(lsn, now, now, (CutTable(oid, "public.t", "public/t", "mirror", version),)))


def _drop_newest_commit(target: Path) -> None:
    max((_table(target) / "_delta_log").glob("*.json")).unlink()


def _registered(target: Path) -> list[str]:
    return [str(_table(target))]


def test_a_deleted_newest_commit_is_behind_what_the_state_recorded(target: Path) -> None:
    state = _state(target)
    versions = TableVersions(state, str(target))
    assert versions.behind(_registered(target)) == []  # the first run: nothing recorded
    versions.record(_registered(target))
    entry = json.loads((state.root / f"{FILE}.json").read_text())["tables"][KEY]
    assert entry["version"] == 2 and entry["applied_lsn"] == format_lsn(3000) and entry["table"] == "public.t"
    assert versions.behind(_registered(target)) == []
    _drop_newest_commit(target)
    [behind] = versions.behind(_registered(target))
    assert (behind.table, behind.version, behind.applied, behind.recorded_version, behind.recorded_applied) == \
        ("public.t", 1, 2000, 2, 3000)
    error = versions.error([behind], "mirror", "cfg.yaml")
    assert for_exception(error) == ExitCode.USAGE
    assert "`applier resync --config cfg.yaml --table public.t`" in str(error)
    assert "applier replay" in str(versions.error([behind], "replay"))
    # a record made while it is behind (a resync of another table) keeps what was recorded
    versions.record(_registered(target))
    assert [b.table for b in versions.behind(_registered(target))] == ["public.t"]
    # removing its entry accepts the table as it is
    saved = json.loads((state.root / f"{FILE}.json").read_text())
    saved["tables"].pop(KEY)
    _write(state, FILE, saved)
    assert versions.behind(_registered(target)) == []


def test_an_older_copy_with_a_higher_version_is_behind_by_its_applied_lsn(target: Path, tmp_path: Path) -> None:
    backup = tmp_path / "backup"
    shutil.copytree(_table(target), backup)
    _commit(_table(target), 4000)
    versions = TableVersions(_state(target), str(target))
    versions.record(_registered(target))
    shutil.rmtree(_table(target))
    shutil.copytree(backup, _table(target))
    table = DeltaTable(str(_table(target)))  # commits that change no row, past the recorded version
    for days in (30, 31):
        table.alter.set_table_properties({"delta.logRetentionDuration": f"interval {days} days"})
    [behind] = versions.behind(_registered(target))
    assert (behind.version, behind.recorded_version, behind.applied, behind.recorded_applied) == (4, 3, 3000, 4000)


def test_the_newest_cut_counts_when_it_is_newer_than_the_record(target: Path) -> None:
    """A target recorded before this check existed (no file), or a run killed after its cuts and before its
    record: the newest cut's version of the table is what it must have."""
    state = _state(target)
    _bind(state, target)
    _cut(target, 3000, 2)
    _drop_newest_commit(target)
    versions = TableVersions(state, str(target))
    [behind] = versions.behind(_registered(target))
    assert (behind.relation_oid, behind.version, behind.recorded_version) == (OID, 1, 2)
    assert "newest consistent cut (LSN 0/BB8)" in behind.by
    # another relation bound at the path (a new table took the name): the cut's version is not its
    _bind(state, target, OID + 1)
    assert versions.behind(_registered(target)) == []
    _bind(state, target)
    # copied anew after the cut (resync, table sync): the cut is older than the copy
    _write(state, "copied_tables", {"public.t": format_lsn(3500)})
    assert versions.behind(_registered(target)) == []
    _write(state, "copied_tables", {"public.t": format_lsn(500)})
    assert versions.behind(_registered(target)) != []


def test_a_killed_run_s_cut_counts_after_the_record(target: Path) -> None:
    state = _state(target)
    _bind(state, target)
    _cut(target, 2000, 1)
    versions = TableVersions(state, str(target))
    versions.record(_registered(target))  # version 2, cut at 0/7D0
    _commit(_table(target), 4000)  # version 3 and its cut, then the run is killed before its record
    _cut(target, 4000, 3)
    _drop_newest_commit(target)
    [behind] = versions.behind(_registered(target))
    assert (behind.version, behind.recorded_version) == (2, 3) and "cut" in behind.by


def test_legitimate_changes_are_not_behind(target: Path, tmp_path: Path) -> None:
    state = _state(target)
    _bind(state, target)
    _write(state, "copied_tables", {"public.t": format_lsn(1000)})
    _cut(target, 3000, 2)
    versions = TableVersions(state, str(target))
    versions.record(_registered(target))
    assert versions.behind(_registered(target)) == []

    # copied anew (resync: a new copy position) with fewer versions than recorded: its record starts again
    shutil.rmtree(_table(target))
    _commit(_table(target), 5000)
    _write(state, "copied_tables", {"public.t": format_lsn(5000)})
    assert versions.behind(_registered(target)) == []
    versions.record(_registered(target))
    entry = json.loads((state.root / f"{FILE}.json").read_text())["tables"][KEY]
    assert (entry["version"], entry["applied_lsn"], entry["copied_at"]) == (0, format_lsn(5000), format_lsn(5000))

    # its copy pending (off copied_tables: the next mirror copies it): not checked, its entry kept
    _commit(_table(target), 6000)
    versions.record(_registered(target))
    _write(state, "copied_tables", {})
    _drop_newest_commit(target)
    assert versions.behind(_registered(target)) == []
    versions.record(_registered(target))
    assert json.loads((state.root / f"{FILE}.json").read_text())["tables"][KEY]["version"] == 1
    _write(state, "copied_tables", {"public.t": format_lsn(5000)})
    assert versions.behind(_registered(target)) != []

    # parked: its changes are left out until a resync copies it anew
    _write(state, "parked", {"public.t": {"oid": OID, "error": "TypeChangeError", "message": "m", "since": "now"}})
    assert versions.behind(_registered(target)) == []
    _write(state, "parked", {})

    # another Delta table at the path (a new table id: the registry's case, accepted there)
    shutil.rmtree(_table(target))
    _commit(_table(target), 100)
    assert versions.behind(_registered(target)) == []

    # gone: the registry's case; its entry is kept while the registry lists it
    versions.record(_registered(target))
    shutil.rmtree(_table(target))
    assert versions.behind(_registered(target)) == []
    versions.record(_registered(target))
    assert KEY in json.loads((state.root / f"{FILE}.json").read_text())["tables"]
    _write(state, "relations", {"tables": {}})  # moved or retired: no longer one of the target's tables
    versions.record([])
    assert json.loads((state.root / f"{FILE}.json").read_text())["tables"] == {}


def test_the_newest_cut_is_read_alone(tmp_path: Path) -> None:
    assert CutLog(str(tmp_path)).newest() is None
    for lsn in (1000, 2000, 3000):
        _cut(tmp_path, lsn, lsn // 1000)
    newest = CutLog(str(tmp_path)).newest()
    assert newest is not None and newest.lsn == 3000 and newest.tables[0].version == 3


def test_a_table_elsewhere_is_checked_while_a_relation_is_bound_to_it(tmp_path: Path) -> None:
    """A rule's ``target`` puts a table outside the target's layout, where the registry does not look: its
    record is kept and checked while the relation bindings name its path."""
    target, elsewhere = tmp_path / "T", tmp_path / "elsewhere" / "public" / "t"
    for applied in (1000, 2000, 3000):
        _commit(elsewhere, applied)
    state = _state(target)
    _write(state, "relations", {"tables": {str(OID): {"name": "public.t", "path": str(elsewhere), "attnums": {}}}})
    versions = TableVersions(state, str(target))
    versions.record([])
    max((elsewhere / "_delta_log").glob("*.json")).unlink()
    [behind] = versions.behind([])
    assert (behind.path, behind.relation_oid, behind.version, behind.recorded_version) == (str(elsewhere), OID, 1, 2)
    _write(state, "relations", {"tables": {}})  # no longer one of the target's tables
    assert versions.behind([]) == []
    versions.record([])
    assert json.loads((state.root / f"{FILE}.json").read_text())["tables"] == {}
