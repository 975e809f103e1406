"""The apply stage: committed transactions in, idempotent Delta commits out.

This is the one module that joins the catalog, the values layer and the Delta sink (worker.c's
role in PostgreSQL). Per transaction and per table it folds the row changes into a TablePlan and
makes one Delta commit tagged with the transaction's end LSN, so re-applying an applied transaction
is a no-op (Delta's txnAppId/txnVersion) and a crash between two tables of one transaction is
recovered by simply applying the transaction again.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from itertools import pairwise

from applier.catalog import SchemaVersion, TypeCache
from applier.catalog.batches import GroupedTransactions, TableBatch
from applier.changes import OP_TRUNCATE
from applier.config import ApplySettings, TablesSettings
from applier.errors import (
    DroppedTypeChangeError,
    NotRecorded,
    ResyncNeededError,
    SchemaDecisionError,
    SinkError,
    TypeChangeError,
)
from applier.infra.crashpoints import crashpoint
from applier.lsn import format_lsn
from applier.sink.bulkload import SnapshotLoader, TeeLoader
from applier.sink.conflicts import retry_on_conflict
from applier.sink.derived import DerivedTables, HistoryJob
from applier.sink.extras import OP_READ
from applier.sink.fold import (
    FoldedTable,
    commit_description,
    describe_plan,
    fold_table,
    key_runs,
    split_ends,
    table_spec,
)
from applier.sink.idempotence import carry_applied_version
from applier.sink.identity import ColumnIdentityError, Mover, TableIdentities
from applier.sink.parallel import SessionPool
from applier.sink.plan import TablePlan
from applier.sink.schema import create_table, ensure_table, table_options
from applier.sink.spec import PROP_RESTART_IDENTITY, RewritePolicy, SchemaEvolution, TableOptions, TableSpec, app_id_for
from applier.sink.store import CommitResult, StorePicker
from applier.sink.store.picker import Store
from applier.sink.targets import TableTargets
from applier.spark.session import SparkLike, SparkProvider

log = logging.getLogger(__name__)

#: A table's changes in one group from which its fold and merge say what they do (they take seconds)
LARGE_FOLD_ROWS = 100_000


@dataclass
class CommitCounters:
    """What a DeltaApplier has done so far, counted as it commits (a driver's result is
    ``applier.loop.ApplyStats``, taken from these)."""

    transactions: int = 0
    applied: int = 0
    rows: Counter[str] = field(default_factory=Counter)
    last_end_lsn: int | None = None
    tables: set[tuple[str, str]] = field(default_factory=set)
    commits: int = 0


class DeltaApplier:
    """Applies transactions to the Delta tables under ``target_dir``."""

    def __init__(self, spark: SparkLike, target_dir: str, *, tables: TablesSettings | None = None,
                 apply: ApplySettings | None = None, types: TypeCache | None = None,
                 on_schema_change: Callable[[str, SchemaEvolution], None] | None = None,
                 dry_run: Callable[[str], None] | None = None,
                 identities: Callable[[TableTargets, Mover], TableIdentities] | None = None,
                 stores: StorePicker | None = None) -> None:
        #: started by the first write that needs Spark (a MERGE delta-rs does not do, a schema change...);
        #: a mirror whose tables delta-rs reads and writes runs without a JVM (issue 31 item 2)
        self.spark = SparkProvider.of(spark)
        self.target_dir = target_dir
        self.tables = tables or TablesSettings()
        self.targets = TableTargets(self.spark, target_dir, self.tables)
        self.settings = apply or ApplySettings()
        self._rename_policy = RewritePolicy(self.settings.column_renames, self.settings.rename_rewrite_max_mb << 20,
                                           self.settings.type_widening, self.settings.widen_rewrite_max_mb << 20)
        self.types = types
        self.stats = CommitCounters()
        self._applied: dict[str, int] = {}  # table path -> last applied end LSN
        self._commits: dict[str, int] = {}  # table path -> applier commits this run (for optimize)
        self._schema_seen: dict[str, SchemaVersion] = {}  # table path -> SchemaVersion the Delta table matches
        #: table path -> its newest Delta version as last read (``table_version``); every commit this applier
        #: makes to a table drops its entry, so a consistent cut (applier.sink.cuts) reads it again once
        self.versions: dict[str, int] = {}
        #: table path -> its Delta table id (``metaData.id``) as last read: dropped with its version, except
        #: after this applier's own commit (a MERGE or append keeps a table's id)
        self.table_ids: dict[str, str | None] = {}
        self._on_schema_change = on_schema_change
        self._dry_run = dry_run  # when set: describe each commit to it instead of writing anything
        self._sessions = SessionPool(self.spark, self.settings.parallel_tables)
        self._written: set[str] = set()  # table paths this run has written rows to
        #: which store (delta-rs or Spark) creates, merges into and copies into each table
        self.stores = stores if stores is not None else StorePicker(self.spark, merge_engine=self.settings.merge_engine)
        self.derived = DerivedTables(self.spark, target_dir, self.tables, self.snapshot_version, self.path_for,
                                     stores=self.stores, rewrites=self._rename_policy)
        #: end LSNs of transactions applied in pieces (``apply_group(piece=True)``) that may have pieces
        #: committed: a group holding one leaves out each table's changes its piece marker covers (the loop
        #: keeps this, in its state, from before the first piece until the last piece's group is applied)
        self.pieced_ends: set[int] = set()
        self._piece_marks: dict[tuple[str, int], int | None] = {}  # (path, end LSN) -> last ordinal committed
        self._pieced_tables: dict[tuple[str, int], str] = {}  # (path, end LSN) -> source name, of those marks
        #: (path, end LSN) of tables a piece of that transaction left for its last group: so do its later pieces
        self._left_for_last: set[tuple[str, int]] = set()
        #: which Delta table each source relation (OID) writes; None: by name alone (a dry run)
        self.identities = identities(self.targets, self._move_table) if identities is not None else None
        if self.identities is not None:
            self.identities.finish_pending()

    def path_for(self, namespace: str, name: str) -> str:
        """The Delta path of the table now called ``namespace.name``: the path its relation is bound to
        when it is bound (applier.sink.identity), else the one its name gives."""
        if self.identities is not None:
            bound = self.identities.bound_by_name(f"{namespace}.{name}")
            if bound is not None:
                return bound.path
        return self.targets.path_for(namespace, name)

    def relation_at(self, path: str) -> int | None:
        """The OID of the relation bound to the Delta table at ``path`` (None: none bound, or a dry run)."""
        holder = self.identities.holder_of(path) if self.identities is not None else None
        return holder.oid if holder is not None else None

    def path_of(self, oid: int, namespace: str, name: str) -> str:
        """The Delta path of relation ``oid``, following a rename (its table moves) and never handing a
        new table the Delta table of an older one that had its name."""
        if self.identities is None:
            return self.targets.path_for(namespace, name)
        return self.identities.path_of(oid, namespace, name)

    def _applied_where_bound(self, oid: int, end_lsn: int) -> bool:
        """Relation ``oid``'s Delta table (where it is bound) has applied the transaction ending at
        ``end_lsn`` already (a log replayed again, a slot re-sending after a crash): the stream's name then
        is an older one, whose rename must not be followed backwards, nor a name the catalog gave it then
        (a stored log's notes) be asked for again. Its changes are left out of the fold there anyway."""
        bound = self.identities.bound(oid) if self.identities is not None else None
        if bound is None or bound.retired:
            return False
        applied_to = self._applied_version(bound.path, bound.name)
        return applied_to is not None and end_lsn <= applied_to

    def _current_path(self, oid: int, namespace: str, name: str) -> str:
        bound = self.identities.bound(oid) if self.identities is not None else None
        return bound.path if bound is not None else self.targets.path_for(namespace, name)

    def _move_table(self, src: str, dst: str, old_name: str, new_name: str | None) -> None:
        """A renamed source table's Delta table moved from ``src`` to ``dst``: its applied version
        goes with it to the new name's app id (one commit, which also records the new source name), and
        so do its history and change feed tables. ``new_name`` None: the table was dropped and its name
        taken, its Delta table retired to ``dst`` (its derived tables beside it)."""
        from applier.sink.spec import PROP_SOURCE

        for cache in (self._applied, self._commits, self._schema_seen):
            cache.pop(src, None)
            cache.pop(dst, None)
        self._forget_logs()  # derived tables move too
        self.stores.forget(src, dst)
        self._written.discard(src)
        if old_name != new_name:  # (the same name: parked while two tables swap names)
            self.derived.follow(old_name, new_name, dst)
        if new_name is None:
            return
        carry_applied_version(self.spark, dst, app_id_for(old_name), app_id_for(new_name), {PROP_SOURCE: new_name})
        if old_name != new_name:  # (the same name: parked while two tables swap names)
            log.warning("%s was renamed to %s: its Delta table moved from %s to %s", old_name, new_name, src, dst)

    def _spec(self, batch: TableBatch) -> TableSpec:
        return table_spec(batch, self.tables, self.types)

    def apply_group(self, transactions: GroupedTransactions, *, piece: bool = False) -> list[TableBatch]:
        """Apply consecutive committed transactions, one Delta commit per table they touch.

        The fold of several transactions equals applying them one by one (last image per key in
        commit order, TOAST resolved along the chain, truncates as barriers), and the commit is tagged
        with the group's last end LSN. Transactions a table has already applied (its recorded version
        is >= their end LSN) are left out of that table's fold, so re-running with other group
        boundaries after a crash stays exact.

        ``piece``: ``transactions`` is one piece of one large transaction (applier.loop applies it in
        pieces, so that memory holds one piece): each table's commit is tagged, not with the
        transaction's end LSN (its applied version stays where it was, so the transaction's later
        pieces still apply), but with a piece marker (app id ``piece_app_id``) holding the ordinal of the
        piece's last change to it. The transaction's next pieces, and its re-delivery after a crash,
        leave out the changes a table's marker covers (``pieced_ends``), so each change is applied once
        whatever the pieces' boundaries. A table with history or change feed tables, or whose merge
        keys change inside the piece, is not applied in pieces: its batches are returned, for the
        transaction's last group, which applies them with the rest.
        """
        if not transactions:
            return []
        self.note_split_transactions(transactions)
        group_end = transactions[-1][0]
        per_relation: dict[int, tuple[TableBatch, list[tuple[int, TableBatch]]]] = {}
        for end_lsn, batches in transactions:
            for batch in batches:
                qualified = f"{batch.namespace}.{batch.name}"
                if not self.tables.selected(qualified):
                    continue
                if any(c.op == OP_TRUNCATE for c in batch.changes) and self.settings.truncate == "error":
                    raise SinkError("TRUNCATE received and apply.truncate is 'error'", table=qualified,
                                    end_lsn=end_lsn)
                if not self._applied_where_bound(batch.relation_oid, end_lsn):
                    self.path_of(batch.relation_oid, batch.namespace, batch.name)  # follows a rename, in order
                entry = per_relation.setdefault(batch.relation_oid, (batch, []))
                entry[1].append((end_lsn, batch))
                per_relation[batch.relation_oid] = (batch, entry[1])  # remember the newest schema
        # where each relation's Delta table is once the group's renames are followed (a table renamed
        # inside the group has all of its changes in the one table, at its new path)
        per_table = {self._current_path(oid, last.namespace, last.name): (last, parts)
                     for oid, (last, parts) in per_relation.items()}
        commits: list[PlannedCommit] = []
        histories: list[HistoryJob] = []
        oid_of: dict[str, int] = {}  # source name -> relation OID, for the errors of the commits
        deferred: list[TableBatch] = []
        for path, (last_batch, parts) in per_table.items():
            try:
                if not self._plan_table(path, last_batch, parts, group_end, commits, histories, oid_of, piece=piece):
                    deferred.extend(b for _lsn, b in parts)
            except ResyncNeededError as e:  # a resync by OID finds it whatever its name is now
                e.add_context(relation_oid=last_batch.relation_oid)
                raise
        try:
            self._run_commits(commits, group_end, 0 if piece else len(transactions), histories, piece=piece)
        except ResyncNeededError as e:
            e.add_context(relation_oid=oid_of.get(str(e.context.get("table"))))
            raise
        if not piece and (ends := self.pieced_ends.intersection(lsn for lsn, _b in transactions)):
            self._finish_pieced(ends, {c.path for c in commits})
        return deferred

    def note_split_transactions(self, transactions: GroupedTransactions) -> None:
        """Transactions inside which a table's merge keys change between its row changes are committed in
        runs, the earlier ones with piece markers (``key_runs``, ``_commit_run``): their end LSNs join
        ``pieced_ends`` before anything of them is applied (the loop calls this before a group's column
        fills), so that a re-delivery after a crash between two runs leaves out what the first committed."""
        if self._dry_run is None:
            self.pieced_ends |= split_ends(transactions, self.tables)

    def _finish_pieced(self, ends: set[int], committed: set[str]) -> None:
        """The last group of transactions applied in pieces is committed: a table whose changes all came in
        earlier pieces (its last commit holds a piece marker) records the transaction's end LSN as its
        applied version now, in a commit of its own with no rows, as any table that applied the
        transaction does (``applier status``, and a replay of a stored log, go by it)."""
        for (path, lsn), name in list(self._pieced_tables.items()):
            if lsn not in ends:
                continue
            del self._pieced_tables[(path, lsn)]
            if path in committed or self._piece_marks.get((path, lsn)) is None or self._dry_run is not None:
                continue
            carry = (app_id_for(name), lsn)
            retry_on_conflict(partial(self.stores.writer(path).set_properties, path, {}, carry=carry), table=name)
            self._applied[path] = lsn
        self._piece_marks = {k: v for k, v in self._piece_marks.items() if k[1] not in ends}
        self._left_for_last = {k for k in self._left_for_last if k[1] not in ends}
        self.pieced_ends -= ends  # every table has them whole now

    def _plan_table(self, path: str, last_batch: TableBatch, parts: list[tuple[int, TableBatch]], group_end: int,
                    commits: list[PlannedCommit], histories: list[HistoryJob],
                    oid_of: dict[str, int], *, piece: bool = False) -> bool:
        """One table's part of a group: its evolution, the runs its merge keys cut (committed at once), and
        the fold of the rest, added to ``commits``. False: ``piece`` and the table is not applied in pieces
        (see ``apply_group``); nothing was done for it."""
        spec = self._spec(last_batch)
        bound = self.identities.bound(last_batch.relation_oid) if self.identities is not None else None
        if bound is not None and not bound.retired and bound.name != spec.source_name:
            # The stream is behind a rename the mirror already followed (the catalog's name decided
            # where the table is): its applied version, commits and errors go by the name it has now,
            # the one its version was carried to, or changes applied under the stream's older name
            # would be applied again under the new one (not idempotent for a multiset table).
            spec = replace(spec, source_name=bound.name)
        if piece and self.derived.kinds(spec.source_name):
            return False
        self.stats.tables.add((last_batch.namespace, last_batch.name))
        applied_to = self._applied_version(path, spec.source_name)
        todo = [(lsn, b) for lsn, b in parts if applied_to is None or lsn > applied_to]
        if self.pieced_ends and todo:
            todo = self._past_pieces(path, spec.source_name, todo)
        if todo:
            self._check_columns(path, spec.source_name, last_batch.relation_oid, group_end)
        if self._dry_run is None and self.derived.kinds(spec.source_name):
            if todo:  # the mirror table's evolution first: its column renames reach its derived tables
                self._ensure(path, spec, last_batch.schema)
            for kind in self.derived.kinds(spec.source_name):
                self._forget_logs(self.derived.path(kind, last_batch.namespace, last_batch.name))
            history = self.derived.before_mirror_commit(spec, last_batch, parts, group_end)
            if history is not None:
                histories.append(history)
        if not todo:
            return True  # already applied: its schema may have moved on since, so touch nothing
        runs = key_runs(todo, self.tables)
        if piece and (len(runs) > 1 or (path, group_end) in self._left_for_last):
            # the last group applies the rest of the table's changes in that transaction: a later piece's
            # commit would put its marker past the changes left for it, and they would be left out then
            self._left_for_last.add((path, group_end))
            return False
        if self._dry_run is None:
            self._ensure(path, spec, last_batch.schema, touched=lambda: _touched_keys(todo))
        for run, after in pairwise(runs):  # the table's merge key changed inside the group (key_runs)
            self._commit_run(path, spec, run, last_batch.schema, inside=run[-1][0] == after[0][0])
        todo = runs[-1]
        changes = sum(len(b.changes) for _lsn, b in todo)
        if changes >= LARGE_FOLD_ROWS:  # seconds to minutes: say what the run is doing meanwhile
            log.info("%s: folding %s row changes of %d transaction(s) (end LSN %s)", spec.source_name,
                     f"{changes:,}", len({lsn for lsn, _b in todo}), format_lsn(group_end))
        plan = fold_table(spec, [b for _lsn, b in todo], last_batch.schema)
        if plan.empty:
            if not piece:
                self._applied[path] = group_end
            return True
        tag = None
        if piece:  # the piece's last change to this table: what its next pieces and a re-delivery leave out
            last = max(c.ordinal for _lsn, b in todo for c in b.changes)
            tag = (piece_app_id(app_id_for(spec.source_name), group_end), last)
        description = commit_description(spec, group_end, len({lsn for lsn, _b in todo}), plan,
                                         f"piece=changes<={tag[1]}" if tag is not None else "",
                                         commit_time=todo[-1][1].commit_time)
        if self._dry_run is not None:
            self._dry_run(describe_plan(description, plan))
            return True
        commits.append(PlannedCommit(path, spec, plan, description, tag))
        oid_of[spec.source_name] = last_batch.relation_oid
        return True

    def _check_columns(self, path: str, source_name: str, oid: int, group_end: int | None = None) -> None:
        """ColumnIdentityError when the identity map found that relation ``oid``'s columns are no longer
        the ones its Delta table holds (TableIdentities.recopy_reason): raised before any row is written."""
        if self.identities is None or (why := self.identities.recopy_reason(oid)) is None:
            return
        raise ColumnIdentityError(
            f"{source_name} (relation OID {oid}): {why}; no row of it was written to its Delta table at {path}. "
            f"To go on: copy the table again (`applier resync --config FILE --table {source_name}`, or by its "
            "relation OID; or set apply.schema_changes: resync to do this by itself)", table=source_name,
            relation_oid=oid, **({} if group_end is None else {"end_lsn": format_lsn(group_end)}))

    def _past_pieces(self, path: str, source_name: str,
                     todo: list[tuple[int, TableBatch]]) -> list[tuple[int, TableBatch]]:
        """``todo`` less the changes of transactions applied in pieces that the table's piece marker says
        are committed already (see ``apply_group``)."""
        out: list[tuple[int, TableBatch]] = []
        for lsn, batch in todo:
            if lsn in self.pieced_ends:
                key = (path, lsn)
                if key not in self._piece_marks:
                    self._piece_marks[key] = self.stores.reader(path).applied_version(
                        path, piece_app_id(app_id_for(source_name), lsn)) if self._exists(path) else None
                mark = self._piece_marks[key]
                if mark is not None:
                    self._pieced_tables[key] = source_name
                    kept = [c for c in batch.changes if c.ordinal > mark]
                    if not kept:
                        continue
                    if len(kept) != len(batch.changes):
                        batch = replace(batch, changes=kept)
            out.append((lsn, batch))
        return out

    def _commit_run(self, path: str, spec: TableSpec, run: list[tuple[int, TableBatch]],
                    newest: SchemaVersion, *, inside: bool) -> None:
        """Fold and commit, at once, one run of a table's batches that a later run with other merge
        keys follows in the same group (``key_runs``): in the columns of the group's newest schema
        (``spec``, the table is already evolved to it) but merged on the run's own keys, tagged with the
        end LSN of the run's last transaction, so that a crash after it re-applies only what follows.
        ``inside``: the run ends inside its one transaction (the next run holds the transaction's rest):
        it is tagged with a piece marker instead, the ordinal of its last change, which a re-delivery
        of the transaction leaves out (``note_split_transactions``), as for a piece of a large one."""
        version = run[-1][0]
        own = self._spec(run[-1][1])  # raises what a commit per transaction would (metadata columns and no key)
        run_spec = replace(spec, key_columns=own.key_columns, replica_identity=own.replica_identity)
        plan = fold_table(run_spec, [b for _lsn, b in run], newest)
        if plan.empty:
            if not inside:
                self._applied[path] = version
            return
        tag = None
        if inside:
            tag = (piece_app_id(app_id_for(spec.source_name), version),
                   max(c.ordinal for _lsn, b in run for c in b.changes))
        description = commit_description(spec, version, len(run), plan,
                                         f"keys={','.join(run_spec.key_columns) or '(whole row)'}"
                                         + (f" piece=changes<={tag[1]}" if tag is not None else ""),
                                         commit_time=run[-1][1].commit_time)
        if self._dry_run is not None:
            self._dry_run(describe_plan(description, plan))
            return
        [result] = self._sessions.run([partial(self._commit, path=path, spec=run_spec, plan=plan, version=version,
                                               description=description, tag=tag)])
        crashpoint("key_run_committed")
        self.stats.rows[spec.source_name] += result.rows_upserted + result.rows_deleted
        self.stats.commits += 1

    def apply_folded(self, folded: Sequence[FoldedTable], group_end: int, transactions: int) -> None:
        """Commit plans folded elsewhere (each already leaves out what its table had applied when the
        fold was made) as one group ending at ``group_end``: what apply_group does after its fold."""
        commits: list[PlannedCommit] = []
        for table in folded:
            rel = table.schema.relation
            if self.path_of(rel.oid, table.schema.namespace, rel.name) != table.path:
                raise SinkError("a range folded on an executor was folded for another Delta table than the one its "
                                "relation is bound to now (a table renamed during the catch-up); run again: the "
                                "driver path follows the rename", table=table.spec.source_name, path=table.path)
            self.stats.tables.add((table.schema.namespace, table.schema.relation.name))
            self._ensure(table.path, table.spec, table.schema)
            if table.plan.empty:
                self._applied[table.path] = group_end
                continue
            description = commit_description(table.spec, group_end, transactions, table.plan)
            commits.append(PlannedCommit(table.path, table.spec, table.plan, description))
        self._run_commits(commits, group_end, transactions, [])

    def hand_over_for_identity(self, folded: Sequence[FoldedTable]) -> str | None:
        """Why folds made on executors cannot be committed as they are (a rename or a reused name in
        them: executors fold by name, and only the driver path meets the names in log order), or None."""
        if self.identities is None:
            return None
        seen: dict[int, str] = {}
        for table in folded:
            oid, name = table.schema.relation.oid, table.spec.source_name
            if seen.setdefault(oid, name) != name:
                return f"relation {oid} is {seen[oid]} and {name} in these ranges (a rename)"
            bound = self.identities.bound(oid)
            if bound is not None and (bound.retired or bound.name != name):
                return f"{name} was {bound.name} (a rename)"
            holder = self.identities.holder_of(table.path)
            if holder is not None and holder.oid != oid:
                return f"{name} is a new relation where relation {holder.oid} was (a reused name)"
            if self.identities.recopy_reason(oid) is not None:
                return f"{name} must be copied again (its columns are not the ones its Delta table holds)"
        return None

    def _run_commits(self, commits: list[PlannedCommit], group_end: int, transactions: int,
                     histories: list[HistoryJob], *, piece: bool = False) -> None:
        results = self._sessions.run([partial(self._commit, path=c.path, spec=c.spec, plan=c.plan, version=group_end,
                                              description=c.description, tag=c.tag)
                                      for c in commits])
        for commit, result in zip(commits, results, strict=True):
            self.stats.rows[commit.spec.source_name] += result.rows_upserted + result.rows_deleted
            self.stats.commits += 1
        self.stats.commits += self.derived.after_mirror_commits(histories, group_end)  # behind: they catch up
        if piece:
            return  # the transaction is counted, and its end recorded, with its last piece
        self.stats.transactions += transactions
        if commits:
            self.stats.applied += transactions
        self.stats.last_end_lsn = group_end

    def _commit(self, spark: SparkProvider, *, path: str, spec: TableSpec, plan: TablePlan, version: int,
                description: str, tag: tuple[str, int] | None = None) -> CommitResult:
        """One table's commit of a group (run side by side with the other tables', in ``spark``, a
        session of its own, started only when this commit needs Spark). ``tag``: a piece's (app id,
        version) instead of the table's own app id and ``version`` (see ``apply_group``)."""
        why = "a MERGE merge_engine 'spark' asks for" if self.settings.merge_engine == "spark" else \
            "a MERGE delta-rs does not write (a key-less table with floating-point or nested columns, a feature " \
            "or key type delta-rs does not handle)"
        app_id, may_be_empty = app_id_for(spec.source_name), path not in self._written
        applied = version
        if tag is not None:
            app_id, version = tag
        # delta-rs may decline the plan: Spark then makes the commit (started for ``why``)
        store = self.stores.merger(path, spec, spark, why=f"{spec.source_name}: {why}")
        rows, started = plan.size(), time.monotonic()
        if rows >= LARGE_FOLD_ROWS:
            log.info("%s: merging %s rows into its Delta table", spec.source_name, f"{rows:,}")
        result = retry_on_conflict(
            partial(store.merge, path, spec.schema, plan, app_id=app_id, version=version,
                    description=description, may_be_empty=may_be_empty),
            table=spec.source_name)
        if result.version is not None:
            self.versions[path] = result.version
        else:
            self._forget_logs(path)
        if tag is None:
            self._applied[path] = applied
        else:
            self._piece_marks[(path, applied)] = version
            self._pieced_tables[(path, applied)] = spec.source_name
        if rows >= LARGE_FOLD_ROWS:
            log.info("%s: merged %s rows in %.1fs", spec.source_name, f"{rows:,}", time.monotonic() - started)
        if result.rows_upserted:
            self._written.add(path)  # it has data files now (a later delete of every row only costs a MERGE)
        crashpoint("between_tables")
        self._maybe_optimize(spark, path, spec.source_name)
        if plan.restart_identity:
            # The tables applier creates have no identity columns of their own; record the reset so
            # that sequences owned by a consumer can follow it.
            self.stores.merger(path, spec, spark).set_properties(path, {PROP_RESTART_IDENTITY: format_lsn(version)})
        return result

    def snapshot_loader(self, schema_version: SchemaVersion, lsn: int, *, commit_bytes: int,
                        large: bool = True) -> SnapshotLoader | TeeLoader:
        """A writer for the table's initial copy taken at ``lsn`` (the slot's consistent point, or a
        table's own copy slot's when a copy is resumed). Its first commit replaces the table, its last
        carries ``lsn`` as the table's applied version, so the stream's transactions ending after it
        apply and nothing before it does. A crash part-way leaves no version recorded, and the next
        attempt overwrites from scratch. A new table that delta-rs can create is created and written by
        delta-rs alone, its last commit carrying the applied version as a ``txn`` action, exactly as
        Spark's idempotent writes record it; any other is created (or evolved) through Spark, and then a
        table that is not ``large`` (less than one commit) is written by Spark in one commit."""
        rel = schema_version.relation
        batch = TableBatch(rel.oid, schema_version.namespace, rel.name, schema_version, lsn, lsn, ())
        spec = self._spec(batch)
        self._forget_logs()  # the table and its derived ones are written anew
        path = self.path_of(rel.oid, batch.namespace, batch.name)
        options = table_options(self.tables.rule_for(spec.source_name))
        creator = self.stores.creator(path, spec, options or TableOptions())
        if self._schema_seen.get(path) is None and not creator.uses_spark and not self._exists(path):
            # no Spark job: a copy of many small tables is quick
            create_table(self.spark, path, spec, options, picker=self.stores)
            self.targets.created(path)
            self._schema_seen[path] = schema_version
            store: Store = creator
        else:
            self._ensure(path, spec, schema_version)  # created without type widening, so delta-rs can write it
            store = self.stores.copier(path, spec, large=large)

        def copy_finished(rows: int) -> None:
            self._applied[path] = lsn
            if rows:
                self._written.add(path)
            self.stats.rows[spec.source_name] += rows
            self.stats.tables.add((batch.namespace, batch.name))

        tag = (app_id_for(spec.source_name), lsn, f"{spec.source_name} snapshot at {format_lsn(lsn)}")
        # the values of applier's added columns in every copied row (a zero-column table's: its NULL)
        constants = spec.extra.values(OP_READ, lsn, None, False) if spec.extra is not None else (None,) * spec.added
        loader = SnapshotLoader(self.spark, path, spec, schema_version.column_names, tag=tag,
                                commit_bytes=commit_bytes, on_done=copy_finished, store=store, constants=constants)
        others = self.derived.snapshot_loaders(spec, schema_version, schema_version.column_names, lsn,
                                               commit_bytes=commit_bytes, stores=self.stores)
        return TeeLoader(loader, others) if others else loader

    def replace_table(self, schema_version: SchemaVersion) -> bool:
        """Leave the table's Delta table empty with ``schema_version``'s columns, in one commit, for a
        fresh copy (``applier resync``: a retype Delta cannot widen is replaced, not evolved); False when
        there is no Delta table yet. What this run remembers of the table is forgotten with it."""
        rel = schema_version.relation
        spec = self._spec(TableBatch(rel.oid, schema_version.namespace, rel.name, schema_version, 0, 0, ()))
        path = self.path_of(rel.oid, schema_version.namespace, rel.name)
        for cache in (self._applied, self._schema_seen):
            cache.pop(path, None)
        self._forget_logs()
        self.stores.forget(path)
        self._written.discard(path)
        if not self._exists(path):
            return False
        self.stores.writer(path).replace_empty(path, spec)  # Spark's where delta-rs declines
        self.targets.created(path)
        return True

    def relation_table(self, oid: int, namespace: str, name: str) -> tuple[str, str] | None:
        """Where relation ``oid`` (called ``namespace.name`` in the stream just now) has its Delta table as
        the group begins, and the source name its applied version is recorded under: the path it is bound
        to (a rename the group holds is not followed yet), else the one its name gives, unless another
        relation holds that path (a name reused: this relation has no Delta table yet, None)."""
        ids = self.identities
        bound = ids.bound(oid) if ids is not None else None
        if bound is not None:
            return bound.path, bound.name
        path = self.targets.path_for(namespace, name)
        holder = ids.holder_of(path) if ids is not None else None
        if holder is not None and holder.oid != oid:
            return None
        return path, f"{namespace}.{name}"

    def relation_columns(self, oid: int, namespace: str, name: str) -> tuple[str, ...] | None:
        """The columns relation ``oid``'s Delta table has now, by their Postgres names (None: it has none
        yet; see relation_table)."""
        where = self.relation_table(oid, namespace, name)
        if where is None or not self._exists(where[0]):
            return None
        columns = self.stores.reader(where[0]).columns(where[0])
        if not self.tables.safe_column_names(where[1]):
            return columns
        from applier.sink.naming import postgres_column_name

        return tuple(postgres_column_name(c) for c in columns)

    def relation_version(self, oid: int, namespace: str, name: str) -> int | None:
        """The applied version of relation ``oid``'s Delta table (None: none; see relation_table)."""
        where = self.relation_table(oid, namespace, name)
        return None if where is None else self._applied_version(*where)

    def piece_mark(self, oid: int, namespace: str, name: str, end_lsn: int) -> int | None:
        """The ordinal of the last change of the transaction ending at ``end_lsn`` that relation ``oid``'s
        Delta table has committed in pieces (its piece marker; see ``apply_group``), or None: none of that
        transaction's changes are in the table yet. Read from the table's log, not from what this run
        remembers: a run after a crash meets the marks of the one before."""
        where = self.relation_table(oid, namespace, name)
        if where is None or end_lsn not in self.pieced_ends or not self._exists(where[0]):
            return None
        return self.stores.reader(where[0]).applied_version(where[0], piece_app_id(app_id_for(where[1]), end_lsn))

    def snapshot_version(self, namespace: str, name: str) -> int | None:
        """The applied version a finished copy (or a later commit) recorded on the table; None when the
        table has none (never copied, or a copy that did not finish)."""
        return self._applied_version(self.path_for(namespace, name), f"{namespace}.{name}")

    def _maybe_optimize(self, spark: SparkProvider, path: str, source_name: str) -> None:
        """Compact small files every ``optimize_every_commits`` commits (grouped MERGEs write a few
        files each; without compaction a long-running mirror's reads slow down)."""
        every = self.settings.optimize_every_commits
        if not every:
            return
        self._commits[path] = self._commits.get(path, 0) + 1
        if self._commits[path] % every == 0:
            log.info("%s: OPTIMIZE after %d commits", source_name, self._commits[path])
            # delta-rs compacts what it writes (no Spark started for it); Spark's in this commit's session
            store = self.stores.writer(path, spark)
            retry_on_conflict(lambda: store.optimize(path, [], None), table=source_name)

    def ensure(self, path: str, spec: TableSpec, schema_version: SchemaVersion) -> None:
        """Evolve the Delta table at ``path`` to ``schema_version`` (``spec``), following the renames the
        catalog proved (a gone column that is a new one renamed keeps its values), once per version: what
        a group's commit does first, and what a column fill does before it writes (columnfill)."""
        self._ensure(path, spec, schema_version)

    def _ensure(self, path: str, spec: TableSpec, schema_version: SchemaVersion, *,
                touched: Callable[[], set[tuple[object, ...]]] | None = None) -> None:
        seen = self._schema_seen.get(path)
        if seen is schema_version or seen == schema_version:  # equal: a catalog rebuilt from its JSON (ranges)
            return
        if path in self._schema_seen and self.settings.schema_changes == "stop":
            raise SchemaDecisionError(
                "the source table's schema changed and apply.schema_changes is 'stop'; to go on, set it to "
                f"evolve, or re-copy the table: `applier resync --config FILE --table {spec.source_name}`",
                table=spec.source_name)
        self.check_retype(path, spec, schema_version, touched)
        if self.identities is not None:
            self.identities.check_undecided(schema_version.relation.oid, spec.source_name,
                                            schema_version.column_names)
        options = table_options(self.tables.rule_for(spec.source_name))
        renames = None
        if self.identities is not None:
            identities, oid = self.identities, schema_version.relation.oid

            def renames(gone: tuple[str, ...], new: tuple[str, ...],
                        candidates: dict[str, tuple[str, ...]]) -> dict[str, str]:
                # Delta names here, Postgres names in what the catalog noted (column_names: safe)
                pg = spec.postgres_name
                proven = identities.renames_for(oid, spec.source_name, tuple(map(pg, gone)), tuple(map(pg, new)),
                                                {pg(k): tuple(map(pg, v)) for k, v in candidates.items()})
                applied.update(proven)
                return {spec.delta_name(old): spec.delta_name(new_name) for old, new_name in proven.items()}
        applied: dict[str, str] = {}
        try:
            evolution = ensure_table(self.spark, path, spec, options, check_options=path not in self._schema_seen,
                                     renames=renames, stores=self.stores, rename=self._rename_policy)
        except TypeChangeError as e:
            self._type_change_of_a_dropped_table(e, schema_version.relation.oid, path)
            raise
        if renames is not None and self.derived.kinds(spec.source_name):
            self.derived.evolve_renamed(spec, schema_version, renames)  # before the note is marked applied
        if self.identities is not None:
            self.identities.renames_applied(schema_version.relation.oid, applied,
                                            tuple(map(spec.postgres_name, spec.column_names)))
            # after the evolution: the renames were proven with the attnums recorded before
            self.identities.observe(schema_version.relation.oid, schema_version.column_names)
            # the catalog as it is now may show a column that is another one (whoever evolves: a group, a fold
            # of ranges, a column fill): stop before any row is written
            self._check_columns(path, spec.source_name, schema_version.relation.oid)
        self.targets.created(path)
        self._forget_logs(path)
        if path in self._schema_seen and self._on_schema_change is not None:
            self._on_schema_change(spec.source_name, evolution)
        self._schema_seen[path] = schema_version
        self.stores.forget(path)  # a new schema may have brought a feature delta-rs cannot write

    def check_retype(self, path: str, spec: TableSpec, schema_version: SchemaVersion,
                      touched: Callable[[], set[tuple[object, ...]]] | None) -> None:
        """TypeRewriteError when the version changes a column's Postgres type and the values of the table's
        existing rows cannot be proven kept (applier.sink.retypes: ``ALTER ... TYPE ... USING``), before
        the Delta table is touched."""
        from applier.protocol.messages import COL_TEXT
        from applier.sink.retypes import TypeRewriteError, retyped_columns, unproven_retype
        from applier.values import convert_value

        if self.identities is None or not retyped_columns(schema_version) or not self._exists(path):
            return
        columns = {c.name: c for c in schema_version.relation.columns}

        def convert(name: str, text: bytes) -> object:
            column = columns[name]
            return convert_value(COL_TEXT, text, column.type_oid, column.type_modifier, self.types,
                                 self.settings.special_values, name)

        def delta_rows(key: Sequence[str],
                       values: Sequence[str]) -> dict[tuple[object, ...], tuple[object, ...]] | None:
            names = [spec.delta_name(c) for c in (*key, *values)]
            reader = self.stores.reader(path)
            if not set(names) <= set(reader.columns(path)):
                return None  # a column renamed in the same change: no row can be matched, nothing is proven
            return {row[:len(key)]: row[len(key):] for row in reader.scan(path, names)}

        why = unproven_retype(self.identities, schema_version, convert, delta_rows,
                              touched() if touched is not None else None)
        if why is not None:
            oid = schema_version.relation.oid
            raise TypeRewriteError(
                f"{why}. Nothing was written to its Delta table at {path}. To go on: copy the table again "
                f"(`applier resync --config FILE --table {spec.source_name}`, or by its relation OID {oid}; or set "
                "apply.schema_changes: resync to do this by itself)", table=spec.source_name, relation_oid=oid)

    def _type_change_of_a_dropped_table(self, error: TypeChangeError, oid: int, path: str) -> None:
        """DroppedTypeChangeError when the relation of ``error`` no longer exists in Postgres (asked of the
        live catalog): a resync by its name would copy nothing, or the other table that took the name,
        and stop here again after it, for the same change of the dropped table."""
        ids = self.identities
        if ids is None or ids.lookup is None:
            return
        bound = ids.bound(oid)
        if not (bound is not None and bound.retired):
            try:
                if ids.lookup.relation(oid) is not None:
                    return
            except NotRecorded:  # a stored log's records say nothing of it: not known to be dropped
                return
        c, table = error.context, str(error.context.get("table"))
        reused = ids.bound_by_name(table)
        other = (f"; {table} is now another table (relation OID {reused.oid}), which `applier resync --table "
                 f"{table}` would copy instead" if reused is not None and reused.oid != oid else "")
        raise DroppedTypeChangeError(
            f"column {c.get('column')!r} of {table} (relation OID {oid}) changed type from {c.get('old_type')} to "
            f"{c.get('new_type')}, which Delta cannot widen in place, and that table has been dropped in Postgres "
            f"since, so no fresh copy of it can be taken{other}. Nothing was written to its Delta table at {path}, "
            "which holds its rows as of before the change. To go on: move that Delta directory away (it stays the "
            "dropped table's copy); the mirror then writes the dropped table's last changes to a new Delta table "
            "there and goes on", table=table, relation_oid=oid, path=path, column=c.get("column"),
            old_type=c.get("old_type"), new_type=c.get("new_type")) from error

    def _exists(self, path: str) -> bool:
        return self.stores.reader(path).exists(path)

    # --- what a consistent cut asks (applier.sink.cuts) ---------------------------------------------

    def table_version(self, path: str) -> int:
        """The table's newest Delta version: read from its log once, then again only after this applier
        committed to it (maintenance commits in between change no row: the version read still holds them)."""
        version = self.versions.get(path)
        if version is None:
            version = self.versions[path] = self.stores.reader(path).version(path)
        return version

    def _forget_logs(self, path: str | None = None) -> None:
        """What was read of a table's log (its version, its table id) is read again when next asked: the table
        was written by other means, moved or made anew (None: every table's)."""
        if path is None:
            self.versions.clear()
            self.table_ids.clear()
        else:
            self.versions.pop(path, None)
            self.table_ids.pop(path, None)

    def table_id(self, path: str) -> str | None:
        """The table's Delta table id (``metaData.id``): read once, then again only after the table may have
        been made anew (a copy, a resync, a move); a cut records it beside the version, so that a reader
        can tell the table from another later written at the same path."""
        if path not in self.table_ids:
            self.table_ids[path] = self.stores.reader(path).table_id(path)
        return self.table_ids[path]

    def applied_lsn(self, path: str, source_name: str) -> int | None:
        """The end LSN the table at ``path`` has applied (None: no table, or none recorded yet)."""
        return self._applied_version(path, source_name)

    def derived_tables(self, qualified: str) -> list[tuple[str, str, int | None]]:
        """(kind, path, applied LSN) of the history and change feed tables of ``qualified`` (schema.table)."""
        namespace, _, name = qualified.partition(".")
        out: list[tuple[str, str, int | None]] = []
        for kind in self.derived.kinds(qualified):
            path = self.derived.path(kind, namespace, name)
            out.append((kind.name, path, self.derived.applied(kind, path, qualified)))
        return out

    def _applied_version(self, path: str, source_name: str) -> int | None:
        """The end LSN the table has applied up to (read once from its Delta log, then tracked)."""
        if path not in self._applied:
            if not self._exists(path):
                return None
            version = self.stores.reader(path).applied_version(path, app_id_for(source_name))
            if version is None:
                return None
            self._applied[path] = version
        return self._applied[path]


@dataclass(frozen=True, slots=True)
class PlannedCommit:
    """One table's commit of a group, planned: ``tag`` (app id, version) for a piece of a large
    transaction (``DeltaApplier.apply_group``), None for the table's own app id and the group's end."""

    path: str
    spec: TableSpec
    plan: TablePlan
    description: str
    tag: tuple[str, int] | None = None


def _touched_keys(todo: list[tuple[int, TableBatch]]) -> set[tuple[object, ...]]:
    """The keys (old and new) of every row the group's changes to a table touch: the Delta table does not hold
    their state as of a type change inside the group yet (applier.sink.retypes leaves them out)."""
    out: set[tuple[object, ...]] = set()
    for _lsn, batch in todo:
        positions = batch.schema.key_indexes
        for change in batch.changes:
            for row in (change.old_row, change.new_row):
                if row is not None and positions and len(row) > max(positions):
                    out.add(tuple(row[i] for i in positions))
    return out


def piece_app_id(app_id: str, end_lsn: int) -> str:
    """The app id of a table's piece marker for the transaction ending at ``end_lsn``: its version is the
    ordinal of the last change of that transaction committed to the table in pieces."""
    return f"{app_id}#piece:{format_lsn(end_lsn)}"
