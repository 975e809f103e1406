"""The sink's identity questions answered from a stored log's catalog notes (RecordedCatalog): what was
recorded decides, in log order; what was not is never guessed (the stored-log stop, as without notes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from applier.catalog.relations import RelationCache, rename_candidates
from applier.config import TablesSettings
from applier.protocol.messages import Relation, RelationColumn
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


def _relation(*names: str) -> Relation:
    return Relation(None, 1, "public", "t", "d", tuple(RelationColumn(1 if n == "id" else 0, n, 23, -1) for n in names))


def _followed(tmp_path: Path, attnums: dict[str, int]) -> tuple[TableIdentities, RecordedCatalog, RelationCache]:
    """Relation 1 (public.t) bound, its columns recorded as ``attnums``, and a RelationCache telling the map."""
    recorded = RecordedCatalog()
    ids, _moves = _identities(tmp_path, recorded)
    recorded.record(CatalogNote(1, ("public", "t"), tuple(attnums), ("public", "t"), attnums))
    _bind(ids, 1, "public", "t")
    ids.record_attnums(1, attnums)
    cache = RelationCache(columns_changed=ids.columns_changed)
    cache.update(_relation(*attnums))
    return ids, recorded, cache


def test_a_column_dropped_and_added_again_under_its_name_needs_a_copy_though_the_relation_looks_the_same(
        tmp_path: Path) -> None:
    """Issue 77, case 2b: the stream's Relation after ``DROP COLUMN c; ADD COLUMN c`` is the one before;
    only the catalog's attnum for c tells that the column is another one."""
    ids, recorded, cache = _followed(tmp_path, {"id": 1, "a": 2, "c": 3})
    cache.update(_relation("id", "a", "c"))  # re-sent as it was
    assert ids.recopy_reason(1) is None
    recorded.record(CatalogNote(1, ("public", "t"), ("id", "a", "c"), ("public", "t"), {"id": 1, "a": 2, "c": 4}))
    version = cache.update(_relation("id", "a", "c"))
    assert version.version == 1  # nothing in the stream says so
    reason = ids.recopy_reason(1)
    assert reason is not None and "column(s) c of public.t" in reason
    ids.copied_anew(1)  # a resync: the copy is the new baseline
    assert ids.recopy_reason(1) is None and ids.bound(1).attnums == {"id": 1, "a": 2, "c": 4}  # type: ignore[union-attr]


def test_names_swapped_wait_for_the_relation_that_shows_them_and_a_rename_then_an_add_needs_no_copy(
        tmp_path: Path) -> None:
    """A Relation re-sent before the swap (its names as they were) does not flag the table: the swap is
    later in the stream. The Relation with the swapped order does. A rename and an add of the old name
    that the stream shows apart are applied as what they are, with no copy."""
    ids, recorded, cache = _followed(tmp_path, {"id": 1, "a": 2, "b": 3})
    recorded.record(CatalogNote(1, ("public", "t"), ("id", "b", "a"), ("public", "t"), {"id": 1, "b": 2, "a": 3}))
    cache.update(_relation("id", "a", "b"))
    assert ids.recopy_reason(1) is None
    cache.update(_relation("id", "b", "a"))
    assert ids.recopy_reason(1) is not None

    other = tmp_path / "other"
    ids, recorded, cache = _followed(other, {"id": 1, "a": 2})
    recorded.record(CatalogNote(1, ("public", "t"), ("id", "b", "a"), ("public", "t"), {"id": 1, "b": 2, "a": 3}))
    cache.update(_relation("id", "a"))  # before the rename
    assert cache.update(_relation("id", "b")).change.renamed == (("a", "b"),)  # type: ignore[union-attr]
    cache.update(_relation("id", "b", "a"))  # the add
    assert ids.recopy_reason(1) is None
    # both at once, in one Relation: the name a is another column, and the stream cannot say since when
    ids, recorded, cache = _followed(tmp_path / "third", {"id": 1, "a": 2})
    recorded.record(CatalogNote(1, ("public", "t"), ("id", "b", "a"), ("public", "t"), {"id": 1, "b": 2, "a": 3}))
    cache.update(_relation("id", "b", "a"))
    assert ids.recopy_reason(1) is not None
