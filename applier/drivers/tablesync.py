"""Tables that join the publication after the mirror's snapshot: copied at a known position, then
followed from the main stream (what PostgreSQL's tablesync.c does for ALTER SUBSCRIPTION ... REFRESH).

Why this is exact: a temporary slot created with an exported snapshot gives a position P and a
snapshot that sees exactly the transactions that committed before P. The table is copied under that
snapshot and its Delta commit records P as the table's applied version, the same mark every
streamed commit carries. The main stream then goes on as before: its transactions on that table
that ended at or before P are already in the copy, and the apply stage leaves them out because the
table's applied version is P; those after P are applied. The publication change itself committed
before P (the mirror saw its effect before creating the slot), so every transaction after P is
decoded with the table published.

Creating that slot waits for every transaction open on the server, prepared ones too; the copy waits
alone, as PostgreSQL's tablesync worker does (``PendingCopy``): the other tables go on, the waiting
table's changes are held and applied on its copy.

Known tables (copied by the snapshot or by a sync, with the position they were copied at) are kept
in the state file ``copied_tables``. A table is synced when it is published but not known: checked when
the mirror starts following the slot, and before each group is applied (the first change of a newly
published table arrives with its Relation message).
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, MutableSequence, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg

from applier.catalog import RelationCache
from applier.catalog.batches import GroupedTransactions, TableBatch
from applier.config import MirrorConfig
from applier.drivers.columnfill import ColumnFills, Fill, first_carrying, missing_values
from applier.drivers.unsentshapes import UnsentShapes
from applier.errors import SinkError
from applier.infra.progress import Progress
from applier.lsn import format_lsn
from applier.sink.engine import DeltaApplier
from applier.sink.fold import merge_keys
from applier.sink.idempotence import is_delta_table
from applier.sink.spec import PROP_PUBLICATION
from applier.sources.publication import PublishedTable, check_rule_columns, published_selection, published_shapes
from applier.sources.slots import open_phrase, prepared_phrase, slot_creation_blockers, sync_slot_prefix
from applier.sources.syncslot import SyncSlot
from applier.sources.walsender import CreatedSlot
from applier.spark.session import SparkLike, SparkProvider
from applier.state import StateDir

log = logging.getLogger(__name__)

STATE_KEY = "copied_tables"
#: per copied table, its publication's [row filter] when it was copied (see ``_reshaped``)
SHAPES_KEY = "published_shapes"

#: seconds a table sync waits in line for its slot before the mirror goes on without it (holding the
#: table's changes): with no transaction open on the server, creating a slot takes well under this
QUICK_WAIT_SECONDS = 5.0
#: how often the log repeats what a waiting table sync waits for
REPORT_EVERY_SECONDS = 30.0

_slot_numbers = itertools.count(1)


@dataclass
class PendingCopy:
    """Tables whose copy waits for its slot. The mirror goes on with the other tables; the changes of
    these are held here, in commit order, and applied on top of the copy once it exists (those that end
    at or before the copy's position are in it and left out by the applied version, as always).

    Why this cannot lose a change: the tables are taken off the state's list of copied tables before
    the first of their changes is held, so a run that stops (or crashes) with changes held, which the
    slot has been told are applied, copies those tables again at a new position, which holds every
    such change; they go back on the list only once their copy and their held changes are committed."""

    slot: SyncSlot
    tables: dict[str, PublishedTable] = field(default_factory=dict)  # qualified name -> table
    reasons: dict[str, str] = field(default_factory=dict)
    #: tables whose Delta table is replaced (emptied with the columns published now) right before the copy
    replace: set[str] = field(default_factory=set)
    held: list[tuple[int, list[TableBatch]]] = field(default_factory=list)
    last_report: float = field(default_factory=time.monotonic)


class TableSync:
    def __init__(self, spark: SparkLike, config: MirrorConfig, dsn: str, applier: DeltaApplier,
                 catalog: RelationCache, state: StateDir, progress: Progress, *,
                 on_copy_rows: Callable[[str, int, int], None] | None = None,
                 on_waits: Callable[[list[str], int, int], None] | None = None) -> None:
        self.spark = SparkProvider.of(spark)
        self.config = config
        self.dsn = dsn
        self.applier = applier
        self.catalog = catalog
        self.state = state
        self.progress = progress
        self._known: dict[str, str] | None = None  # qualified name -> LSN it was copied at
        self._columns: dict[int, set[str]] = {}  # relation OID -> columns its Delta table has
        self.synced: dict[str, int] = {}  # this run: qualified name -> rows copied
        self._pending: PendingCopy | None = None  # tables whose copy waits for its slot (see PendingCopy)
        self._asking: psycopg.Connection[Any] | None = None  # must_sync's (_asking_connection)
        self.fills = ColumnFills(config, applier, catalog.types, state, progress)
        #: columns renamed or added with no row change since, taken from the catalog (applier.drivers.unsentshapes)
        self.shapes = UnsentShapes(config, applier, catalog, state, progress)
        self._shapes_started = False  # the run's first check: fills a crash left, then the first observation
        #: told (table, rows copied, estimated rows) while a copy runs: the metrics' copy gauges, when served
        self.on_copy_rows = on_copy_rows
        #: told (tables, prepared, open transactions) whenever what a waiting copy waits for is read, and
        #: ((), 0, 0) once none waits: the metrics' table-sync gauges, when served
        self.on_waits = on_waits

    # --- what is known --------------------------------------------------------------------------

    def known(self, published: list[PublishedTable]) -> dict[str, str]:
        """The tables already copied. A state written before table sync existed has no list: then
        every published table with a Delta table was copied by the snapshot."""
        if self._known is None:
            saved = self.state.load(STATE_KEY)
            if saved is None:
                saved = {t.qualified_name: "" for t in published
                         if is_delta_table(self.applier.path_for(t.namespace, t.name))}
                self.state.save(STATE_KEY, saved)
            self._known = dict(saved)
        return self._known

    def follows(self, name: str) -> bool:
        """Whether the mirror follows table ``name`` now (copied, still published); before the run has asked
        the publication, every table it has a Delta table of."""
        return self._known is None or name in self._known

    def record_snapshot(self, tables: list[str], lsn: int) -> None:
        """The initial copy took ``tables`` at ``lsn`` (the slot's consistent point)."""
        self._known = {name: format_lsn(lsn) for name in tables}
        self.state.save(STATE_KEY, self._known)

    # --- when to sync ---------------------------------------------------------------------------

    def check_publication(self) -> None:
        """Copy every published (and selected) table the mirror does not know yet. Asked before every
        group, on ``must_sync``'s kept connection: one made each time was a tenth of an idle follower's
        time to apply a one-row transaction (bench/RESULTS.md, thirty-ninth session)."""
        if not self._shapes_started:  # before anything is applied: the state as the last run left it
            self.shapes.finish()
        try:
            published, reshaped = self._ask_publication(self._asking_connection())
        except psycopg.OperationalError:
            self._drop_asking()  # closed by the server since (a restart, idle_session_timeout): once more, anew
            published, reshaped = self._ask_publication(self._asking_connection())
        known = self.known(published)
        for name, (_table, what) in reshaped.items():
            self.progress(f"table sync: {name}: {'; '.join(what)}; copying the table again so that it holds what "
                          "is published now")
        if reshaped:
            self.sync([t for t, _what in reshaped.values()], reason="is published with other rows or columns now",
                      wait=False, replace={name for name, (_t, what) in reshaped.items()
                                           if any("column list" in w for w in what)})
        missing = [t for t in published if t.qualified_name not in known and not self.waiting(t.qualified_name)]
        if missing:
            self.sync(missing, wait=False)
        underived = [t for t in published if t.qualified_name in known
                     and self.applier.derived.missing(t.namespace, t.name)]
        if underived:  # history or changes turned on for a table copied before: they start at a new copy
            self.sync(underived, reason="has history or changes on but no such table yet", wait=False)
        if not self._shapes_started:  # once a run: before its drain's target is read (see unsentshapes)
            self._observe_shapes(self._asking_connection(), known)
            self._shapes_started = True

    def _observe_shapes(self, conn: psycopg.Connection[Any], known: dict[str, str]) -> None:
        """``UnsentShapes.observe``; a refusal by the server other than a lost connection (a catalog function
        this role may not call, say) leaves it undone with a warning: nothing is applied without it."""
        try:
            self.shapes.observe(conn, known)
        except psycopg.OperationalError:
            raise
        except psycopg.Error as e:
            log.warning("could not read the catalog for columns renamed or added with no row change since (%s); "
                        "they reach Delta with the table's next change", str(e).splitlines()[0] if str(e) else e)

    def settle_shapes(self, *, observe: bool, confirmed: int | None = None) -> bool:
        """Columns renamed or added in Postgres with no row change since (applier.drivers.unsentshapes): once
        the slot is confirmed past what the last observation saw, they are applied to the Delta tables, or
        the tables whose rows no catalog gives are copied again (True: such a copy was begun); ``observe``:
        then ask the catalog again when it is due (an idle follower)."""
        if not self.shapes.enabled:
            return False
        conn = self._asking_connection()
        recopy = self.shapes.settle(conn, waiting=lambda oid, name: self.waiting(name) or self.fills.pending(oid, name),
                                    confirmed=confirmed)
        if recopy:
            known = self.known([])
            for described, _why in recopy:  # first: a stop or crash from here leaves them to the next table sync
                known.pop(described.table.qualified_name, None)
            self.state.save(STATE_KEY, known)
            for described, why in recopy:  # then emptied with the columns Postgres has, as applier resync does
                oid, name = described.relation.oid, described.table.qualified_name
                self.progress(f"table sync: {name}: {why}, with no change of its rows since; copying the table again")
                for typ in described.types:
                    self.catalog.update_type(typ)
                self.applier.replace_table(RelationCache(self.catalog.types).update(described.relation))
                self._columns.pop(oid, None)
                self.fills.forget(oid, name)
            self.sync([d.table for d, _why in recopy], reason="changed in Postgres in a way only a copy brings",
                      wait=False)
            return True
        if observe and self.shapes.due():
            self._observe_shapes(conn, self.known(self._published(conn)))
        return False

    def _added(self, oid: int, key: tuple[str, str], columns: Sequence[str], *, fresh: set[int],
               remember: bool = True) -> set[str]:
        """The stream's ``columns`` of relation ``oid`` that its Delta table lacks (None of it: no table yet,
        created with them), less the excluded ones and those it has under an older name (a rename noted and
        not applied yet). The Delta table's columns are cached between groups, but read again (once per
        call: ``fresh``) before a column is taken for new, since the sink may have renamed one since.
        ``remember``: count the added columns as the table's from now on (what the caller acts on)."""
        excluded = self.applier.targets.excluded_columns(*key)
        ids = self.applier.identities
        while True:
            have = self._columns.get(oid)
            if have is None:
                current = self.applier.relation_columns(oid, *key)
                if current is None:
                    return set()
                have = self._columns[oid] = set(current)
                fresh.add(oid)
            added = set(columns) - have - excluded - (ids.renamed_to(oid, have) if ids is not None else set())
            if not added or oid in fresh:
                if remember:
                    have.update(added)
                return added
            del self._columns[oid]  # cached before a later evolution? read it again

    def _reshaped(self, conn: psycopg.Connection, published: list[PublishedTable], known: dict[str, str], *,
                  save: bool = True) -> dict[str, tuple[PublishedTable, list[str]]]:
        """Copied tables the publication now sends other rows or columns of than when they were copied, with
        what changed (``shape_changes``): another row filter (``ALTER PUBLICATION ... SET TABLE t WHERE
        (...)``), another column list, or, for a partitioned table published through its root, partitions
        attached or detached. The stream sends their changes under the new shape from then on, but the rows
        already in Delta were chosen by the old one: a narrowed filter leaves rows it now excludes
        (PostgreSQL's own subscriber keeps them too), a column newly listed has values no change brought, an
        attached partition's rows were never sent as changes. They are copied again, at a new position, so
        the Delta table is what the publication publishes now. A state from before a part was recorded takes
        that part as it is now. ``save``: record the shapes seen (False: only ask)."""
        stored: dict[str, list[Any]] = self.state.load(SHAPES_KEY) or {}
        shapes = dict(stored)
        copied = [t for t in published if t.qualified_name in known]
        found = published_shapes(conn, self.config.source.publication, [t.oid for t in copied if t.oid is not None])
        changed: dict[str, tuple[PublishedTable, list[str]]] = {}
        for t in copied:
            got = found.get(t.oid) if t.oid is not None else None
            shape = [t.row_filter, *((None, None, []) if got is None else
                                     ([list(c) for c in got.columns] if got.columns is not None else None,
                                      [list(p) for p in got.leaves] if got.leaves is not None else None,
                                      [list(e) for e in got.enum_labels]))]
            was = shapes.get(t.qualified_name)
            what = shape_changes(was, shape, lambda t=t: self.applier.relation_columns(  # type: ignore[misc]
                t.oid, t.namespace, t.name) or ()) if was is not None else []
            if what:
                changed[t.qualified_name] = (t, what)
            shapes[t.qualified_name] = shape
        names = {t.qualified_name for t in published}
        for name in [n for n in shapes if n not in known and n not in names]:
            del shapes[name]
        if save and shapes != stored:
            self.state.save(SHAPES_KEY, shapes)
        return changed

    def _mark_unpublished(self, name: str) -> None:
        """A table the mirror followed is no longer published (taken out of the publication, or dropped): its
        Delta table stays as it was, marked ``applier.publication`` = "not published since ..." (applier
        status shows it), and a warning says it is no longer followed."""
        path = self.applier.path_for(*name.split(".", 1))  # (the path its relation is bound to, if bound)
        if not is_delta_table(path):
            return
        since = datetime.now(UTC).isoformat(timespec="seconds")
        log.warning("%s is no longer in publication %s (removed from it, or dropped): its Delta table at %s is no "
                    "longer followed and keeps its rows as of now; it is marked %s = 'not published since %s'",
                    name, self.config.source.publication, path, PROP_PUBLICATION, since)
        self.applier.stores.writer(path).set_properties(path, {PROP_PUBLICATION: f"not published since {since}"})

    def _follow_identities(self, published: list[PublishedTable], known: dict[str, str]) -> None:
        """Tables are source relations (OIDs), not names (applier.sink.identity): a copied table renamed
        since stays copied under its new name (its Delta table moves now); a name taken by a new
        relation is no longer known (the new table is copied), and the relation that had it is followed
        to its new name or, dropped, its Delta table retired."""
        ids = self.applier.identities
        if ids is None:
            return
        before = dict(known)
        for t in published:  # first: a rename whose move a crash interrupted, finished since by the sink
            entry = ids.bound(t.oid) if t.oid is not None else None
            if (entry is not None and not entry.retired and entry.name == t.qualified_name
                    and t.qualified_name not in known and entry.was is not None and entry.was in known):
                known[t.qualified_name] = known.pop(entry.was)
                self.progress(f"table sync: {entry.was} is now {t.qualified_name} (relation OID {t.oid}): followed")
        for t in published:
            if t.oid is None:
                continue
            entry = ids.bound(t.oid)
            if entry is not None and not entry.retired and entry.name != t.qualified_name:
                was = entry.name
                ids.path_of(t.oid, t.namespace, t.name)
                if was in known:
                    known[t.qualified_name] = known.pop(was)
                self.progress(f"table sync: {was} is now {t.qualified_name} (relation OID {t.oid}): followed")
            elif entry is None and t.qualified_name in known:
                holder = ids.holder_of(self.applier.targets.path_for(t.namespace, t.name))
                if holder is not None and holder.oid != t.oid:
                    copied_at = known.pop(t.qualified_name)
                    ids.path_of(t.oid, t.namespace, t.name)
                    moved = ids.bound(holder.oid)
                    if moved is not None and not moved.retired:
                        known[moved.name] = copied_at
                    self.progress(f"table sync: {t.qualified_name} is a new table (relation OID {t.oid}); the "
                                  "table that had the name keeps its own Delta table")
                else:
                    ids.path_of(t.oid, t.namespace, t.name)  # a table mirrored before OIDs were recorded
        if known != before:
            self._columns.clear()
            self.state.save(STATE_KEY, known)

    def before_apply(self, transactions: GroupedTransactions) -> None:
        """Called with each group before it is applied (one catalog query): a table the group
        touches that the mirror does not know joined the publication while the mirror ran, and is
        copied first; a table no longer published is forgotten; a table that gained a column whose
        existing rows are not NULL in Postgres is copied again (see ``_recopy_for_added_columns``).
        A copy whose slot is still waiting for open transactions holds up only its own tables: their
        changes are taken out of the group and held (``PendingCopy``)."""
        self.finish_pending(0.0)
        self.check_publication()
        self._recopy_for_added_columns(transactions)
        self._hold(transactions)
        self.fills.apply(transactions)

    def waiting(self, qualified: str) -> bool:
        """The table's copy waits for its slot (its changes are held)."""
        return self._pending is not None and qualified in self._pending.tables

    def must_sync(self, touched: list[tuple[str, str, int, tuple[str, ...]]]) -> str | None:
        """Why a group touching these tables ((schema, table, relation OID, its columns in the stream))
        cannot commit without what ``before_apply`` does, or None: a published table the mirror has not
        copied, or a column a Delta table lacks whose existing rows are not NULL in Postgres (see
        ``_recopy_for_added_columns``). Nothing is copied here: the catch-up on executors
        (applier.drivers.backlog) hands such a group to the driver path, which does it."""
        waiting = sorted(f"{ns}.{name}" for ns, name, _oid, _columns in touched if self.waiting(f"{ns}.{name}"))
        if waiting:
            return f"the copy of {', '.join(waiting)} waits for its slot (their changes are held until it exists)"
        try:
            return self._must_sync(self._asking_connection(), touched)
        except psycopg.OperationalError:
            self._drop_asking()  # closed by the server since (a restart, idle_session_timeout): once more, anew
            return self._must_sync(self._asking_connection(), touched)

    def _published(self, conn: psycopg.Connection[Any]) -> list[PublishedTable]:
        return published_selection(conn, self.config.source.publication, self.config.tables)

    def _ask_publication(self, conn: psycopg.Connection[Any]) \
            -> tuple[list[PublishedTable], dict[str, tuple[PublishedTable, list[str]]]]:
        """What is published now, and the copied tables it sends other rows or columns of (``_reshaped``);
        tables no longer published are forgotten first."""
        published = self._published(conn)
        known = self.known(published)
        self._follow_identities(published, known)
        names = {t.qualified_name for t in published}
        gone = [name for name in known if name not in names]
        if gone:  # no longer published: if it comes back, its rows must be copied again
            for name in gone:
                del known[name]
            self.state.save(STATE_KEY, known)
            for name in gone:
                self._mark_unpublished(name)
        if not self._shapes_started:  # once a run: tables published only between two runs
            self._mark_never_copied({t.oid for t in published if t.oid is not None}, known)
        return published, self._reshaped(conn, published, known)

    def _mark_never_copied(self, published: set[int], known: dict[str, str]) -> None:
        """Relations the stream wrote Delta tables for that are neither published now nor known to table sync:
        published only between two runs (a table created in a ``TABLES IN SCHEMA`` schema and moved out, or
        added to the publication and taken out again). Nobody copied them, so their Delta tables hold what the
        stream sent meanwhile, not the table: each is marked not published, as a table taken out is, so that
        ``applier status`` and readers see that it is not followed (issue 77: it looked followed)."""
        ids = self.applier.identities
        if ids is None:
            return
        for bound in ids.live():
            if bound.oid in published or bound.name in known or not is_delta_table(bound.path):
                continue
            if (self.applier.stores.reader(bound.path).configuration(bound.path) or {}).get(
                    PROP_PUBLICATION, "published") == "published":
                self._mark_unpublished(bound.name)

    def _asking_connection(self) -> psycopg.Connection[Any]:
        """``must_sync``'s connection, kept between groups: it is asked before every group a round
        commits, and a connection made each time cost 20-50 ms of the round (a backend started, beside
        the load the mirror follows: bench/RESULTS.md, thirty-fourth session)."""
        if self._asking is None or self._asking.closed:
            self._asking = psycopg.connect(self.dsn, autocommit=True, application_name="applier tablesync")
        return self._asking

    def _drop_asking(self) -> None:
        asking, self._asking = self._asking, None
        if asking is not None:
            asking.close()

    def _must_sync(self, conn: psycopg.Connection[Any], touched: list[tuple[str, str, int, tuple[str, ...]]]) \
            -> str | None:
        published = self._published(conn)
        known = self.known(published)
        missing = [t.qualified_name for t in published
                   if t.qualified_name not in known and not self.waiting(t.qualified_name)]
        if missing:
            return f"tables joined the publication: {', '.join(sorted(missing))}"
        reshaped = self._reshaped(conn, published, known, save=False)
        if reshaped:
            return f"the publication sends other rows or columns of {', '.join(sorted(reshaped))} now"
        for namespace, name, oid, columns in touched:
            key = (namespace, name)
            if self.fills.pending(oid, f"{namespace}.{name}"):
                return f"{namespace}.{name} has columns to fill with their constant default"
            added = self._added(oid, key, columns, fresh=set(), remember=False)
            if not added:
                continue
            filled, gone = _filled_columns(conn, oid, added)
            if filled:
                return f"{namespace}.{name} gained columns {sorted(filled)} with values the stream does not send"
            if gone:  # a key-less table's old images carry it: the driver path decides (copies it again)
                return f"{namespace}.{name} gained columns {sorted(gone)} that were dropped again since"
            self._columns[oid].update(added)
        return None

    def _no_derived(self, key: tuple[str, str], columns: set[str]) -> None:
        """SinkError when the table, about to be copied again for ``columns``, has history or change feed
        tables, which a copy would empty."""
        if self.applier.derived.kinds(f"{key[0]}.{key[1]}"):
            raise SinkError(
                "the table gained a column whose existing rows are not NULL in Postgres (a default, "
                "identity or generated value), which the stream does not send; the mirror would copy "
                "the table again, but its history or change feed table cannot take a copy without "
                "losing what it holds. Delete those derived tables (the mirror then copies the table "
                "and starts them anew) or turn history/changes off for it",
                table=f"{key[0]}.{key[1]}", columns=", ".join(sorted(columns)))

    def _renamed_since(self, oid: int, gone: set[str]) -> tuple[dict[str, str], set[str]]:
        """Of the columns ``gone`` (added, then no longer in the catalog), those renamed since ({old: name
        now}, applier.sink.identity proves it by attnum), and the rest."""
        ids = self.applier.identities
        renamed = {g: n for g in sorted(gone) if ids is not None and (n := ids.named_now(oid, g)) is not None}
        return renamed, gone - renamed.keys()

    def _recopy_for_added_columns(self, transactions: GroupedTransactions) -> None:
        """``ALTER TABLE ... ADD COLUMN`` with a default (or identity, or generated) sends no row
        changes: the next Relation just has the column, and the rows that existed show the default
        (``attmissingval``) or, for a volatile default, values the table rewrite computed and the
        stream never shows. Applying the rest of the stream would leave NULL there. So a table whose
        changes bring a column its Delta table lacks is checked in the current catalog. A constant
        default (the catalog holds it as the missing value) is filled in Delta without a copy
        (``applier.drivers.columnfill``: no slot, so no wait for open transactions). Otherwise the
        table is copied again at a new position, exactly like a table that joined the publication;
        the group's changes to it up to that position are in the copy and left out of the apply.
        Like PostgreSQL's table sync, creating the copy's slot waits for transactions open on the
        server, prepared ones too (the log names them). A column dropped again before the mirror
        asks is only reported (Postgres no longer has it to compare with), unless the group's changes
        that carry it match rows on every column (REPLICA IDENTITY FULL without a key): their old
        images hold what the rows that existed had in it (a rewrite's or a default's values), which
        the Delta rows (NULL there) never match, so that table is copied again as well."""
        new: dict[int, tuple[tuple[str, str], set[str]]] = {}  # relation OID -> (name, columns added)
        fresh: set[int] = set()
        for _end, batches in transactions:
            for batch in batches:
                key, oid = (batch.namespace, batch.name), batch.relation_oid
                if self.waiting(batch.qualified_name):
                    continue  # copied as it is once its slot exists
                added = self._added(oid, key, batch.schema.column_names, fresh=fresh)
                if added:
                    new.setdefault(oid, (key, set()))[1].update(added)
        if not new:
            return
        recopy: list[int] = []
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            for oid, (key, added) in new.items():
                filled, gone = _filled_columns(conn, oid, added)
                renamed, gone = self._renamed_since(oid, gone)
                if renamed:  # not gone: written under one name, renamed since (proven by attnum)
                    defaulted = _filled_columns(conn, oid, set(renamed.values()))[0]
                    if defaulted:  # rows before it take its default under another name: no fill can say where
                        self._no_derived(key, defaulted)
                        self.progress(f"table sync: {key[0]}.{key[1]} gained column(s) "
                                      f"{', '.join(sorted(defaulted))} with values the stream does not send, "
                                      "renamed since it wrote them; copying the table again")
                        self.fills.forget(oid, f"{key[0]}.{key[1]}")
                        recopy.append(oid)
                        continue
                # dropped again since: in a key-less table the old images still carry it (see above); changes
                # the table has applied (a copy made since holds them) carry nothing to match any more
                done = self.applier.relation_version(oid, *key) if gone else None
                carriers = [b for end, batches in transactions if done is None or end > done for b in batches
                            if b.relation_oid == oid and not gone.isdisjoint(b.schema.column_names)] if gone else []
                unknown = gone if any(not merge_keys(b, self.applier.tables) for b in carriers) else set()
                if carriers and not unknown:  # Postgres no longer has it, the Delta table keeps it (NULL)
                    log.warning("%s.%s: column(s) %s were added and dropped again before the mirror saw them; "
                                "the rows that existed then keep NULL in them in Delta", key[0], key[1],
                                ", ".join(sorted(gone)))
                if filled or unknown:
                    self._no_derived(key, filled | unknown)
                constant = missing_values(conn, oid, filled) if filled and not unknown else {}
                if filled and not unknown and not filled - constant.keys():  # all constant defaults: filled, no copy
                    fills = []
                    for column, text in sorted(constant.items()):
                        before = first_carrying(transactions, oid, column)
                        if before is None:  # cannot happen: the column came from this group's batches
                            raise SinkError("internal: an added column is in none of the group's changes",
                                            table=f"{key[0]}.{key[1]}", column=column)
                        fills.append(Fill(column, text, before))
                    self.fills.record(oid, fills)
                elif unknown:
                    self.progress(f"table sync: {key[0]}.{key[1]} gained column(s) {', '.join(sorted(unknown))} "
                                  "that were dropped again since, while the old row images of its changes (REPLICA "
                                  "IDENTITY FULL) carry them with values the stream never sent for the rows that "
                                  "existed; copying the table again")
                    self.fills.forget(oid, f"{key[0]}.{key[1]}")
                    recopy.append(oid)
                elif filled:
                    self.progress(f"table sync: {key[0]}.{key[1]} gained column(s) {', '.join(sorted(filled))} "
                                  "whose existing rows are not NULL in Postgres (a volatile default, identity or "
                                  "generated value: the table was rewritten); copying the table again")
                    self.fills.forget(oid, f"{key[0]}.{key[1]}")
                    recopy.append(oid)
            published = published_selection(conn, self.config.source.publication, self.config.tables)
        tables = [t for t in published if t.oid in recopy]
        if tables:
            self.sync(tables, reason="gained a column with values the stream does not send", wait=False)

    # --- the copy -------------------------------------------------------------------------------

    def _report_waits(self, tables: list[str]) -> None:
        """Creating a slot waits until every transaction that holds a transaction id on the server
        ends, prepared ones too, and those may wait for a user: without this line the mirror would
        look hung. Names the prepared transactions (``pg_prepared_xacts``) and the open ones
        (``pg_stat_activity``)."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            gids, running = slot_creation_blockers(conn)
        if self.on_waits is not None:
            self.on_waits(tables if gids or running else [], len(gids), len(running))
        names = ", ".join(tables)
        if gids:
            self.progress(f"table sync: {names}: creating the copy's slot waits for {prepared_phrase(gids)}; "
                          "COMMIT PREPARED or ROLLBACK PREPARED them to go on")
        if running:
            self.progress(f"table sync: {names}: creating the copy's slot waits for {open_phrase(running)} to end")

    def sync(self, tables: list[PublishedTable], *, reason: str = "joined the publication", wait: bool = True,
             replace: set[str] | frozenset[str] = frozenset()) -> None:
        """Copy ``tables`` at a new position, then follow them from the stream (see the module docstring).
        With ``wait`` (``applier resync``) this returns once they are copied. Without it (the mirror's
        apply loop) it waits for the copy's slot only ``QUICK_WAIT_SECONDS``: a slot still waiting then
        (for a prepared or long transaction) is left to its thread, and the mirror goes on with the other
        tables while the changes of these are held (``PendingCopy``), as PostgreSQL's tablesync worker
        waits alone while the apply worker goes on. ``replace``: tables whose Delta table is emptied with
        the columns published now right before their copy (a column list changed: columns no longer
        published leave the Delta table, as they left the publication)."""
        self._begin(tables, reason, replace)
        self.finish_pending(None if wait else QUICK_WAIT_SECONDS)

    def _begin(self, tables: list[PublishedTable], reason: str, replace: set[str] | frozenset[str]) -> None:
        check_rule_columns(self._asking_connection(), tables, self.config.tables)  # before its slot: exit 2
        known = self.known([])
        left = [t.qualified_name for t in tables if t.qualified_name in known]
        for name in left:  # first: from here on a stop or a crash leaves them to the next run's table sync
            del known[name]
        if left:
            self.state.save(STATE_KEY, known)
        pending = self._pending
        if pending is None:
            self._report_waits([t.qualified_name for t in tables])
            slot = f"{sync_slot_prefix(self.config.source.slot)}{os.getpid()}_{next(_slot_numbers)}"[:63]
            pending = self._pending = PendingCopy(SyncSlot(self.dsn, slot))
        for table in tables:
            pending.tables[table.qualified_name] = table
            pending.reasons[table.qualified_name] = reason
            if table.qualified_name in replace:
                pending.replace.add(table.qualified_name)
            self._columns.pop(table.oid or 0, None)  # what its Delta table has changes with the copy

    def finish_pending(self, timeout: float | None) -> bool:
        """Copy the waiting tables once their slot exists (waiting up to ``timeout`` seconds for it; None:
        until it exists, repeating what it waits for in the log), then apply their held changes on top
        and only then count them as copied. True when no copy waits any more."""
        pending = self._pending
        if pending is None:
            return True
        while True:
            created = pending.slot.created(REPORT_EVERY_SECONDS if timeout is None else timeout)
            if created is not None:
                break
            if timeout is not None and time.monotonic() - pending.last_report < REPORT_EVERY_SECONDS:
                return False
            pending.last_report = time.monotonic()
            self._report_waits(list(pending.tables))
            if timeout is not None:
                return False
        self._pending = None
        self._waits_over()
        try:
            self._copy(pending, created)
        finally:
            pending.slot.close()  # drops the temporary slot
        return True

    def tick(self) -> None:
        """The stream is idle: a copy whose slot now exists is made (its tables' held changes would
        otherwise wait for the next group), and columns changed with no row change are applied when the
        stream has passed them (``settle_shapes``)."""
        self.finish_pending(0.0)
        self.settle_shapes(observe=True)

    def wait_for_copies(self, stop: threading.Event, confirmed: int | None = None) -> None:
        """``--once`` reached its end: the copies still waiting for their slot are waited for (their
        tables' changes are held, and the run must not end with them unapplied), unless ``stop`` is set;
        then the columns changed with no row change since the run began are applied (``settle_shapes``),
        and the copies that takes waited for too."""
        while not stop.is_set() and not self.finish_pending(1.0):
            pass
        if not stop.is_set() and self.settle_shapes(observe=False, confirmed=confirmed):
            while not stop.is_set() and not self.finish_pending(1.0):
                pass
        unsettled = self.shapes.pending
        if not stop.is_set() and unsettled is not None and unsettled.tables:
            # nothing applied or confirmed by this run reached where the catalog was read (the run stopped early)
            log.warning("columns changed in Postgres in %s, with no row change since, may not be in Delta yet: this "
                        "run did not confirm the slot up to %s, where the catalog was read; the next run brings "
                        "them (applier verify shows them until then)",
                        ", ".join(sorted(d.table.qualified_name for d in unsettled.tables.values())),
                        format_lsn(unsettled.position))

    def close(self) -> None:
        """The run ends: a copy still waiting for its slot is given up (the slot's creation cancelled).
        Its tables are off the list of copied tables, so the next run copies them; the changes held for
        them are in that copy."""
        self._drop_asking()
        pending, self._pending = self._pending, None
        if pending is None:
            return
        pending.slot.close()
        self._waits_over()
        self.progress(f"table sync: {', '.join(pending.tables)}: the copy's slot was still waiting; the next run "
                      "copies them (their Delta tables are behind until then)")

    def _waits_over(self) -> None:
        if self.on_waits is not None:
            self.on_waits([], 0, 0)

    def _hold(self, transactions: GroupedTransactions) -> None:
        """Take the changes of the waiting tables out of the group, in place, and keep them in order."""
        pending = self._pending
        if pending is None:
            return
        for end, batches in transactions:
            mine = [b for b in batches if b.qualified_name in pending.tables]
            if not mine:
                continue
            if not isinstance(batches, MutableSequence):
                raise SinkError("internal: a group's batches cannot be held", end_lsn=format_lsn(end))
            batches[:] = [b for b in batches if b.qualified_name not in pending.tables]
            # a group sent again after a reconnect is held once; a large transaction's later pieces (the same
            # end LSN, later changes: applier.loop) are held after its earlier ones
            last_end = pending.held[-1][0] if pending.held else None
            if last_end is None or end > last_end or (end == last_end and _first_ordinal(mine) > _last_ordinal(
                    pending.held[-1][1])):
                pending.held.append((end, mine))

    def _copy(self, pending: PendingCopy, created: CreatedSlot) -> None:
        """Copy the tables under the slot's snapshot (the initial copy's parallel typed reader), apply
        the changes held for them (those ending at or before the slot's point are in the copy and are left
        out by the applied version), and only then put them on the list of copied tables."""
        from applier.drivers.initial_copy import copy_tables, executor_chunks

        tables = list(pending.tables.values())
        point = created.consistent_point
        assert created.snapshot_name is not None  # asked for with export_snapshot
        for table in tables:
            self.progress(f"table sync: {table.qualified_name} {pending.reasons[table.qualified_name]}; copying "
                          f"at {format_lsn(point)}, then following it from the stream")
        rows = copy_tables(self.dsn, created.snapshot_name, tables, applier=self.applier, catalog=self.catalog,
                           lsn=point, settings=self.config.snapshot, special_values=self.config.apply.special_values,
                           progress=self.progress, progress_every=REPORT_EVERY_SECONDS, own_schemas=True,
                           on_rows=self.on_copy_rows, replace=pending.replace,
                           executor_chunks=executor_chunks(self.config))
        if pending.held:
            self.progress(f"table sync: {', '.join(pending.tables)}: applying the {len(pending.held)} "
                          "transaction(s) held while the copy waited")
            self.applier.apply_group(pending.held)
        known = self.known([])
        for table in tables:
            self.synced[table.qualified_name] = rows[table.qualified_name]
            known[table.qualified_name] = format_lsn(point)
            self._mark_published(table)
            self._columns.pop(table.oid or 0, None)
            self.progress(f"table sync: {table.qualified_name}: {rows[table.qualified_name]} rows at "
                          f"{format_lsn(point)}")
        self.state.save(STATE_KEY, known)


    def _mark_published(self, table: PublishedTable) -> None:
        """A table copied again after it was marked not published: published (and followed) again."""
        path = self.applier.path_for(table.namespace, table.name)
        store = self.applier.stores.writer(path)
        if (store.configuration(path) or {}).get(PROP_PUBLICATION, "published") != "published":
            store.set_properties(path, {PROP_PUBLICATION: "published"})


def _first_ordinal(batches: list[TableBatch]) -> int:
    return min((c.ordinal for b in batches for c in b.changes), default=-1)


def _last_ordinal(batches: list[TableBatch]) -> int:
    return max((c.ordinal for b in batches for c in b.changes), default=-1)


def _filled_columns(conn: psycopg.Connection, oid: int, added: set[str]) -> tuple[set[str], set[str]]:
    """Of the columns ``added`` to relation ``oid``: those whose existing rows are not NULL in Postgres (a
    default, identity or generated value, which the stream does not send), and those dropped again."""
    rows = conn.execute(
        "SELECT attname, atthasdef OR atthasmissing OR attidentity <> '' OR attgenerated <> '' "
        "FROM pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped "
        "AND attname = ANY(%s)", (oid, sorted(added))).fetchall()
    return {str(r[0]) for r in rows if r[1]}, added - {str(r[0]) for r in rows}


def shape_changes(was: list[Any], now: list[Any], delta_columns: Callable[[], Sequence[str]]) -> list[str]:
    """What differs between two recorded shapes of a published table, ``[row filter, column list, leaf
    partitions, enum labels]`` (see ``TableSync._reshaped``), each said as a user would: a row filter
    changed, columns no longer (or newly) published, partitions attached or detached, an enum label its
    columns use renamed. Columns, partitions and labels are compared by attnum, relation OID and pg_enum
    OID (a rename changes none; a label added is no change: no row holds it yet); a part an older state
    did not record is not compared. ``delta_columns``: the Delta table's columns, to name those a new
    column list leaves out."""
    what: list[str] = []
    if was[0] != now[0]:
        what.append(f"the publication's row filter changed ({was[0]!r} -> {now[0]!r})")
    if len(was) < 3:
        return what
    (old_cols, old_leaves), (cols, leaves) = was[1:3], now[1:3]
    if old_cols != cols and {c[0] for c in old_cols or ()} != {c[0] for c in cols or ()}:
        if cols is None:
            what.append("the publication's column list was removed: every column is published now")
        elif old_cols is None:
            listed = {c[1] for c in cols}
            gone = [c for c in delta_columns() if c not in listed]
            what.append("the publication's column list changed: " + (f"{', '.join(gone)} no longer published; "
                        if gone else "") + f"only {', '.join(c[1] for c in cols)} published now")
        else:
            now_nums = {c[0] for c in cols}
            before = {c[0] for c in old_cols}
            gone = [c[1] for c in old_cols if c[0] not in now_nums]
            new = [c[1] for c in cols if c[0] not in before]
            what.append("the publication's column list changed: " + "; ".join(
                part for part in (gone and f"{', '.join(gone)} no longer published",
                                  new and f"{', '.join(new)} published now") if part))
    if old_leaves is not None and leaves is not None and {p[0] for p in old_leaves} != {p[0] for p in leaves}:
        now_oids, before = {p[0] for p in leaves}, {p[0] for p in old_leaves}
        attached = [p[1] for p in leaves if p[0] not in before]
        detached = [p[1] for p in old_leaves if p[0] not in now_oids]
        what.append("it is published through its root and " + " and ".join(
            part for part in (attached and f"partitions {', '.join(attached)} were attached",
                              detached and f"partitions {', '.join(detached)} were detached") if part))
    if len(was) >= 4 and len(now) >= 4:
        before_labels = {int(oid): str(label) for oid, label in was[3]}
        renamed = [f"{before_labels[int(oid)]!r} -> {label!r}" for oid, label in now[3]
                   if int(oid) in before_labels and before_labels[int(oid)] != label]
        if renamed:
            what.append(f"an enum label its columns use was renamed ({', '.join(renamed)}: ALTER TYPE ... RENAME "
                        "VALUE sends no rows, and the rows holding it keep the old label otherwise)")
    return what
