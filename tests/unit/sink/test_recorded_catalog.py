"""The sink's identity questions answered from a stored log's catalog notes (RecordedCatalog): what was
recorded decides, in log order; what was not is never guessed (the stored-log stop, as without notes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from applier.catalog.relations import rename_candidates
from applier.config import TablesSettings
from applier.sink.identity import IdentityError, TableIdentities
from applier.sink.targets import TableTargets
from applier.sources.catalog_lookup import CatalogNote, RecordedCatalog
from applier.state import StateDir


def _identities(tmp_path: Path, lookup: RecordedCatalog) -> tuple[TableIdentities, list[tuple[str, str]]]:
    moves: list[tuple[str, str]] = []
    target = tmp_path / "delta"
    ids = TableIdentities(StateDir.for_target(target), TableTargets(None, str(target), TablesSettings()),
                          lookup=lookup, mover=lambda src, dst, _old, _new: moves.append((src, dst)))
    return ids, moves


def _bind(ids: TableIdentities, oid: int, schema: str, name: str) -> str:
    path = ids.path_of(oid, schema, name)
    (Path(path) / "_delta_log").mkdir(parents=True, exist_ok=True)
    return path


def test_a_note_round_trips_and_a_note_of_another_version_is_not_read() -> None:
    note = CatalogNote(7, ("public", "t"), ("id", "a"), ("public", "t2"), {"id": 1, "a": 2}, {5: None, 6: ("s", "x")})
    assert CatalogNote.from_json(note.to_json()) == note
    assert CatalogNote.from_json('{"v": 99, "oid": 7}') is None


def test_recorded_answers_follow_a_rename_retire_a_drop_and_never_guess(tmp_path: Path) -> None:
    recorded = RecordedCatalog()
    ids, moves = _identities(tmp_path, recorded)
    recorded.record(CatalogNote(1, ("public", "t1"), ("id",), ("public", "t1"), {"id": 1}))
    recorded.record(CatalogNote(2, ("public", "d"), ("id",), ("public", "d"), {"id": 1}))
    old_t1, old_d = _bind(ids, 1, "public", "t1"), _bind(ids, 2, "public", "d")
    _bind(ids, 3, "public", "u")  # no note ever speaks of 3
    # t1 renamed to t2 and its name taken by 11; d dropped and its name taken by 12 (as the notes say)
    recorded.record(CatalogNote(11, ("public", "t1"), ("id",), ("public", "t1"), {"id": 1}, {1: ("public", "t2")}))
    assert ids.path_of(11, "public", "t1") == old_t1
    assert ids.bound(1) is not None and ids.bound(1).name == "public.t2"  # type: ignore[union-attr]
    recorded.record(CatalogNote(12, ("public", "d"), ("id",), ("public", "d"), {"id": 1}, {2: None}))
    assert ids.path_of(12, "public", "d") == old_d
    assert ids.bound(2).retired  # type: ignore[union-attr]
    assert len(moves) == 2
    with pytest.raises(IdentityError, match="no catalog to tell whether that one was renamed or dropped"):
        ids.path_of(13, "public", "u")  # 3 has no record: not taken for dropped


def test_a_column_rename_is_proven_against_the_notes_in_log_order(tmp_path: Path) -> None:
    """The baseline is the previous Relation's recorded attnums, even before the relation is bound."""
    recorded = RecordedCatalog()
    ids, _moves = _identities(tmp_path, recorded)
    recorded.record(CatalogNote(1, ("public", "t"), ("id", "a"), ("public", "t"), {"id": 1, "a": 2}))
    ids.described(1, {"id": 1, "a": 2})
    recorded.record(CatalogNote(1, ("public", "t"), ("id", "b"), ("public", "t"), {"id": 1, "b": 2}))
    assert ids.columns_changed(1, "public.t", ("a",), ("b",), rename_candidates(["id", "a"], ["id", "b"])) == \
        {"a": "b"}
    ids.described(1, {"id": 1, "b": 2})
    # dropped and added: another attnum
    recorded.record(CatalogNote(1, ("public", "t"), ("id", "c"), ("public", "t"), {"id": 1, "c": 3}))
    assert ids.columns_changed(1, "public.t", ("b",), ("c",), {"b": ("c",)}) == {}
    assert ids.renames_for(1, "public.t", ("b",), ("c",), {"b": ("c",)}) == {}  # noted as dropped
    # a Relation whose columns the catalog no longer had when it was captured: nothing recorded, undecided
    recorded.record(CatalogNote(1, ("public", "t"), ("id", "e"), ("public", "t"), None))
    assert ids.columns_changed(1, "public.t", ("c",), ("e",), {"c": ("e",)}) == {}
    with pytest.raises(IdentityError, match="no catalog to ask"):
        ids.renames_for(1, "public.t", ("c",), ("e",), {"c": ("e",)})
