"""Which Delta table mirrors which source table: the source relation (its OID), not its name.

Why: PostgreSQL's subscriber matches tables by name, and so did applier. A table renamed away and its
old name taken by a new table (``ALTER TABLE t1 RENAME TO t2; CREATE TABLE t1``, or the same with a
schema) then had the new table's rows merged into the old table's Delta rows, and the renamed table's
rows kept going to the old path. The Relation message carries the relation's OID, which a rename keeps
and a new table never shares with a live one, so each OID is bound here to the Delta table it writes
(``<state>/relations.json``):

- an OID seen under a new name is a rename: its Delta table moves to the new name's path (the layout
  ``DIR/<schema>/<table>`` stays true, so ``status``, ``verify`` and readers find it by name), and its
  applied version moves with it, as the new name's Delta app id, in the same Delta commit that records
  the new source name;
- a new OID whose name's path is bound to another OID: the other relation is looked up in the live
  catalog. Renamed: its table moves to its new name first. Gone (dropped): its Delta table is retired
  to ``DIR/_retired/<schema>/<table>@<oid>`` with a warning, never merged into. A stored raw log is asked
  through the catalog notes ``applier capture`` wrote (applier.sources.catalog_lookup.RecordedCatalog);
  without a note that answers (``NotRecorded``), or without notes at all, nothing can prove which, and the
  run stops (``IdentityError``, exit 4).

A move is made crash-safe by writing its intent first (``moving``) and finishing it on the next start.
Column renames are told from drop+add by ``pg_attribute.attnum``, which a rename keeps and an added
column never reuses: the attnums of each bound relation's columns are recorded here when the catalog
and the stream agree on its columns, and compared when a column disappears and another appears.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from applier.errors import DataError, NotRecorded, ResyncNeededError
from applier.infra.crashpoints import crashpoint
from applier.sink.naming import RETIRED_DIR, _path_component
from applier.sink.pendingmove import RELATIONS_FILE
from applier.sink.registry import TargetRegistry
from applier.state import StateDir, resolved_path, stored_path
from applier.storage.location import is_object_store, join
from applier.storage.moves import TableInTheWay, move_table_on_store
from applier.storage.paths import location

if TYPE_CHECKING:
    from applier.sink.targets import TableTargets

log = logging.getLogger(__name__)

_FILE = RELATIONS_FILE


class IdentityError(DataError):
    """The stream names a table whose Delta table cannot be told apart from another's (exit 4)."""


class UnprovenRenameError(IdentityError, ResyncNeededError):
    """A column is gone and another is new, and nothing proved whether that is a rename (no catalog, or
    the catalog has moved on since): raised when the table's changes are applied, not when the
    Relation is decoded, so a table copied again past that point (``applier resync``, or
    ``apply.schema_changes: resync``) goes on; ``table`` is the source's ``schema.table``."""


class ColumnIdentityError(IdentityError, ResyncNeededError):
    """A column of the table is no longer the column of that name the Delta table holds (dropped and added
    again under the same name, or names swapped): the live catalog's attnums say so, but not where in the
    stream it happened, so the table is copied again (raised when its changes are applied, as
    UnprovenRenameError is)."""


class RewriteWitness(Protocol):
    """What the catalog keeps of a table's last rewrite (applier.sources.catalog_lookup.RewriteWitness)."""

    @property
    def relfilenode(self) -> int: ...

    @property
    def class_xmin(self) -> str: ...

    @property
    def column_xmins(self) -> dict[str, str]: ...


class CatalogLookup(Protocol):
    """The source catalog, asked when a name alone cannot say which table is which: the live one, or
    what ``applier capture`` recorded of it (either may raise NotRecorded: no answer)."""

    def relation(self, oid: int) -> tuple[str, str] | None:
        """(schema, name) of relation ``oid`` now; None when it no longer exists."""

    def attnums(self, oid: int) -> dict[str, int]:
        """Column name -> attnum of relation ``oid``'s live columns now (empty when it is gone)."""

    def dropped_attnums(self, oid: int) -> set[int]:
        """The attnums of relation ``oid``'s dropped columns (PostgreSQL keeps them in pg_attribute)."""

    def rewrite_witness(self, oid: int, columns: Sequence[str]) -> RewriteWitness | None:
        """What the catalog keeps of relation ``oid``'s last rewrite (None: it is gone)."""

    def rewritten_rows(self, oid: int, key: Sequence[str], columns: Sequence[str],
                       xid: str) -> Iterator[tuple[str | None, ...]]:
        """``key`` and ``columns`` as text of the rows transaction ``xid`` wrote and nobody changed since."""


@dataclass
class Bound:
    """One source relation's Delta table."""

    oid: int
    name: str  # schema.table as last followed
    path: str
    attnums: dict[str, int]
    retired: bool = False  # dropped in Postgres and its name taken: kept apart under DIR/_retired
    #: the name before its last rename: what a caller that keeps its own records by name (the table sync)
    #: follows when a crash came between the move, which a restart finishes, and that caller's record
    was: str | None = None
    #: names its columns had before (name -> attnum; ``attnums`` wins for a name in both): a stream read
    #: again after a crash may show a column under a name the table has renamed since, and the rename
    #: is proven from these (attnums are never reused within a relation)
    former: dict[str, int] = field(default_factory=dict)
    #: the table's relfilenode when its copy was taken, or when a type change was last proven to keep its
    #: values (applier.sink.retypes): a type change that finds it so rewrote nothing (None: not recorded)
    relfilenode: int | None = None

    def set_attnums(self, attnums: dict[str, int]) -> None:
        """The columns' attnums now; the names they replace are kept in ``former``."""
        for name, attnum in self.attnums.items():
            if attnums.get(name) != attnum:
                self.former[name] = attnum
        self.attnums = dict(attnums)


#: Moves a Delta table from one path to another and carries its applied version to the new name's
#: app id; given (old path, new path, old name, new name). Supplied by the engine (it knows the engines).
Mover = Callable[[str, str, str, str | None], None]


def saved_bindings(data: dict[str, Any], target_dir: str | None = None) -> list[Bound]:
    """The bindings of a target's saved identities (its state's ``relations``), in binding order; their paths
    under ``target_dir`` (the file keeps them relative to the target's root: applier.state.stored_path;
    None: as kept)."""
    return [Bound(int(k), v["name"], resolved_path(target_dir, v["path"]), dict(v.get("attnums") or {}),
                  bool(v.get("retired")), v.get("was"), dict(v.get("former") or {}), v.get("relfilenode"))
            for k, v in (data.get("tables") or {}).items()]


def known_names(state: StateDir) -> dict[str, int]:
    """The names a target's mirror knows live relations by (as last followed, and the one before a rename),
    read from its state without a ``TableTargets``: name -> relation OID."""
    out: dict[str, int] = {}
    for bound in saved_bindings(state.load(_FILE) or {}):
        if not bound.retired:
            for name in (bound.was, bound.name):
                if name:
                    out[name] = bound.oid
    return out


def retired_relations(state: StateDir) -> dict[int, str]:
    """Relations a target's mirror followed that were dropped and whose Delta tables it retired: OID -> the
    name they had (``applier resync`` sets their changes still in the stream aside when it is named either)."""
    return {bound.oid: bound.name for bound in saved_bindings(state.load(_FILE) or {}) if bound.retired}


class TableIdentities:
    """OID -> Delta table bindings of one target, and the moves that follow renames.

    ``mover``: carries a moved table's applied version and derived tables along (the engine's, which
    owns this map; None: this run cannot move tables). ``lookup``: the source catalog asked when a name
    alone cannot say which table is which (None: there is none to ask). Both are given here and never
    changed: what the map calls is what it was made with."""

    def __init__(self, state: StateDir, targets: TableTargets, mover: Mover | None = None, *,
                 lookup: CatalogLookup | None = None) -> None:
        self.state = state
        self.targets = targets
        self.lookup = lookup
        self.mover = mover
        data: dict[str, Any] = state.load(_FILE) or {}
        self._bound: dict[int, Bound] = {}
        #: indexes of ``_bound``, kept in step by ``_put``, ``_rename`` and ``_pop`` (the only writers of a
        #: binding's name, path or retired flag): name -> OIDs of the live (not retired) bindings of that
        #: name, and path -> OIDs of every binding at that path, each in binding order
        self._by_name: dict[str, dict[int, None]] = {}
        self._by_path: dict[str, dict[int, None]] = {}
        for bound in saved_bindings(data, targets.target_dir):
            self._put(bound)
        self._names: dict[tuple[int, str], tuple[str, str] | None] = {}  # (oid, stream's name) -> catalog's
        self._in_progress: set[int] = set()  # relations whose path_of is running (a swap of names nests)
        #: per relation: columns the stream renamed ({old: new}) and dropped since, for the sink
        self._columns: dict[int, dict[str, Any]] = {int(k): v for k, v in (data.get("columns") or {}).items()}
        moving: dict[str, str] | None = data.get("moving")
        self._moving = None if moving is None else {
            **moving, **{k: resolved_path(targets.target_dir, moving[k]) for k in ("from", "to") if moving.get(k)}}
        #: attnums of relations not bound yet, as a stored log's records gave them (``described``)
        self._described: dict[int, dict[str, int]] = {}

    # --- persistence ------------------------------------------------------------------------------

    def _save(self) -> None:
        """Paths are saved relative to the target's root (a target moved with its state goes on where it is:
        applier.state.stored_path); in memory they are the paths written."""
        root = self.targets.target_dir
        moving = self._moving
        if moving is not None:
            moving = {**moving, **{k: stored_path(root, moving[k]) for k in ("from", "to") if moving.get(k)}}
        self.state.save(_FILE, {"tables": {str(b.oid): {"name": b.name, "path": stored_path(root, b.path),
                                                        "attnums": b.attnums, "retired": b.retired, "was": b.was,
                                                        "former": b.former, "relfilenode": b.relfilenode}
                                           for b in self._bound.values()},
                                "moving": moving,
                                "columns": {str(k): v for k, v in self._columns.items()}})

    def finish_pending(self) -> None:
        """Complete a move a crash interrupted (its intent was saved before anything moved)."""
        if self._moving is None or self.mover is None:
            return
        m = self._moving
        log.warning("finishing the move of %s from %s to %s that an earlier run began", m["new_name"], m["from"],
                    m["to"])
        self._move(int(m["oid"]), m["from"], m["to"], m["old_name"], m["new_name"])

    # --- lookups ------------------------------------------------------------------------------------

    def bound(self, oid: int) -> Bound | None:
        return self._bound.get(oid)

    def live(self) -> list[Bound]:
        """Every binding of a relation not retired (a consistent cut lists their tables)."""
        return [b for b in self._bound.values() if not b.retired]

    def bound_by_name(self, qualified: str) -> Bound | None:
        """The live (not retired) binding named ``qualified``; the first bound when several are (a swap
        of names in progress)."""
        return self._first(self._by_name.get(qualified))

    def holder_of(self, path: str) -> Bound | None:
        """The binding at ``path``; the first bound when several are."""
        return self._first(self._by_path.get(path))

    def _first(self, oids: dict[int, None] | None) -> Bound | None:
        if not oids:
            return None
        if len(oids) == 1:
            return self._bound[next(iter(oids))]
        return next(b for b in self._bound.values() if b.oid in oids)  # rare: binding order decides, as it did

    # --- the bindings and their indexes (every change of a name, path or retired flag goes here) -------

    def _index(self, entry: Bound) -> None:
        if not entry.retired:
            self._by_name.setdefault(entry.name, {})[entry.oid] = None
        self._by_path.setdefault(entry.path, {})[entry.oid] = None

    def _unindex(self, entry: Bound) -> None:
        for index, key in ((self._by_name, entry.name), (self._by_path, entry.path)):
            oids = index.get(key)
            if oids is not None:
                oids.pop(entry.oid, None)
                if not oids:
                    del index[key]

    def _put(self, entry: Bound) -> None:
        """Bind ``entry.oid`` to ``entry`` (in its old place in binding order, or last)."""
        old = self._bound.get(entry.oid)
        if old is not None:
            self._unindex(old)
        self._bound[entry.oid] = entry
        self._index(entry)

    def _rename(self, entry: Bound, name: str, path: str) -> None:
        self._unindex(entry)
        if name != entry.name:
            entry.was = entry.name
        entry.name, entry.path = name, path
        self._index(entry)

    def _pop(self, oid: int) -> None:
        entry = self._bound.pop(oid, None)
        if entry is not None:
            self._unindex(entry)

    def path_of(self, oid: int, namespace: str, name: str) -> str:
        """The Delta path relation ``oid`` (now called ``namespace.name``) writes to, after following a
        rename or retiring a dropped table that held the name (see the module docstring)."""
        self._in_progress.add(oid)
        try:
            return self._path_of(oid, namespace, name)
        finally:
            self._in_progress.discard(oid)

    def _path_of(self, oid: int, namespace: str, name: str) -> str:
        qualified = f"{namespace}.{name}"
        entry = self._bound.get(oid)
        if entry is not None and (entry.retired or entry.name == qualified):
            return entry.path
        known = self._catalog_name(oid, qualified)
        if known is not None:
            # The stream may be behind the catalog (a name it shows was renamed again since, or is the
            # name before a rename the mirror already followed): the catalog's name now decides.
            (now,) = known
            if now is None and entry is not None:
                return entry.path  # dropped since: its last changes go where its rows are
            if now is not None:
                namespace, name = now
                qualified = f"{namespace}.{name}"
            if entry is not None and entry.name == qualified:
                return entry.path
        desired = self.targets.path_for(namespace, name)
        holder = self.holder_of(desired)
        if holder is not None and holder.oid != oid:
            self._make_way(holder, for_name=qualified, for_oid=oid)
            still = self.holder_of(desired)
            if still is not None and still.oid != oid:
                raise IdentityError(f"{qualified} (relation OID {oid}) and relation OID {still.oid} ({still.name}) "
                                    f"both claim {desired}; nothing was written to it. To go on: `applier resync "
                                    f"--config FILE --table {oid}` (and --table {still.oid}), or "
                                    "apply.schema_changes: resync (the default), which copies or sets aside each by "
                                    "itself", table=qualified,
                                    relation_oid=oid, held_by_oid=still.oid, path=desired)
        if entry is None:
            self._put(Bound(oid, qualified, desired, self._described.pop(oid, {})))
            self._save()
            return desired
        if (location(entry.path) / "_delta_log").is_dir() and entry.path != desired:
            self._check_free(desired, entry.name, qualified)
            self._rename_rules_check(entry.name, qualified)
            self._move(oid, entry.path, desired, entry.name, qualified)
        else:
            self._rename(entry, qualified, desired)
            self._save()
        return desired

    def _catalog_name(self, oid: int, qualified: str) -> tuple[tuple[str, str] | None] | None:
        """(the catalog's name of ``oid`` now, None when dropped), asked once per name the stream showed;
        None when there is no catalog to ask or it has no answer (NotRecorded)."""
        key = (oid, qualified)
        if key not in self._names:
            if self.lookup is None:
                return None
            try:
                self._names[key] = self.lookup.relation(oid)
            except NotRecorded:
                return None
        return (self._names[key],)

    def _make_way(self, holder: Bound, *, for_name: str, for_oid: int) -> None:
        """``holder``'s path is wanted by another relation: follow holder's rename, or retire it."""
        # (a holder whose Delta table does not exist yet is no exception: its changes may be waiting in
        # the same group, and must not end in the new relation's table)
        if holder.oid in self._in_progress:  # names swapped (t1 <-> t2): park one while the other moves
            parking = join(self.targets.target_dir, RETIRED_DIR, ".parking", str(holder.oid))
            self._move(holder.oid, holder.path, parking, holder.name, holder.name)
            return
        try:
            if self.lookup is None:
                raise NotRecorded(holder.oid)
            now = self.lookup.relation(holder.oid)
        except NotRecorded:
            raise IdentityError(
                f"{for_name} is now a different table (relation OID {for_oid}) from the one mirrored at "
                f"{holder.path} (OID {holder.oid}), and a stored log has no catalog to tell whether that one "
                "was renamed or dropped. Nothing was written to it. To go on: move or delete that Delta "
                f"directory and its entry in {self.state.root / (_FILE + '.json')} (and in tables.json), "
                "then run again; the new table is then created from the log's rows",
                relation=for_name, relation_oid=for_oid, held_by_oid=holder.oid, path=holder.path) from None
        if now is not None:
            log.warning("%s was renamed to %s.%s (relation OID %d); its Delta table follows it, and %s is a new "
                        "table", holder.name, now[0], now[1], holder.oid, for_name)
            self.path_of(holder.oid, *now)
            return
        retired = self.retired_path(holder)
        log.warning("%s (relation OID %d) no longer exists in Postgres and its name is taken by a new table "
                    "(OID %d): its Delta table is retired to %s, never merged into", holder.name, holder.oid,
                    for_oid, retired)
        self._move(holder.oid, holder.path, retired, holder.name, None)
        self._put(Bound(holder.oid, holder.name, retired, holder.attnums, retired=True))
        self._save()

    def retire(self, oid: int) -> str | None:
        """Relation ``oid`` was dropped in Postgres: its Delta table moves under DIR/_retired (as when a new
        table takes its name), never merged into again. Its new path; None when it is not bound or is
        retired already."""
        entry = self._bound.get(oid)
        if entry is None or entry.retired:
            return None
        retired = self.retired_path(entry)
        if (location(entry.path) / "_delta_log").is_dir():
            self._move(oid, entry.path, retired, entry.name, None)
        self._put(Bound(oid, entry.name, retired, entry.attnums, retired=True))
        self._save()
        return retired

    def retired_path(self, holder: Bound) -> str:
        schema, _, table = holder.name.partition(".")
        safe = self.targets.tables.safe_path_names(holder.name)
        return join(self.targets.target_dir, RETIRED_DIR, _path_component(schema, safe=safe),
                    _path_component(f"{table}@{holder.oid}", safe=safe))

    def _check_free(self, desired: str, old_name: str, new_name: str) -> None:
        if (location(desired) / "_delta_log").is_dir():
            raise IdentityError(
                f"{old_name} was renamed to {new_name}, but a Delta table that is not this mirror's is already "
                f"at {desired}; move it away (or name another target for the table in tables.rules) and run again",
                relation=new_name, path=desired)

    def _rename_rules_check(self, old_name: str, new_name: str) -> None:
        for qualified in (old_name, new_name):
            rule = self.targets.tables.rule_for(qualified)
            if rule is not None and (rule.target or rule.table):
                raise IdentityError(
                    f"{old_name} was renamed to {new_name}, and a tables rule gives {qualified} a target path or "
                    "a catalog name: update the rule to the new name (and move the Delta table if its path "
                    "changes), then run again", relation=new_name)

    def _move(self, oid: int, src: str, dst: str, old_name: str, new_name: str | None) -> None:
        if self.mover is None:
            raise IdentityError(f"{old_name} must move from {src} to {dst}, and this run cannot move tables",
                                relation=old_name)
        self._moving = {"oid": str(oid), "from": src, "to": dst, "old_name": old_name, "new_name": new_name or ""}
        self._save()
        if is_object_store(src) or is_object_store(dst):
            try:
                move_table_on_store(src, dst)  # copies and deletes: stops anywhere, finished by repeating
            except TableInTheWay:
                raise IdentityError(
                    f"{old_name} must move from {src} to {dst}, where a Delta table that is not this mirror's "
                    f"now is; move it away (or name another target for the table in tables.rules) and run again",
                    relation=new_name or old_name, path=dst) from None
        elif Path(src).exists() and not Path(dst, "_delta_log").is_dir():
            Path(dst).parent.mkdir(parents=True, exist_ok=True)
            os.replace(src, dst)
            _prune_empty_parent(Path(src))
        crashpoint("table_moved")
        self.mover(src, dst, old_name, new_name or None)
        TargetRegistry(self.state, self.targets.target_dir).moved(src, dst if new_name else None)
        if new_name:
            entry = self._bound.get(oid)
            if entry is None:
                self._put(Bound(oid, new_name, dst, {}))
            else:
                self._rename(entry, new_name, dst)
        else:
            self._pop(oid)
        self._moving = None
        self._save()

    # --- columns ------------------------------------------------------------------------------------

    def record_attnums(self, oid: int, attnums: dict[str, int]) -> None:
        entry = self._bound.get(oid)
        if entry is not None and entry.attnums != attnums:
            entry.set_attnums(attnums)
            self._save()

    def record_dropped(self, oid: int, dropped: set[int]) -> None:
        """The attnums of relation ``oid``'s columns dropped as of its copy: the baseline's, which the
        stream never shows dropped (``observe`` counts only newer ones)."""
        if oid in self._bound:
            self._columns.setdefault(oid, {"renamed": {}, "dropped": []})["dropped_upto"] = max(dropped, default=0)
            self._save()

    def record_relfilenode(self, oid: int, relfilenode: int | None) -> None:
        """Relation ``oid``'s relfilenode as of its copy, or of a type change proven to keep its values."""
        entry = self._bound.get(oid)
        if entry is not None and entry.relfilenode != relfilenode:
            entry.relfilenode = relfilenode
            self._save()

    def described(self, oid: int, attnums: dict[str, int]) -> None:
        """The stream's Relation of ``oid`` just decoded has exactly the columns ``attnums`` names, with
        these attnums (what ``applier capture`` recorded of the catalog for that message): the baseline its
        next column change is proven against, in log order (``observe`` records it at apply time on a live
        mirror, where the catalog is read then). Kept aside until the relation is bound."""
        if oid in self._bound:
            self.record_attnums(oid, attnums)
        else:
            self._described[oid] = dict(attnums)

    def observe(self, oid: int, columns: tuple[str, ...]) -> None:
        """Record relation ``oid``'s attnums when the live catalog has exactly ``columns`` (the stream's
        current Relation): then no DDL is pending between the two and the names are the same columns."""
        entry = self._bound.get(oid)
        if self.lookup is None or entry is None:
            return
        try:
            now = self.lookup.attnums(oid)
        except NotRecorded:
            return
        if set(now) != set(columns):
            return
        table = entry.name
        if self._moved_columns(entry, table, now, columns, False):
            return  # never recorded as the baseline: the next Relation would look as if nothing happened
        known = set(entry.attnums.values()) | set(entry.former.values())
        log_ = self._columns.setdefault(oid, {"renamed": {}, "dropped": []})
        try:
            dropped = self.lookup.dropped_attnums(oid)
        except NotRecorded:
            dropped = set()
        if known and "dropped_upto" in log_ and any(n not in entry.attnums for n in now):
            # Columns added since the baseline take their attnums from the catalog now. Each column newer
            # than every recorded one (and than every one dropped at the last record) that has been dropped
            # since must be one the stream showed dropped: one more, and an added name may have been dropped
            # and added again after the Relation that added it (the Relations around that look alike), so the
            # catalog's attnum may not be its.
            floor = max(max(known), int(log_.get("dropped_upto", 0)))
            late = sorted(d for d in dropped if d > floor)
            if len(late) > int(log_.get("new_dropped", 0)):
                self.needs_copy(oid, table, f"a column of {table} added since the mirror last recorded its columns "
                                "was dropped again where the stream does not show it (attnum "
                                + ", ".join(map(str, late)) + "), so the catalog cannot say which column each new "
                                "name is")
                return
        upto = max(dropped, default=int(log_.get("dropped_upto", 0)))
        if log_.pop("new_dropped", None) is not None or log_.get("dropped_upto") != upto:
            log_["dropped_upto"] = upto  # drops the stream showed ahead of this record are behind it now
            self._save()
        self.record_attnums(oid, now)

    def columns_changed(self, oid: int, table: str, gone: tuple[str, ...], new: tuple[str, ...],
                        candidates: dict[str, tuple[str, ...]], *, columns: tuple[str, ...] = (),
                        same: bool = False) -> dict[str, str]:
        """A Relation of ``oid`` lost the columns ``gone`` and gained ``new`` (catalog.RelationCache):
        which were renamed, proven by equal attnums where the column order leaves a doubt
        (``candidates``), noted for the sink (``renames_for``); raises IdentityError when it cannot be
        told. Called as the stream is decoded, so the note is there before the sink evolves the table.

        Called with nothing gone and nothing new for every other Relation of a relation seen before (one
        re-sent as it was, or with its columns in another order): the columns that kept their names are
        checked against their recorded attnums (``_check_identity``)."""
        if not gone and not new:
            self._check_identity(oid, table, columns, same)
            return {}
        renamed: dict[str, str] = {}
        undecided: dict[str, str] = {}
        if candidates:
            renamed, undecided = self._prove_renames(oid, table, candidates)
        log_ = self._columns.setdefault(oid, {"renamed": {}, "dropped": []})
        entry = self._bound.get(oid)
        if entry is not None:  # columns added since the baseline that the stream shows dropped again
            known = {**entry.former, **entry.attnums}
            log_["new_dropped"] = log_.get("new_dropped", 0) + len(
                [g for g in gone if g not in renamed and g not in undecided and g not in known])
        log_["renamed"].update(renamed)
        log_["dropped"] = sorted(set(log_["dropped"]) | (set(gone) - set(renamed) - set(undecided)))
        if undecided:  # told to the sink, which stops only if it applies changes past this point
            log_.setdefault("undecided", {}).update(undecided)
        self._save()
        if columns and not undecided:  # a kept name may have been given to another column meanwhile
            self._check_identity(oid, table, columns, False)
        return renamed

    def _check_identity(self, oid: int, table: str, columns: tuple[str, ...], same: bool) -> None:
        """Every column the catalog has under a name the relation's recorded columns had must have the
        attnum recorded for it: one that has another is another column (the recorded one was dropped, or
        renamed away, and the name given to a new column or to another renamed one). The Delta table
        holds the old column's values under that name; the stream never says when the name moved (a
        Relation re-sent with the same names and types looks as it did), so the table must be copied
        again (``recopy_reason``). ``columns``: the Relation's; ``same``: as the current version's."""
        entry = self._bound.get(oid)
        if entry is None or entry.retired or not entry.attnums or self.lookup is None:
            return
        try:
            now = self.lookup.attnums(oid)
        except NotRecorded:
            return
        self._moved_columns(entry, table, now, columns, same)

    def _moved_columns(self, entry: Bound, table: str, now: dict[str, int], columns: tuple[str, ...],
                       same: bool) -> bool:
        """Flag ``entry``'s table for a copy when a column of ``now`` has a recorded name but another attnum
        (see ``_check_identity``); True when it did. A name whose recorded column is still there under a
        name the Relation does not show yet (or under any name, when the Relation is the current version
        re-sent) waits: that column is renamed later in the stream, which will show the rename, and the
        name's new column after it."""
        by_attnum = {a: n for n, a in now.items()}

        def renamed_later(name: str) -> bool:
            other = by_attnum.get(entry.attnums[name])
            return other is not None and other != name and (same or other not in columns)

        moved = sorted(n for n, a in now.items()
                       if n in entry.attnums and entry.attnums[n] != a and not renamed_later(n))
        if not moved:
            return False
        self.needs_copy(entry.oid, table, f"column(s) {', '.join(moved)} of {table} are not the columns of that name "
                        "the Delta table holds (the catalog gives them other attnums: dropped and added again under "
                        "the same name, or names swapped by renames), and the stream does not say at which change "
                        "that happened")
        return True

    def needs_copy(self, oid: int, table: str, why: str) -> None:
        """Note that relation ``oid``'s Delta table must be copied again before any more of its changes are
        applied (``recopy_reason``), for ``why``; ``copied_anew`` clears it."""
        log_ = self._columns.setdefault(oid, {"renamed": {}, "dropped": []})
        if log_.get("recopy") == why:
            return
        log.warning("%s (relation OID %d): %s; its Delta table will be copied again", table, oid, why)
        log_["recopy"] = why
        self._save()

    def recopy_reason(self, oid: int) -> str | None:
        """Why relation ``oid``'s Delta table must be copied again before more of its changes are applied
        (see ``needs_copy``), or None."""
        log_ = self._columns.get(oid)
        return None if log_ is None else log_.get("recopy")

    def _prove_renames(self, oid: int, table: str,
                       candidates: dict[str, tuple[str, ...]]) -> tuple[dict[str, str], dict[str, str]]:
        """The columns proven renamed ({old: new}) and those nothing can prove either way ({old: why})."""
        entry = self._bound.get(oid)
        gone, new = sorted(candidates), sorted({n for c in candidates.values() for n in c})
        current: dict[str, int] | None = None
        if self.lookup is not None:
            try:
                current = self.lookup.attnums(oid)
            except NotRecorded:
                pass
        if current is None:
            why = (f"column(s) {', '.join(gone)} are gone and {', '.join(new)} are new in the same schema change: a "
                   "rename or a drop and an add, which the stream alone cannot tell apart (no catalog to ask: a "
                   "stored log). To go on: follow the table with a live `applier mirror` and re-copy it there; or "
                   "rebuild it from a log that starts after this change (delete its Delta directory and its entry "
                   "in tables.json)")
            return {}, dict.fromkeys(gone, why)
        # a name the relation's columns had before counts where no current one has it: the stream read again
        # after a crash (between a rename's Delta commit and the rest) shows the rename the table made already
        recorded = {**entry.former, **entry.attnums} if entry is not None else self._described.get(oid, {})
        unknown = [c for c in gone if c not in recorded] + [c for c in new if c not in current]
        if unknown and entry is not None and not [c for c in new if c not in current]:
            added = self._added_since_baseline(oid, entry, [c for c in gone if c not in recorded], candidates,
                                               current)
            if added is not None:
                recorded = {**recorded, **added}
                unknown = []
        if unknown:
            why = (f"column(s) {', '.join(gone)} are gone and {', '.join(new)} are new, and the catalog cannot prove "
                   f"which were renamed (no recorded or current attnum for {', '.join(unknown)}: the catalog has "
                   "moved on since, or a stored log's capture did not record it)")
            return {}, dict.fromkeys(gone, why)
        renamed = {g: n for g, options in candidates.items() for n in options if recorded[g] == current[n]}
        if renamed and entry is not None:
            entry.set_attnums({renamed.get(k, k): v for k, v in entry.attnums.items()})
        elif renamed and oid in self._described:
            self._described[oid] = {renamed.get(k, k): v for k, v in recorded.items()}
        return renamed, {}

    def _added_since_baseline(self, oid: int, entry: Bound, unrecorded: list[str],
                              candidates: dict[str, tuple[str, ...]], current: dict[str, int]) -> dict[str, int] | None:
        """The attnum of the one column ``unrecorded`` names (gone from the stream, no attnum recorded for it),
        when the catalog proves it; None when it cannot. Such a column was added after the recorded baseline
        (which holds every column live then, and the highest attnum dropped then): its attnum is above all of
        those, and attnums only grow. If no column above them has been dropped since, it is still live, so when
        exactly one live column is above them, it is that one, under its name now (a column added, written
        and renamed between two runs, which no Relation could record). Any doubt (a rename of a recorded
        column left undecided, a drop above the baseline, two new columns) leaves it unproven: the table is
        then copied again, never guessed."""
        log_ = self._columns.get(oid, {})
        known = {**entry.former, **entry.attnums}
        if len(unrecorded) != 1 or not known or "dropped_upto" not in log_ or log_.get("undecided") \
                or self.lookup is None:
            return None
        floor = max(max(known.values()), int(log_["dropped_upto"]))
        try:
            dropped = self.lookup.dropped_attnums(oid)
        except NotRecorded:
            return None
        above = [name for name, attnum in current.items() if attnum > floor]
        if any(d > floor for d in dropped) or len(above) != 1 or above[0] not in candidates.get(unrecorded[0], ()):
            return None
        return {unrecorded[0]: current[above[0]]}

    def renames_for(self, oid: int, table: str, gone: tuple[str, ...], new: tuple[str, ...],
                    candidates: dict[str, tuple[str, ...]]) -> dict[str, str]:
        """For the sink: which Delta columns ``gone`` (no longer in the stream's columns) are now which of
        ``new``, by the renames noted since (followed through chains). A gone column that may be one
        of the new ones (``candidates``) and was neither noted renamed nor dropped cannot be told:
        IdentityError."""
        log_ = self._columns.get(oid, {"renamed": {}, "dropped": []})
        out: dict[str, str] = {}
        for g in gone:
            name = _renamed_to_end(log_["renamed"], g)
            if name != g and name in new:
                out[g] = name
            elif g in candidates and g not in log_["dropped"]:
                why = (log_.get("undecided") or {}).get(g) or (
                    f"column {g} is gone and {', '.join(candidates[g])} new, and no catalog told this mirror "
                    "whether that is a rename")
                raise _unproven(table, oid, g, why)
        return out

    def check_undecided(self, oid: int, table: str, columns: tuple[str, ...]) -> None:
        """Before changes of relation ``oid`` with ``columns`` are applied: UnprovenRenameError when a column
        they lack was left undecided (renamed or dropped, nothing proved which) by the stream's Relations.
        ``renames_for`` asks this of the columns the Delta table has; this is for one it never had: added
        and written within the changes being applied, then gone. Applying them under the newer columns
        would drop what they wrote to it, which was perhaps a rename's values."""
        for g, why in ((self._columns.get(oid) or {}).get("undecided") or {}).items():
            if g not in columns:
                raise _unproven(table, oid, g, why)

    def renamed_to(self, oid: int, names: set[str]) -> set[str]:
        """The names the columns ``names`` of relation ``oid`` have now by the renames noted and not yet
        applied (followed through chains): a column the stream shows under a new name is not a new column
        (not one added with a default to fill, say)."""
        renamed = self._columns.get(oid, {}).get("renamed", {})
        out: set[str] = set()
        for name in names:
            current = _renamed_to_end(renamed, name)
            if current != name:
                out.add(current)
        return out

    def named_now(self, oid: int, name: str) -> str | None:
        """The name column ``name`` of relation ``oid`` has in the catalog now when a rename made it another:
        a rename the stream's Relations proved, or, for a column added since the recorded baseline that no
        Relation shows renamed yet, the catalog's proof (``_added_since_baseline``); None otherwise."""
        renamed = _renamed_to_end((self._columns.get(oid) or {}).get("renamed", {}), name)
        if renamed != name:
            return renamed
        entry = self._bound.get(oid)
        if entry is None or self.lookup is None or name in entry.attnums or name in entry.former:
            return None
        try:
            current = self.lookup.attnums(oid)
        except NotRecorded:
            return None
        if name in current:
            return None
        proven = self._added_since_baseline(oid, entry, [name], {name: tuple(current)}, current)
        if proven is None:
            return None
        return next(n for n, a in current.items() if a == proven[name])

    def copied_anew(self, oid: int) -> None:
        """Relation ``oid``'s Delta table is being replaced by a fresh copy (``applier resync``): what the
        stream said of its columns before (renames noted, drops, undecided ones) no longer applies to it,
        and its attnums are read again from the live catalog as the copy's baseline."""
        changed = self._columns.pop(oid, None) is not None
        entry = self._bound.get(oid)
        if entry is not None and self.lookup is not None:
            try:
                now = self.lookup.attnums(oid)
            except NotRecorded:
                now = {}
            if now and now != entry.attnums:
                entry.set_attnums(now)
                changed = True
        if changed:
            self._save()

    def renames_applied(self, oid: int, done: dict[str, str], columns: tuple[str, ...] = ()) -> None:
        """The renames ``done`` are in the Delta table now, and so is every noted one whose old name is not
        among its ``columns`` and whose new name (followed through chains) is: one a run before a crash
        made already, whose note would otherwise outlive it."""
        log_ = self._columns.get(oid)
        if log_ is None:
            return
        renamed: dict[str, str] = log_["renamed"]
        have = set(columns)

        kept = {k: v for k, v in renamed.items()
                if k not in done and not (k not in have and _renamed_to_end(renamed, k) in have)}
        if kept != renamed:
            log_["renamed"] = kept
            self._save()


def _unproven(table: str, oid: int, column: str, why: str) -> UnprovenRenameError:
    return UnprovenRenameError(
        f"{table}: {why}; nothing was written to the table. To go on: re-copy the table (`applier "
        f"resync --config FILE --table {table}`: its Delta table is replaced by a copy at a new "
        "position, which this change is behind; or set apply.schema_changes: resync to do this by "
        "itself)", table=table, relation_oid=oid, columns=column)


def _renamed_to_end(renamed: dict[str, str], name: str) -> str:
    """The name column ``name`` has after the noted renames (``renamed``: old -> new), followed through
    chains (a -> b -> c); a cycle stops where it would repeat."""
    seen: set[str] = set()
    while name in renamed and name not in seen:
        seen.add(name)
        name = renamed[name]
    return name


def _prune_empty_parent(path: Path) -> None:
    try:
        path.parent.rmdir()  # a schema directory left empty by the move
    except OSError:
        pass
