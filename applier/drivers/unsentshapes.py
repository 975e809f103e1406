"""Schema changes the stream has not sent: a column renamed or added in Postgres reaches Delta by the end
of the next run, without waiting for a row change of its table.

Why: pgoutput sends a table's Relation message only before a change of that table, so ``ALTER TABLE t
RENAME COLUMN a TO b`` (or ``ADD COLUMN``) followed by no change to ``t`` never reaches the stream: every
run ended with exit 0, the Delta table kept ``a``, and ``applier verify`` differed until some row of
``t`` changed (issue 73). The mirror asks the catalog instead, as it already does for renamed tables.

Why this is exact. A catalog read at time X may show DDL the stream has not reached yet, and the changes
made before that DDL still come later, each with its own older Relation: a shape must never reach Delta
before them. So it takes two steps:

1. ``observe`` (when a run starts, and now and then while a follower is idle): under one snapshot, the
   copied tables whose live columns are not the ones the mirror recorded for them (applier.sink.identity
   keeps each column's attnum) are described as pgoutput would send them now (``describe_relation``),
   with their columns' attnums and a fingerprint of their catalog rows (``shape_fingerprints``). Then the
   position P the server has written up to is read (``written_position``), and the mirror waits, briefly,
   until the server's flush position reaches it (so a drain that reads the flush position later reads
   past P). Every ALTER that snapshot saw committed before P, and so did every change of the table made
   before it: its ACCESS EXCLUSIVE lock waited for their transactions.
2. ``settle``, once the slot's confirmed position is at or past P (the end of a ``--once`` drain, or a
   follower's idle moment): the mirror confirms nothing before its Delta commits exist, so every change
   of those tables made before their ALTERs is in Delta. A table is brought to its described shape only
   when its fingerprint is unchanged now: no ALTER since step 1, so every change of it made after its
   last ALTER, applied already or still on its way, is decoded with the described shape, and no change
   is still on its way under another one. The described Relation goes through the feeder's catalog, as
   if the stream had sent it at P (renames proven by attnum, as for any Relation; a Relation the stream
   sent since is either of this shape, and nothing is left to do, or of an older one whose changes are
   all applied), and the sink's own evolution (``DeltaApplier.ensure``). The table's next change comes
   with a Relation of this shape or a later one, which the catalog compares with this one as it compares
   any two.

What is applied: columns renamed, and columns added with no default (NULL in the rows that exist) or with
a constant default (PostgreSQL's missing value, filled as applier.drivers.columnfill fills it). Each is
noted in the state first (``INTENTS_KEY``) and forgotten once done: a run that stops part-way leaves the
next run to finish it before anything else (``finish``), or to look at the table again. A column added
with values the catalog does not hold (a volatile default, an identity or generated value: the table was
rewritten), or a name given to another column (dropped and added again, names swapped), has rows no
catalog gives: the table is copied again at a new position, as ``applier resync`` copies it.

Changed types (``ALTER COLUMN ... TYPE``, with or without ``USING``) too: the Delta table had kept the old
type, and with it values Postgres had rewritten (numeric 4450.40 kept as a decimal while Postgres holds
the text '4450.40'; a boolean where Postgres holds 'true'), exit 0, until the table's next change. Step 1
looks at a table's types whenever its catalog rows changed since its types were last found in line
(``TYPES_KEY``: its fingerprint then; a table never looked at is looked at once). Step 2 compares the
described types with the Delta table's; and, when the table was rewritten since its copy or the last proof
(its relfilenode: an ``ALTER ... TYPE`` that changes a value always rewrites), it has the values of the
columns that may have changed type compared with the Delta table's (``_suspects``: a type other than the
stream's last Relation gave, which Delta may not see, ``varchar`` to ``text USING upper(s)``; or a column
the rewrite's transaction altered). A change Delta can widen in place (applier.sink.store.sparkddl's
``widenable``) whose values the catalog proves kept (the sink's own proof for a Relation's type change,
applier.sink.retypes, through ``DeltaApplier``) is applied as a Relation would apply it; anything else (a
type Delta cannot widen, values the ``USING`` changed or that cannot be proven kept, a retype together
with a rename or an added column) copies the table again: the copy holds Postgres' values, in Postgres'
types. A table only Spark reads is looked at in Delta only when the catalog says a type may have changed
there (``_suspects``): a looking-over of every such table would start Spark in runs that need none.

Anything else (a changed key or replica identity, a column the mirror has no attnum for, a table with
history or change feed tables that a copy would need) is left to the table's next Relation, as before.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import psycopg

from applier.catalog import RelationCache, TypeCache
from applier.catalog.batches import TableBatch
from applier.errors import SinkError, SourceError, ValueConversionError
from applier.lsn import format_lsn
from applier.protocol.messages import COL_TEXT, Relation, RelationColumn, Type
from applier.sink.extras import ExtraColumns
from applier.sink.fold import table_spec
from applier.sink.parking import ParkedTables
from applier.sink.store.deltatypes import delta_type
from applier.sources import sql_slot
from applier.sources.catalog_lookup import (
    dropped_attnums,
    relations_now,
    rewrite_witness,
    shape_fingerprints,
    written_position,
)
from applier.sources.publication import PublishedTable, published_selection
from applier.sources.slots import slot_info
from applier.sources.snapshot import describe_relation

if TYPE_CHECKING:
    from collections.abc import Callable

    from applier.catalog import SchemaVersion
    from applier.config import MirrorConfig
    from applier.infra.progress import Progress
    from applier.sink.engine import DeltaApplier
    from applier.sink.identity import Bound
    from applier.sink.spec import TableSpec
    from applier.state import StateDir

log = logging.getLogger(__name__)

#: state key: per relation OID, a shape this module began to apply and has not finished (see ``_evolve``)
INTENTS_KEY = "unsent_shapes"
#: state key: per relation OID, the catalog fingerprint at which its Delta types were last found to be
#: Postgres' (step 2, so no Relation of an older shape is still on its way); its types are looked at again
#: only when its catalog rows change
TYPES_KEY = "unsent_types"
#: how often a follower that stays idle asks the catalog again
OBSERVE_EVERY_SECONDS = 10.0
#: how long an observation waits for the server to flush what its snapshot saw (normally no wait at all)
FLUSH_WAIT_SECONDS = 2.0


@dataclass(frozen=True)
class Described:
    """One table as step 1 saw it: what pgoutput would send for it then, its live columns' attnums and its
    catalog fingerprint."""

    table: PublishedTable
    relation: Relation
    types: tuple[Type, ...]
    attnums: dict[str, int]
    fingerprint: str
    dropped: frozenset[int] = frozenset()  # attnums of its dropped columns


@dataclass(frozen=True)
class Observation:
    position: int  # P: every ALTER the snapshot saw ended at or before it
    tables: dict[int, Described] = field(default_factory=dict)


@dataclass(frozen=True)
class Evolve:
    """Bring the Delta table to the described shape: ``renamed`` (old -> new), ``added`` (NULL in the rows
    that exist, or the constant of ``fills``: column -> missing value's text), ``retyped`` (column -> what
    changed, for the log: types whose values are proven kept)."""

    renamed: dict[str, str]
    added: tuple[str, ...]
    fills: dict[str, str]
    seed: Relation | None  # the shape the Delta table has, for a relation the feeder's catalog lacks
    retyped: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Recopy:
    why: str


class UnsentShapes:
    """The two steps of the module docstring for one mirror run (``TableSync`` calls them)."""

    def __init__(self, config: MirrorConfig, applier: DeltaApplier, catalog: RelationCache, state: StateDir,
                 progress: Progress) -> None:
        self.config = config
        self.applier = applier
        self.catalog = catalog
        self.state = state
        self.progress = progress
        self.pending: Observation | None = None
        self.observed_at: float | None = None  # time.monotonic() of the last observation this run
        #: off where nothing could prove a rename (no identity map: a dry run) or a schema change must stop
        self.enabled = applier.identities is not None and config.apply.schema_changes != "stop"

    # --- step 1 -------------------------------------------------------------------------------------

    def due(self) -> bool:
        """An idle follower's next observation is due (none waits to be settled, the last is old enough)."""
        return self.enabled and self.pending is None and (
            self.observed_at is None or time.monotonic() - self.observed_at >= OBSERVE_EVERY_SECONDS)

    def observe(self, conn: psycopg.Connection[Any], known: dict[str, str]) -> None:
        """Step 1 for the tables in ``known`` (copied, by name). Replaces an observation not yet settled."""
        if not self.enabled:
            return
        self.observed_at = time.monotonic()
        self.pending = None
        intents = self.state.load(INTENTS_KEY) or {}
        ids = self.applier.identities
        assert ids is not None
        described: dict[int, Described] = {}
        with conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            tables = [t for t in published_selection(conn, self.config.source.publication, self.config.tables)
                      if t.qualified_name in known and t.oid is not None]
            now = relations_now(conn, [t.oid for t in tables if t.oid is not None])
            fingerprints = shape_fingerprints(conn, [t.oid for t in tables if t.oid is not None])
            typed = self._types_seen(fingerprints)
            changed = []
            for t in tables:
                assert t.oid is not None
                entry = ids.bound(t.oid)
                if t.oid in now and entry is not None and not entry.retired and (
                        now[t.oid][1] != entry.attnums or str(t.oid) in intents
                        or typed.get(str(t.oid)) != fingerprints.get(t.oid)):
                    changed.append(t)
            if not changed:
                return
            for t in changed:
                assert t.oid is not None
                try:
                    relation, types = describe_relation(conn, t)
                except SourceError:
                    continue  # gone under another name since the publication was read: the next observation
                described[t.oid] = Described(t, relation, tuple(types), now[t.oid][1], fingerprints[t.oid],
                                             frozenset(dropped_attnums(conn, t.oid)))
        position = written_position(conn)
        if not self._flushed(conn, position):
            log.info("catalog shapes: the server has not flushed %s yet; asking again later", format_lsn(position))
            return
        self.pending = Observation(position, described)

    def _flushed(self, conn: psycopg.Connection[Any], position: int) -> bool:
        """Wait up to FLUSH_WAIT_SECONDS for the server's flush position to reach ``position``: a drain reads
        up to the flush position, which it reads after this (a commit made with ``synchronous_commit = off``
        is seen before it is flushed; an idle server has flushed all)."""
        deadline = time.monotonic() + FLUSH_WAIT_SECONDS
        while sql_slot.current_flush_lsn(conn) < position:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def _types_seen(self, fingerprints: dict[int, str]) -> dict[str, str]:
        """``TYPES_KEY``, less the relations no longer among ``fingerprints`` (gone, or no longer copied)."""
        seen: dict[str, str] = self.state.load(TYPES_KEY) or {}
        kept = {k: v for k, v in seen.items() if int(k) in fingerprints}
        if kept != seen:
            self.state.save(TYPES_KEY, kept)
        return kept

    def _types_in_line(self, oid: int, fingerprint: str) -> None:
        """Step 2 found relation ``oid``'s Delta types to be Postgres' at ``fingerprint``: not looked at
        again until its catalog rows change."""
        seen: dict[str, str] = self.state.load(TYPES_KEY) or {}
        if seen.get(str(oid)) != fingerprint:
            seen[str(oid)] = fingerprint
            self.state.save(TYPES_KEY, seen)

    def _stream(self, oid: int) -> Relation | None:
        """The feeder catalog's current Relation of ``oid`` (the stream's last, or the last applied here)."""
        return self.catalog.get(oid).relation if oid in self.catalog else None

    # --- step 2 -------------------------------------------------------------------------------------

    def settle(self, conn: psycopg.Connection[Any], *, waiting: Callable[[int, str], bool],
               confirmed: int | None = None) -> list[tuple[Described, str]]:
        """Step 2, when the slot has been confirmed past the pending observation's position (else nothing
        happens yet). Evolves the tables it can; returns the ones to copy again, with why. ``waiting``
        (relation OID, name): the table has a copy or a column fill of the stream's own under way.
        ``confirmed``: the position this run confirmed, which the server may not have taken (a walsender
        ended before the last status reached it, the soak's finding): this mirror confirms a position
        only once every Delta commit before it exists, which is what step 2 needs to know."""
        seen = self.pending
        if seen is None or not self.enabled:
            return []
        info = slot_info(conn, self.config.source.slot)
        if info is None:
            return []
        reached = max(info.confirmed_flush_lsn or 0, confirmed or 0)
        if reached < seen.position:
            return []
        self.pending = None
        if not seen.tables:
            return []
        fingerprints = shape_fingerprints(conn, list(seen.tables))
        parked = ParkedTables(self.state).entries()
        parked_oids = {e.get("oid") for e in parked.values()}
        recopy: list[tuple[Described, str]] = []
        for oid, d in seen.tables.items():
            name = d.table.qualified_name
            if fingerprints.get(oid) != d.fingerprint or waiting(oid, name) or name in parked or oid in parked_oids:
                continue  # altered since (the next observation sees it), or not the stream's to apply now
            plan = self._plan(conn, d)
            if isinstance(plan, Recopy):
                self._forget(oid)  # the copy holds whatever a shape begun here would have written
                recopy.append((d, plan.why))
            elif plan is not None:
                self._evolve(d, plan, seen.position)
        return recopy

    def _plan(self, conn: psycopg.Connection[Any], d: Described) -> Evolve | Recopy | None:
        """What brings the table's Delta table to ``d``'s shape, or None: nothing, or nothing this module
        can prove (left to the table's next Relation)."""
        ids = self.applier.identities
        assert ids is not None
        oid, table = d.relation.oid, d.table
        entry = ids.bound(oid)
        if entry is None or entry.retired or entry.name != table.qualified_name or ids.recopy_reason(oid):
            return None  # a table rename the next check follows first; a copy already asked for
        retype = self._retype(conn, d, entry)
        if not retype and entry.attnums == d.attnums and str(oid) not in (self.state.load(INTENTS_KEY) or {}):
            return None  # observed for its types only (TYPES_KEY), which are in line
        delta = self.applier.relation_columns(oid, table.namespace, table.name)
        if delta is None:
            return None
        names = [c.name for c in d.relation.columns]
        moved = sorted(n for n in names if n in delta and n in entry.attnums and entry.attnums[n] != d.attnums[n])
        if moved:
            return self._recopy_or_none(d, f"column(s) {', '.join(moved)} are not the columns of that name its Delta "
                                           "table holds (dropped and added again, or names swapped)")
        excluded = self.applier.targets.excluded_columns(table.namespace, table.name)
        missing = [n for n in names if n not in delta and n not in excluded]
        if isinstance(retype, Recopy) or (retype and missing):
            return self._recopy_or_none(d, retype.why if isinstance(retype, Recopy) else
                                        f"column(s) {', '.join(sorted(retype))} changed type, and column(s) "
                                        f"{', '.join(missing)} were renamed or added with it")
        if retype:
            return Evolve({}, (), {}, None, retyped=retype)
        if not missing:
            intent = (self.state.load(INTENTS_KEY) or {}).get(str(oid))
            if intent is not None and intent.get("fills"):  # added by a run that stopped before the fill
                return self._recopy_or_none(d, f"column(s) {', '.join(sorted(intent['fills']))} were added to its "
                                               "Delta table by a run that stopped before it filled them")
            self._forget(oid)
            return None
        if not entry.attnums:
            return None  # a binding from before attnums were recorded: nothing to prove a rename with
        recorded = {**entry.former, **entry.attnums}
        extra = ExtraColumns.for_table(self.applier.tables, table.qualified_name)
        # a Delta column with no recorded attnum (one the stream added and the catalog never confirmed) could
        # be any of the missing names renamed, unless the catalog proves which (applier.sink.identity)
        for column in set(delta) - set(recorded) - set(names) - set(extra.names if extra is not None else ()):
            now = ids.named_now(oid, column)
            if now is None or now not in d.attnums:
                return None
            recorded[column] = d.attnums[now]
        by_attnum = {recorded[c]: c for c in delta if c in recorded}
        newest = max(recorded.values(), default=0)
        renamed: dict[str, str] = {}
        added: list[str] = []
        for n in missing:
            old = by_attnum.get(d.attnums[n])
            if old is not None and old not in names:
                renamed[old] = n
            elif old is None and d.attnums[n] > newest:
                added.append(n)
            else:
                return None  # a column the mirror has no attnum for: its next Relation decides
        seed = None
        stream = self._stream(oid)
        if stream is None:  # copied by a table sync and unchanged since: the shape it was copied with
            seed = self._seed(d, delta, recorded, set(added))
            if seed is None:
                return None
        elif not self._same_kind(d, stream, recorded, set(added)):
            return None
        fills: dict[str, str] = {}
        if added:
            filled = _filled(conn, oid, added)
            constant = _missing_values(conn, oid, filled)
            if filled - constant.keys():
                return self._recopy_or_none(d, f"gained column(s) {', '.join(sorted(filled - constant.keys()))} "
                                               "whose rows hold values the catalog does not keep (a volatile "
                                               "default, an identity or generated value)")
            fills = constant
        return Evolve(renamed, tuple(added), fills, seed)

    def _retype(self, conn: psycopg.Connection[Any], d: Described,
                entry: Bound) -> dict[str, str] | Recopy | None:
        """The columns whose Delta type is to change (column -> how), when each is a change Delta widens in
        place and the catalog proves that the values of every column that may have changed type were kept; a
        Recopy when a copy is what brings them; empty when nothing is to change in Delta (noted in
        ``TYPES_KEY``); None when it cannot be told here (left to the table's next Relation, as before)."""
        oid, table = d.relation.oid, d.table
        where = self.applier.relation_table(oid, table.namespace, table.name)
        if where is None:
            return None
        path = where[0]
        store = self.applier.stores.reader(path)
        stream = self._stream(oid)
        suspects = _suspects(conn, d, stream, entry)
        if store.uses_spark and suspects is None:
            self._types_in_line(oid, d.fingerprint)  # as far as the catalog tells: not worth Spark's start
            return None
        if not store.exists(path):
            return None
        types = TypeCache.from_json(self.catalog.types.to_json())
        for typ in d.types:
            types.update(typ)
        try:
            spec = table_spec(TableBatch(oid, table.namespace, table.name, RelationCache(types).update(d.relation),
                                         0, 0, ()), self.applier.tables, types)
        except SinkError:
            return None  # the table's rule refuses this shape: the next Relation stops on it with its reason
        from applier.checks.verify import same_delta_type

        columns = {c.name for c in d.relation.columns}
        have = {f["name"]: f for f in store.schema_fields(path)}
        in_delta: dict[str, tuple[Any, Any]] = {}  # Postgres name -> (Delta's type, the type it would have now)
        for f in spec.schema:
            name = spec.postgres_name(f.name)
            if name in columns and f.name in have and not same_delta_type(delta_type(f.type), have[f.name]["type"]):
                in_delta[name] = (have[f.name], f)
        typed, written = suspects or ((), ())
        key = {c.name for c in d.relation.columns if c.is_key}
        if not key or d.relation.replica_identity == "f" or key & set(written):
            written = ()  # only suspected, and no key to match rows by: neither proven nor disproven
        if not in_delta and not typed and not written:
            self._types_in_line(oid, d.fingerprint)
            return {}
        from pyspark.sql.types import StructType

        from applier.sink.store.sparkddl import widenable
        from applier.spark.types import spark_type

        what: dict[str, str] = {}
        for name, (old, new) in in_delta.items():
            old_type, new_type = StructType.fromJson({"type": "struct", "fields": [old]}).fields[0].dataType, \
                spark_type(new.type)
            if not widenable(old_type, new_type):
                return Recopy(f"column {name} changed type from {old_type.simpleString()} to "
                              f"{new_type.simpleString()} (Delta types), which Delta cannot widen in place")
            what[name] = f"widened from {old_type.simpleString()} to {new_type.simpleString()}"
        why = self._values_changed(conn, d, stream, {*what, *typed, *written}, path, spec, types,
                                   changed=bool(what or typed))
        if why is not None:
            return Recopy(why)
        if not what:  # values proven kept, Delta's types are Postgres': the next Relation's proof finds it so
            self._types_in_line(oid, d.fingerprint)
        return what

    def _values_changed(self, conn: psycopg.Connection[Any], d: Described, stream: Relation | None,
                        retyped: set[str], path: str, spec: TableSpec, types: TypeCache, *,
                        changed: bool) -> str | None:
        """Why the values of the ``retyped`` columns may not be the ones the Delta table holds, or None when
        the catalog proves them kept: the sink's proof for a Relation's type change (applier.sink.retypes,
        run as a group's commit runs it, on a version that goes from the stream's last Relation, or the
        described one, to the described one), taken as proof only when it recorded the table's relfilenode
        now (a change it cannot decide is kept in Delta with a warning there: here a copy is exact), when a
        type is known to have ``changed``; else (columns the catalog only suspects) only a difference found is
        a reason to copy: one cannot be proven for a table without a key, which may well have been altered
        otherwise (a column added after a TRUNCATE)."""
        from applier.sink.retypes import TypeRewriteError

        oid, table = d.relation.oid, d.table
        before = stream if stream is not None else d.relation
        # every retyped column shows as one (a type the old shape cannot have: only the names count)
        before = replace(before, columns=tuple(replace(c, type_oid=0, type_modifier=-1) if c.name in retyped
                                               and _same_type(c, d.relation, c.name) else c for c in before.columns))
        versions = RelationCache(types)
        versions.update(before)
        version = versions.update(d.relation)
        try:
            self.applier.check_retype(path, replace(spec, source_name=table.qualified_name), version,
                                       lambda: set())
        except TypeRewriteError as e:
            return str(e).split(". Nothing was written", 1)[0]
        except ValueConversionError as e:
            # a rewritten value the stream's conversion refuses: what the proof cannot read it cannot prove
            return (f"column(s) {', '.join(sorted(retyped))} changed type and the values Postgres rewrote cannot "
                    f"be compared with the Delta table's ({e})")
        ids = self.applier.identities
        assert ids is not None
        entry = ids.bound(oid)
        if changed and (entry is None or entry.relfilenode is None or entry.relfilenode != _relfilenode(conn, oid)):
            return (f"column(s) {', '.join(sorted(retyped))} changed type and the catalog cannot prove that their "
                    "values were kept")
        return None

    def _recopy_or_none(self, d: Described, why: str) -> Recopy | None:
        if self.applier.derived.kinds(d.table.qualified_name):
            self.progress(f"{d.table.qualified_name}: {why}, with no row change since; its history or change feed "
                          "table cannot take a copy, so the Delta table waits for the table's next change")
            return None
        return Recopy(why)

    def _same_kind(self, d: Described, stream: Relation, recorded: dict[str, int], added: set[str]) -> bool:
        """``d`` differs from the stream's Relation ``stream`` only by names, added and dropped columns: each
        column both have (by attnum) has the same type, modifier and key flag; the replica identity and the
        key are the same (an added column is a key only under REPLICA IDENTITY FULL)."""
        if stream.replica_identity != d.relation.replica_identity or stream.oid != d.relation.oid:
            return False
        by_attnum = {d.attnums[c.name]: c for c in d.relation.columns}
        for column in stream.columns:
            attnum = recorded.get(column.name)
            if attnum is None:
                return False  # no attnum recorded for a column the stream has: nothing can be proven
            now = by_attnum.get(attnum)
            if now is not None and (now.type_oid, now.type_modifier, now.flags) != (
                    column.type_oid, column.type_modifier, column.flags):
                return False
        return all(not c.is_key or d.relation.replica_identity == "f" for c in d.relation.columns
                   if c.name in added)

    def _seed(self, d: Described, delta: tuple[str, ...], recorded: dict[str, int],
              added: set[str]) -> Relation | None:
        """For a relation the feeder's catalog lacks (copied by a table sync, no change since): the Relation
        its Delta table was made from, as far as it can be known: the described columns it had (by attnum,
        under the names the Delta table has), each with the type the Delta table holds. None when a Delta
        column's type is not the described one's (a type change this cannot prove) or unreadable here."""
        names = {recorded[c]: c for c in delta if c in recorded}
        columns = tuple(replace(c, name=names[d.attnums[c.name]]) for c in d.relation.columns
                        if d.attnums[c.name] in names and c.name not in added)
        seed = replace(d.relation, columns=columns)
        where = self.applier.relation_table(seed.oid, d.table.namespace, d.table.name)
        if where is None:
            return None
        store = self.applier.stores.reader(where[0])
        if store.uses_spark or not hasattr(store, "schema_fields"):
            return None
        version = RelationCache(self.catalog.types).update(seed)
        spec = table_spec(TableBatch(seed.oid, d.table.namespace, d.table.name, version, 0, 0, ()),
                          self.applier.tables, self.catalog.types)
        have = {f["name"]: f["type"] for f in store.schema_fields(where[0])}
        if any(f.name in have and have[f.name] != delta_type(f.type) for f in spec.schema):
            return None
        return seed

    def _evolve(self, d: Described, plan: Evolve, position: int) -> None:
        """Apply ``plan``: noted first (``INTENTS_KEY``); the Relation through the feeder's catalog (saved at
        once, as a group saves it) with the table's attnums and dropped columns as the catalog gave them (the
        baseline a copy records: every name here is the column the catalog says, so none is a column dropped
        and added again unseen), then the sink's evolution and the fills; then the note is forgotten."""
        oid, table = d.relation.oid, d.table
        applied = self.applier.relation_version(oid, table.namespace, table.name)
        intents = self.state.load(INTENTS_KEY) or {}
        intents[str(oid)] = {"table": table.qualified_name, "columns": [c.name for c in d.relation.columns],
                             "fills": plan.fills, "applied": format_lsn(applied) if applied is not None else None}
        self.state.save(INTENTS_KEY, intents)
        for typ in d.types:
            self.catalog.update_type(typ)
        if plan.seed is not None:
            self.catalog.update(plan.seed)
        version = self.catalog.update(d.relation)  # renames proven by attnum here (applier.sink.identity)
        self.state.save("catalog", self.catalog.to_json())
        ids = self.applier.identities
        assert ids is not None
        ids.record_attnums(oid, d.attnums)
        ids.record_dropped(oid, set(d.dropped))
        self._ensure(oid, table, version, plan.fills)
        what = [f"{old} renamed to {new}" for old, new in plan.renamed.items()]
        what += [f"{c} added" + (f" (its default {plan.fills[c]!r} in the rows that exist)" if c in plan.fills
                                 else "") for c in plan.added]
        what += [f"{c} {how}, values kept" for c, how in plan.retyped.items()]
        self.progress(f"{table.qualified_name}: {'; '.join(what)} in Postgres with no change of its rows since: "
                      f"applied to its Delta table from the catalog (as of {format_lsn(position)}, which the "
                      "mirror has applied up to)")

    def _ensure(self, oid: int, table: PublishedTable, version: SchemaVersion, fills: dict[str, str]) -> None:
        """The Delta table evolved to ``version`` and the ``fills`` written into its rows; then the note of
        ``_evolve`` is forgotten."""
        from applier.values import convert_value

        path = self.applier.path_of(oid, table.namespace, table.name)
        spec = replace(table_spec(TableBatch(oid, table.namespace, table.name, version, 0, 0, ()),
                                  self.applier.tables, self.catalog.types), source_name=table.qualified_name)
        self.applier.ensure(path, spec, version)
        if fills:
            columns = {c.name: c for c in version.relation.columns}
            values = {spec.delta_name(name): convert_value(COL_TEXT, text.encode("utf-8"), columns[name].type_oid,
                                                           columns[name].type_modifier, self.catalog.types,
                                                           self.config.apply.special_values, name)
                      for name, text in fills.items()}
            self.applier.stores.writer(path).fill_columns(path, spec, values)
        self._forget(oid)

    def _forget(self, oid: int) -> None:
        intents = self.state.load(INTENTS_KEY) or {}
        if intents.pop(str(oid), None) is not None:
            self.state.save(INTENTS_KEY, intents)

    def finish(self) -> None:
        """Before anything else of a run: a shape an earlier run began to apply and did not finish (it
        stopped between the catalog's save and the fill) is finished, when the feeder's catalog holds it and
        the table has applied nothing since (its rows are then all rows that read each added column's default
        in Postgres). Any other note stays: the run's first observation looks at that table again, whatever
        the recorded attnums say (``_plan``)."""
        intents: dict[str, dict[str, Any]] = self.state.load(INTENTS_KEY) or {}
        for key, intent in list(intents.items()):
            oid = int(key)
            namespace, _, name = str(intent["table"]).partition(".")
            version = self.catalog.get(oid) if oid in self.catalog else None
            applied = self.applier.relation_version(oid, namespace, name)
            if (version is not None and list(version.column_names) == list(intent["columns"])
                    and (format_lsn(applied) if applied is not None else None) == intent["applied"]):
                fills: dict[str, str] = dict(intent.get("fills") or {})
                self._ensure(oid, PublishedTable(namespace, name, None, None, oid), version, fills)
                self.progress(f"{intent['table']}: the schema change an earlier run began to apply from the catalog "
                              "(it stopped part-way) is finished")


def _filled(conn: psycopg.Connection[Any], oid: int, names: list[str]) -> set[str]:
    """Of the columns ``names`` of relation ``oid``: those whose rows that existed are not NULL in Postgres
    (a default, a missing value, an identity or a generated column)."""
    rows = conn.execute("SELECT attname FROM pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped "
                        "AND attname = ANY(%s) AND (atthasdef OR atthasmissing OR attidentity <> '' OR "
                        "attgenerated <> '')", (oid, names)).fetchall()
    return {str(r[0]) for r in rows}


def _missing_values(conn: psycopg.Connection[Any], oid: int, names: set[str]) -> dict[str, str]:
    """applier.drivers.columnfill's ``missing_values`` (imported here: it imports the sink's engine)."""
    if not names:
        return {}
    from applier.drivers.columnfill import missing_values

    return missing_values(conn, oid, names)


def _retyped_since(stream: Relation | None, now: Relation) -> tuple[str, ...]:
    """The columns of ``now`` whose type or modifier is not the one the stream's last Relation gave them
    (by name: a renamed column is the rename's to prove)."""
    if stream is None:
        return ()
    before = {c.name: c for c in stream.columns}
    return tuple(c.name for c in now.columns if c.name in before
                 and (before[c.name].type_oid, before[c.name].type_modifier) != (c.type_oid, c.type_modifier))


def _suspects(conn: psycopg.Connection[Any], d: Described, stream: Relation | None,
              entry: Bound) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """The columns of ``d`` whose values an ``ALTER ... TYPE ... USING`` may have changed, for the sink's proof
    to compare with the Delta table's (applier.sink.retypes): those whose type is not the one the stream's
    last Relation gave them, and those only suspected; None when the table's file is the one recorded at its
    copy or at the last proof (``entry.relfilenode``): such an ALTER always rewrites the table, so nothing
    rewrote a value since (a change of Delta's type is still to be made, and looked for).

    Suspected: the columns the mirror has recorded whose catalog row the transaction that last wrote the
    table's ``pg_class`` row wrote too. An ``ALTER COLUMN ... TYPE`` does, also one back to the type the
    column had, ``USING`` something else (which no Relation would show); but so does an ``ADD COLUMN``
    after a ``TRUNCATE`` or a ``VACUUM FULL``, which is why only a difference the proof finds in such a
    column is a reason to copy. With no file recorded (a table the stream created: the transaction that
    created it wrote its ``pg_class`` row and every ``pg_attribute`` row), only the first kind."""
    names = [c.name for c in d.relation.columns]
    streamed = _retyped_since(stream, d.relation)
    if entry.relfilenode is None:
        return (streamed, ()) if streamed else None
    witness = rewrite_witness(conn, d.relation.oid, names)
    if witness is not None and witness.relfilenode == entry.relfilenode:
        return None
    written = () if witness is None else tuple(
        n for n in names if n not in streamed and witness.column_xmins.get(n) == witness.class_xmin
        and n in entry.attnums and entry.attnums[n] == d.attnums.get(n))
    return streamed, written


def _same_type(column: RelationColumn, now: Relation, name: str) -> bool:
    """``column`` has the type and modifier of ``now``'s column ``name``."""
    other = next((c for c in now.columns if c.name == name), None)
    return other is not None and (other.type_oid, other.type_modifier) == (column.type_oid, column.type_modifier)


def _relfilenode(conn: psycopg.Connection[Any], oid: int) -> int | None:
    """Relation ``oid``'s file now (new at every rewrite of its rows), as the sink's proof reads it."""
    witness = rewrite_witness(conn, oid, ())
    return witness.relfilenode if witness is not None else None
