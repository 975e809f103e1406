"""The Relation/Type cache: what the decoder's Relation ('R') and Type ('Y') messages told us.

A Relation is re-sent at every decoding session start, after relcache invalidations and once per
streamed transaction; most re-sends are identical and must not look like schema changes. A re-send
with a different column list, key, replica identity or name is a new schema version, and the cache
says what changed so the sink can evolve the target table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from applier.errors import CatalogError
from applier.protocol.messages import Relation, RelationColumn, Type


@dataclass(frozen=True, slots=True)
class SchemaChange:
    added: tuple[str, ...]
    dropped: tuple[str, ...]
    retyped: tuple[tuple[str, int, int, int, int], ...]  # (column, old_oid, old_typmod, new_oid, new_typmod)
    renamed_relation: tuple[str, str] | None
    key_changed: bool
    replica_identity_changed: bool
    renamed: tuple[tuple[str, str], ...] = ()  # (old, new) columns proven renamed (see ColumnsChanged)


@dataclass(frozen=True, slots=True)
class SchemaVersion:
    """One shape of a relation. ``column_ids`` give each column an identity that outlives its name (a
    column keeps its id through a rename; a column added gets an id no column of the relation had), so
    rows of an older version are laid out in a newer one by what each column is, not what it is called:
    a group may hold rows from before and after ``RENAME COLUMN a TO b``, and those rows' ``a`` is ``b``.
    Empty: positions (a version made without the cache)."""

    relation: Relation
    version: int
    key_indexes: tuple[int, ...]
    change: SchemaChange | None
    column_ids: tuple[int, ...] = ()

    @property
    def ids(self) -> tuple[int, ...]:
        """``column_ids``, or positions for a version that has none."""
        return self.column_ids or tuple(range(1, len(self.relation.columns) + 1))

    @property
    def namespace(self) -> str:
        return self.relation.namespace or "pg_catalog"

    @property
    def qualified_name(self) -> str:
        return f"{self.namespace}.{self.relation.name}"

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.relation.columns)


@dataclass(frozen=True, slots=True)
class TypeInfo:
    oid: int
    namespace: str
    name: str


class TypeCache:
    """User types ('Y' messages: enums, domains, composites, extension types), by OID."""

    def __init__(self) -> None:
        self._types: dict[int, TypeInfo] = {}

    def update(self, typ: Type) -> None:
        self._types[typ.oid] = TypeInfo(typ.oid, typ.namespace or "pg_catalog", typ.name)

    def get(self, oid: int) -> TypeInfo | None:
        return self._types.get(oid)

    def to_json(self) -> list[list[Any]]:
        return [[t.oid, t.namespace, t.name] for t in self._types.values()]

    @classmethod
    def from_json(cls, data: list[list[Any]]) -> TypeCache:
        cache = cls()
        for oid, ns, name in data:
            cache._types[int(oid)] = TypeInfo(int(oid), ns, name)
        return cache


def rename_candidates(old: Sequence[str], new: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """For each column of ``old`` missing from ``new``, the columns of ``new`` missing from ``old`` that
    could be it renamed. A rename keeps the column's attnum, and both lists are in attnum order, so a
    renamed column stays between the same surviving neighbours; a column added since gets a higher
    attnum than every column that existed, so it can only look like a rename of a column that
    followed every surviving one. Columns with no candidate were dropped, provably."""
    common = set(old) & set(new)

    def slots(names: Sequence[str]) -> dict[str, int]:
        out, seen = {}, 0
        for n in names:
            if n in common:
                seen += 1
            else:
                out[n] = seen
        return out

    old_slots, new_slots = slots(old), slots(new)
    return {g: tuple(n for n, s in new_slots.items() if s == slot) for g, slot in old_slots.items()
            if any(s == slot for s in new_slots.values())}


class ColumnsChanged(Protocol):
    """Decides which columns a Relation renamed: (relation OID, schema.table, columns gone, columns new,
    rename candidates) -> {old: new} (applier.sink.identity). Also told of every other Relation of a
    relation seen before, with nothing gone or new, its ``columns`` and whether they are ``same`` as the
    current version's: a column dropped and added again under its name, or names swapped, looks like
    nothing or a new order in the stream, and only the catalog's attnums tell."""

    def __call__(self, oid: int, table: str, gone: tuple[str, ...], new: tuple[str, ...],
                 candidates: dict[str, tuple[str, ...]], *, columns: tuple[str, ...] = (),
                 same: bool = False) -> dict[str, str]: ...


def _qualified(rel: Relation) -> str:
    return f"{rel.namespace or 'pg_catalog'}.{rel.name}"


def _names(rel: Relation) -> tuple[str, ...]:
    return tuple(c.name for c in rel.columns)


def _same_shape(a: Relation, b: Relation) -> bool:
    return (a.namespace, a.name, a.replica_identity, a.columns) == (b.namespace, b.name, b.replica_identity,
                                                                   b.columns)


def _diff(old: Relation, new: Relation) -> SchemaChange:
    old_cols = {c.name: c for c in old.columns}
    new_cols = {c.name: c for c in new.columns}
    retyped = tuple((n, old_cols[n].type_oid, old_cols[n].type_modifier, c.type_oid, c.type_modifier)
                    for n, c in new_cols.items()
                    if n in old_cols
                    and (old_cols[n].type_oid, old_cols[n].type_modifier) != (c.type_oid, c.type_modifier))
    renamed = None
    if (old.namespace, old.name) != (new.namespace, new.name):
        renamed = (f"{old.namespace or 'pg_catalog'}.{old.name}", f"{new.namespace or 'pg_catalog'}.{new.name}")
    old_keys = tuple(c.name for c in old.columns if c.is_key)
    new_keys = tuple(c.name for c in new.columns if c.is_key)
    return SchemaChange(
        added=tuple(n for n in new_cols if n not in old_cols),
        dropped=tuple(n for n in old_cols if n not in new_cols),
        retyped=retyped,
        renamed_relation=renamed,
        key_changed=old_keys != new_keys,
        replica_identity_changed=old.replica_identity != new.replica_identity,
    )


class RelationCache:
    """Relations by OID; each distinct shape of a relation is a numbered SchemaVersion."""

    def __init__(self, types: TypeCache | None = None, *, columns_changed: ColumnsChanged | None = None) -> None:
        self.types = types or TypeCache()
        self._current: dict[int, SchemaVersion] = {}
        self._next_column_id: dict[int, int] = {}  # per relation: the id its next added column gets
        #: told of every Relation that loses columns and gains others (None: the change is left as a drop
        #: and an add, and the sink stops where that could be a rename it was not told about)
        self.columns_changed = columns_changed

    def update(self, rel: Relation) -> SchemaVersion:
        current = self._current.get(rel.oid)
        if current is not None and _same_shape(current.relation, rel):
            if self.columns_changed is not None:
                self.columns_changed(rel.oid, _qualified(rel), (), (), {}, columns=_names(rel), same=True)
            return current
        keys = tuple(i for i, c in enumerate(rel.columns) if c.is_key)
        if current is None:
            ids = tuple(range(1, len(rel.columns) + 1))
            version = SchemaVersion(rel, 1, keys, None, ids)
            self._next_column_id[rel.oid] = len(ids) + 1
        else:
            change = _diff(current.relation, rel)
            if not change.dropped and self.columns_changed is not None:
                self.columns_changed(rel.oid, _qualified(rel), (), (), {}, columns=_names(rel))
            elif change.dropped and self.columns_changed is not None:
                candidates = rename_candidates(_names(current.relation), _names(rel))
                renamed = self.columns_changed(rel.oid, _qualified(rel), change.dropped, change.added, candidates,
                                               columns=_names(rel))
                if renamed:
                    # a column renamed may have changed type too (ALTER ... TYPE ... USING, then RENAME): its
                    # retype is the sink's to prove (applier.sink.retypes) under its new name
                    before = {c.name: c for c in current.relation.columns}
                    after = {c.name: c for c in rel.columns}
                    retyped = change.retyped + tuple(
                        (new, before[old].type_oid, before[old].type_modifier, after[new].type_oid,
                         after[new].type_modifier) for old, new in renamed.items()
                        if (before[old].type_oid, before[old].type_modifier)
                        != (after[new].type_oid, after[new].type_modifier))
                    change = SchemaChange(tuple(n for n in change.added if n not in renamed.values()),
                                          tuple(n for n in change.dropped if n not in renamed), retyped,
                                          change.renamed_relation, change.key_changed,
                                          change.replica_identity_changed, tuple(renamed.items()))
            version = SchemaVersion(rel, current.version + 1, keys, change, self._carry_ids(current, rel, change))
        self._current[rel.oid] = version
        return version

    def _carry_ids(self, current: SchemaVersion, rel: Relation, change: SchemaChange) -> tuple[int, ...]:
        """The new version's column ids: a column that kept its name or was renamed keeps its id (a name
        dropped here is not looked up: it is gone), every added one gets a fresh id."""
        by_name = dict(zip(current.column_names, current.ids, strict=True))
        moved = {new: by_name.pop(old) for old, new in change.renamed}  # at once: renames may swap names
        by_name.update(moved)
        for gone in change.dropped:
            by_name.pop(gone, None)
        following = self._next_column_id.get(rel.oid, max(current.ids, default=0) + 1)
        ids = []
        for c in rel.columns:
            if c.name in by_name:
                ids.append(by_name[c.name])
            else:
                ids.append(following)
                following += 1
        self._next_column_id[rel.oid] = following
        return tuple(ids)

    def update_type(self, typ: Type) -> None:
        self.types.update(typ)

    def get(self, oid: int) -> SchemaVersion:
        try:
            return self._current[oid]
        except KeyError:
            raise CatalogError(
                "change for a relation the stream has not described (no Relation message seen); the log "
                "does not start at a decoding-session boundary, or a message was lost",
                relation_oid=oid) from None

    def __contains__(self, oid: object) -> bool:
        return oid in self._current

    def replace_with(self, other: RelationCache) -> None:
        """Become ``other`` in place (its types too): others hold this object and its TypeCache (the
        applier converts with the types, table sync describes into the catalog)."""
        self._current = dict(other._current)
        self._next_column_id = dict(other._next_column_id)
        self.types._types = dict(other.types._types)

    def to_json(self) -> dict[str, Any]:
        return {
            "types": self.types.to_json(),
            "relations": [
                {"oid": v.relation.oid, "namespace": v.relation.namespace, "name": v.relation.name,
                 "replica_identity": v.relation.replica_identity, "version": v.version,
                 "columns": [[c.flags, c.name, c.type_oid, c.type_modifier] for c in v.relation.columns],
                 "column_ids": list(v.ids), "next_column_id": self._next_column_id.get(v.relation.oid)}
                for v in self._current.values()
            ],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], *, types: TypeCache | None = None,
                  columns_changed: ColumnsChanged | None = None) -> RelationCache:
        """The cache ``to_json`` saved. ``types``: a TypeCache others already hold (the applier), filled with
        the saved types and shared by the cache; else a new one."""
        saved = TypeCache.from_json(data.get("types", []))
        if types is not None:
            types._types.update(saved._types)
        cache = cls(types if types is not None else saved, columns_changed=columns_changed)
        for r in data.get("relations", []):
            rel = Relation(None, int(r["oid"]), r["namespace"], r["name"], r["replica_identity"],
                           tuple(RelationColumn(int(f), n, int(t), int(m)) for f, n, t, m in r["columns"]))
            keys = tuple(i for i, c in enumerate(rel.columns) if c.is_key)
            ids = tuple(int(i) for i in r.get("column_ids") or range(1, len(rel.columns) + 1))
            cache._current[rel.oid] = SchemaVersion(rel, int(r["version"]), keys, None, ids)
            cache._next_column_id[rel.oid] = int(r.get("next_column_id") or max(ids, default=0) + 1)
        return cache
