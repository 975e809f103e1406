"""Consistent cuts: after every group, the Delta version of each table that holds exactly the source
transactions up to the group's end LSN.

Why: a source transaction that writes two tables lands as two Delta commits, so a reader that reads
the newest version of each table while a group commits can see half of it (an order without its
lines). The loop commits groups in source commit order and knows when every table of a group has
committed; recording then, per table, the version that holds the group gives readers a set of
versions that is exactly what Postgres had at that commit LSN (``DeltaTable(path, version=v)``,
Spark's ``versionAsOf``).

The record is a Delta table beside the tables, ``<target>/_applier/cuts`` (on the target itself, also
for an object store, whose state directory is local: a reader of the target needs it), so that any
engine reads it. One row per cut, appended in one commit (by delta-rs; on a local target, after its
first append, by applier itself: CutLog._append_local; never by Spark) tagged with the
``txn`` app id ``applier.cuts`` and the cut's LSN: a run after a crash between the tables' commits and
the cut re-applies nothing, finds the cut missing and writes it, once.

Which version: the version of a table's commit in the group is read from its log once the group is
committed (only the log since the last checkpoint, no file list); a table the group did not write keeps
the version known before (read once, when it is first needed). Maintenance commits (OPTIMIZE, VACUUM)
change the version but not the rows: an older version still reads the same rows until it is vacuumed.
A table whose applied LSN is past the group's end (a table copied at a newer position, or a group that
ends earlier than the one a crashed run committed) has no version holding exactly the cut: it is left
out of that cut, never given a wrong version.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from applier.lsn import format_lsn
from applier.sink.store.dvlog import log_identity, still_at
from applier.sink.store.dvmerge import CHECKPOINT_INTERVAL, local_root
from applier.sink.store.picker import DELTARS
from applier.storage.location import join

if TYPE_CHECKING:
    import pyarrow as pa

    from applier.sink.engine import DeltaApplier
    from applier.sink.parking import ParkedTables

log = logging.getLogger(__name__)

#: the ``txn`` app id of the cuts table's appends: its version is the newest cut's LSN
CUTS_APP_ID = "applier.cuts"
#: how long cuts are kept when maintenance has no retention of its own: Delta's default
#: ``delta.deletedFileRetentionDuration`` (7 days), what VACUUM keeps the versions of
DEFAULT_RETENTION_HOURS = 168
#: appends between two compactions of the cuts table (one small file per cut otherwise)
COMPACT_EVERY = 100
#: table kinds a cut lists: the mirrored table, its history (SCD 2) and its change feed table
KINDS = ("mirror", "history", "changes")


def cuts_path(target_dir: str) -> str:
    """``<target>/_applier/cuts``: on the target, whatever ``target.state_dir`` says."""
    return join(target_dir, "_applier", "cuts")


def relative_to(target_dir: str, path: str) -> str:
    """``path`` relative to the target when it lies under it (a cut stays true when the target is
    copied or mounted elsewhere), else as it is (a rule's own ``target``)."""
    base = str(target_dir).rstrip("/") + "/"
    return path[len(base):] if str(path).startswith(base) else str(path)


@dataclass(frozen=True, slots=True)
class CutTable:
    """One table's place in a cut."""

    relation_oid: int  # the source relation: a table is its relation, whatever it is called now
    name: str  # schema.table as the mirror last followed it
    path: str  # relative to the target (see ``relative_to``)
    kind: str  # mirror | history | changes
    version: int  # the Delta version holding exactly the cut's transactions
    table_id: str | None = None  # its Delta table id (metaData.id); None: recorded before cuts held ids

    def location(self, target_dir: str) -> str:
        """The table's path: under ``target_dir`` unless recorded as an absolute path or URI."""
        if self.path.startswith("/") or "://" in self.path:
            return self.path
        return join(target_dir, self.path)

    def as_dict(self) -> dict[str, Any]:
        return {"relation_oid": self.relation_oid, "table": self.name, "kind": self.kind, "path": self.path,
                "version": self.version, "table_id": self.table_id}


@dataclass(frozen=True, slots=True)
class Cut:
    """Every listed table as Postgres had it once the transaction ending at ``lsn`` committed."""

    lsn: int  # end LSN of the group's last transaction
    commit_time: datetime | None  # its source commit time (None: not known, a catch-up folded on executors)
    recorded_at: datetime
    tables: tuple[CutTable, ...]
    cut_id: str | None = None  # a UUID of its own; None: recorded before cuts had ids

    def table(self, name: str) -> CutTable | None:
        """The mirrored table called ``name`` (schema.table), or the table (of any kind) at path ``name``
        relative to the target."""
        return next((t for t in self.tables if (t.kind == "mirror" and t.name == name) or t.path == name), None)

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.cut_id, "lsn": format_lsn(self.lsn),
                "commit_time": self.commit_time.isoformat() if self.commit_time is not None else None,
                "recorded_at": self.recorded_at.isoformat(), "tables": [t.as_dict() for t in self.tables]}


def cut_schema() -> pa.Schema:
    import pyarrow as pa

    # (the ids last, in the table and in its struct: where a cuts table written before them gets them)
    table = pa.struct([pa.field("relation_oid", pa.int64()), pa.field("table", pa.string()),
                       pa.field("kind", pa.string()), pa.field("path", pa.string()),
                       pa.field("version", pa.int64()), pa.field("table_id", pa.string())])
    return pa.schema([pa.field("lsn", pa.string()), pa.field("lsn_value", pa.int64()),
                      pa.field("commit_time", pa.timestamp("us", tz="UTC")),
                      pa.field("recorded_at", pa.timestamp("us", tz="UTC")),
                      pa.field("tables", pa.list_(table)), pa.field("cut_id", pa.string())])


def cut_to_arrow(cut: Cut) -> pa.Table:
    import pyarrow as pa

    tables = [{"relation_oid": t.relation_oid, "table": t.name, "kind": t.kind, "path": t.path,
               "version": t.version, "table_id": t.table_id} for t in cut.tables]
    return pa.Table.from_pylist([{"lsn": format_lsn(cut.lsn), "lsn_value": cut.lsn, "commit_time": cut.commit_time,
                                  "recorded_at": cut.recorded_at, "tables": tables, "cut_id": cut.cut_id}],
                                schema=cut_schema())


def cuts_from_rows(rows: Sequence[Mapping[str, Any]]) -> list[Cut]:
    """Cuts from the cuts table's rows (``pa.Table.to_pylist``), oldest first."""
    cuts = [Cut(int(r["lsn_value"]), _utc(r.get("commit_time")), _utc(r["recorded_at"]) or datetime.now(UTC),
                tuple(CutTable(int(t["relation_oid"]), str(t["table"]), str(t["path"]), str(t["kind"]),
                               int(t["version"]), t.get("table_id")) for t in r.get("tables") or ()),
                r.get("cut_id"))
            for r in rows]
    return sorted(cuts, key=lambda c: c.lsn)


def _utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


class CutLog:
    """The cuts table of one target. Written without Spark (delta-rs, and applier's own appends): a target
    delta-rs cannot open (a directory name holding '%' or '[') records no cuts, and says so once."""

    def __init__(self, target_dir: str) -> None:
        self.target_dir = str(target_dir)
        self.path = cuts_path(self.target_dir)
        self.usable = DELTARS.can_open(self.path)
        self._newest: int | None = None
        self._read = False
        self._handle: Any = None  # the cuts table as delta-rs's last append left it
        self._root = local_root(self.path) if self.usable else None  # (None: an object store)
        self._known: tuple[int, tuple[int, int] | None] | None = None  # the version appended last, its log
        self._appended = 0

    def exists(self) -> bool:
        return self.usable and DELTARS.exists(self.path)

    def newest_lsn(self) -> int | None:
        """The newest cut's LSN (the ``txn`` version of its append; read once, then tracked)."""
        if not self._read:
            self._newest = DELTARS.applied_version(self.path, CUTS_APP_ID) if self.exists() else None
            self._read = True
        return self._newest

    def append(self, cut: Cut) -> bool:
        """Record ``cut``, unless a cut at or after its LSN is recorded (a re-run): False then."""
        newest = self.newest_lsn()
        if newest is not None and cut.lsn <= newest:
            return False
        from applier.sink.conflicts import retry_on_conflict

        tag = (CUTS_APP_ID, cut.lsn, f"cut lsn={format_lsn(cut.lsn)} tables={len(cut.tables)}")
        data = cut_to_arrow(cut)

        def append() -> None:
            try:
                if not self._append_local(data, tag):
                    self._handle = DELTARS.append_through(self._handle, self.path, data, tag=tag)
                    self._known = (int(self._handle.version()), log_identity(self._root)) \
                        if self._root is not None else None
            except BaseException:
                self._handle = self._known = None  # a conflict (maintain pruned): opened again by the retry
                raise
        retry_on_conflict(append, table="_applier/cuts")
        self._newest = cut.lsn
        self._appended += 1
        if self._appended % COMPACT_EVERY == 0:
            self._compact()
        return True

    def _append_local(self, data: pa.Table, tag: tuple[str, int, str]) -> bool:
        """Append a cut's row to a local table without delta-rs (applier.sink.store.dvcommit.append_file,
        a few ms where delta-rs's append took 20-60 ms after every group) when this log wrote its newest
        version and no one has committed since: False otherwise (delta-rs appends, and its version is
        the next one's start). A checkpoint every ``CHECKPOINT_INTERVAL`` versions, as delta-rs's
        appends take them."""
        from applier.sink.store.dvcommit import append_file

        if self._known is None or self._root is None:
            return False
        version, identity = self._known
        if not still_at(self._root, version, identity):
            self._handle = self._known = None  # another writer's commit, or a table made anew: delta-rs reads it
            return False
        app_id, lsn, description = tag
        append_file(self._root, version + 1, data, app_id=app_id, app_version=lsn, description=description)
        self._known = (version + 1, identity)
        if (version + 1) % CHECKPOINT_INTERVAL == 0:
            handle = self._handle if self._handle is not None else DELTARS.open(self.path)
            handle.update_incremental()
            handle.create_checkpoint()
            self._handle = handle
        return True

    def _compact(self) -> None:
        """One file per cut makes every append slower (delta-rs's snapshot holds each file): the cuts are
        compacted every ``COMPACT_EVERY`` appends, as ``applier maintain`` does too. A compaction that
        loses a race with ``maintain`` is left to the next one."""
        from applier.sink.store.deltars import commit_failed_error

        try:
            DELTARS.optimize(self.path, [], None)
        except commit_failed_error() as e:
            log.debug("compacting %s lost a race (%s); the next one does it", self.path, e)
        self._handle = self._known = None

    def cuts(self) -> list[Cut]:
        """Every recorded cut, oldest first (none when the table does not exist)."""
        if not self.exists():
            return []
        # batch by batch: ``to_pyarrow_table()`` (a dataset's to_table) leaves a scan thread that aborts the
        # process at its exit now and then ("terminate called without an active exception", delta-io/delta-rs
        # #2184): ``applier status`` died with 134 after printing its report
        dataset = DELTARS.open(self.path).to_pyarrow_dataset()
        return cuts_from_rows([row for batch in dataset.to_batches() for row in batch.to_pylist()])

    def newest(self) -> Cut | None:
        """The newest cut (None: none recorded), read alone: its LSN is the ``txn`` version of its append,
        and only the rows at that LSN are read (``cuts`` reads every cut kept, a week's by default)."""
        if not self.exists():
            return None
        table = DELTARS.open(self.path)
        lsn = table.transaction_version(CUTS_APP_ID)
        if lsn is None:
            return None
        import pyarrow.dataset as ds  # here: its import loads pandas (0.25 s), which a first copy never needs

        dataset = table.to_pyarrow_dataset()
        rows = [row for batch in dataset.to_batches(filter=ds.field("lsn_value") == lsn) for row in batch.to_pylist()]
        found = cuts_from_rows(rows)
        if not found:  # (a cut table written otherwise than by CutLog: every row read)
            every = self.cuts()
            return every[-1] if every else None
        return found[-1]

    def prune(self, retention_hours: float, *, dry_run: bool = False, now: datetime | None = None) -> int:
        """Delete the cuts recorded more than ``retention_hours`` ago (their tables' versions are what a
        VACUUM with that retention may delete), but never the newest one; returns how many."""
        if not self.exists():
            return 0
        horizon = (now or datetime.now(UTC)) - timedelta(hours=retention_hours)
        cuts = self.cuts()
        if len(cuts) < 2:
            return 0
        newest = cuts[-1].lsn
        old = [c for c in cuts if c.recorded_at < horizon and c.lsn != newest]
        if old and not dry_run:
            from applier.sink.conflicts import retry_on_conflict

            # cuts are appended in LSN order as time goes on: the old ones are the oldest LSNs
            predicate = f"lsn_value <= {max(c.lsn for c in old)}"
            retry_on_conflict(lambda: DELTARS.open(self.path).delete(predicate), table="_applier/cuts")
        return len(old)


class CutRecorder:
    """Records a cut after each group of one ``DeltaApplier`` (applier.loop calls ``record``)."""

    def __init__(self, applier: DeltaApplier, target_dir: str, parked: ParkedTables | None = None) -> None:
        self.applier = applier
        self.log = CutLog(target_dir)
        self.parked = parked
        self._warned = False

    def record(self, end: int, commit_time: datetime | None) -> Cut | None:
        """The cut at ``end``, recorded (None: recorded already, by this run or before a crash)."""
        if not self.log.usable:
            if not self._warned:
                log.warning("no consistent cuts are recorded for %s: delta-rs cannot open its path",
                            self.log.target_dir)
                self._warned = True
            return None
        newest = self.log.newest_lsn()
        if newest is not None and end <= newest:
            return None
        cut = Cut(end, commit_time, datetime.now(UTC), tuple(self._tables(end)), str(uuid.uuid4()))
        self.log.append(cut)
        return cut

    def _tables(self, end: int) -> Iterator[CutTable]:
        applier, target = self.applier, self.log.target_dir
        ids = applier.identities
        if ids is None:
            return
        parked = self.parked.entries() if self.parked is not None else {}
        parked_oids = {e.get("oid") for e in parked.values()}
        for bound in ids.live():
            if bound.name in parked or bound.oid in parked_oids:
                continue  # its changes are left out: its table holds no cut
            applied = applier.applied_lsn(bound.path, bound.name)
            if applied is None or applied > end:
                continue  # no table yet, or ahead of the cut (see the module's docstring)
            yield CutTable(bound.oid, bound.name, relative_to(target, bound.path), "mirror",
                           applier.table_version(bound.path), applier.table_id(bound.path))
            for kind, path, done in applier.derived_tables(bound.name):
                if done is not None and done <= end:
                    yield CutTable(bound.oid, bound.name, relative_to(target, path), kind, applier.table_version(path),
                                   applier.table_id(path))
