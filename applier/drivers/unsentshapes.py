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
catalog gives: the table is copied again at a new position, as ``applier resync`` copies it. Anything else
(a changed type, key or replica identity, a column the mirror has no attnum for, a table with history or
change feed tables that a copy would need) is left to the table's next Relation, as before.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import psycopg

from applier.catalog.batches import TableBatch
from applier.errors import SourceError
from applier.lsn import format_lsn
from applier.protocol.messages import COL_TEXT, Relation, Type
from applier.sink.extras import ExtraColumns
from applier.sink.fold import table_spec
from applier.sink.parking import ParkedTables
from applier.sources import sql_slot
from applier.sources.catalog_lookup import dropped_attnums, relations_now, shape_fingerprints, written_position
from applier.sources.publication import PublishedTable, published_selection
from applier.sources.slots import slot_info
from applier.sources.snapshot import describe_relation

if TYPE_CHECKING:
    from collections.abc import Callable

    from applier.catalog import RelationCache, SchemaVersion
    from applier.config import MirrorConfig
    from applier.infra.progress import Progress
    from applier.sink.engine import DeltaApplier
    from applier.state import StateDir

log = logging.getLogger(__name__)

#: state key: per relation OID, a shape this module began to apply and has not finished (see ``_evolve``)
INTENTS_KEY = "unsent_shapes"
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
    that exist, or the constant of ``fills``: column -> missing value's text)."""

    renamed: dict[str, str]
    added: tuple[str, ...]
    fills: dict[str, str]
    seed: Relation | None  # the shape the Delta table has, for a relation the feeder's catalog lacks


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
            changed = []
            for t in tables:
                assert t.oid is not None
                entry = ids.bound(t.oid)
                if t.oid in now and entry is not None and not entry.retired and (
                        now[t.oid][1] != entry.attnums or str(t.oid) in intents):
                    changed.append(t)
            if not changed:
                return
            fingerprints = shape_fingerprints(conn, [t.oid for t in changed if t.oid is not None])
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

    def _stream(self, oid: int) -> Relation | None:
        """The feeder catalog's current Relation of ``oid`` (the stream's last, or the last applied here)."""
        return self.catalog.get(oid).relation if oid in self.catalog else None

    # --- step 2 -------------------------------------------------------------------------------------

    def settle(self, conn: psycopg.Connection[Any], *, waiting: Callable[[int, str], bool]) \
            -> list[tuple[Described, str]]:
        """Step 2, when the slot has been confirmed past the pending observation's position (else nothing
        happens yet). Evolves the tables it can; returns the ones to copy again, with why. ``waiting``
        (relation OID, name): the table has a copy or a column fill of the stream's own under way."""
        seen = self.pending
        if seen is None or not self.enabled:
            return []
        info = slot_info(conn, self.config.source.slot)
        if info is None or info.confirmed_flush_lsn is None or info.confirmed_flush_lsn < seen.position:
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
        by_attnum = {recorded[c]: c for c in delta if c in recorded}
        newest = max(recorded.values(), default=0)
        extra = ExtraColumns.for_table(self.applier.tables, table.qualified_name)
        # a Delta column with no recorded attnum (one the stream added and the catalog never confirmed) could
        # be any of the missing names renamed
        unknown = set(delta) - set(recorded) - set(names) - set(extra.names if extra is not None else ())
        if unknown:
            return None
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
        from applier.catalog import RelationCache
        from applier.sink.store.deltatypes import delta_type

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
