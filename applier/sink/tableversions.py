"""Each table's Delta version and applied LSN as this target's runs left them (``<state>/table_versions.json``),
checked before a run writes: a table whose Delta history went backwards stops the run (issue 77, case 4).

Why: the Delta log is the record of what a table has applied (its ``txn`` version is the end LSN of the
last transaction in it), and a run goes on from there. A table whose newest commit files were deleted, or
whose directory was restored from a copy taken before a run, holds fewer transactions than that run
applied; the slot was confirmed past them (a replayed log moved on), so the next run carried on from the
slot with exit 0 and the lost transactions were gone for good (``verify`` found them). The table id is the
same (it is the same table, older), so the registry (applier.sink.registry) cannot tell.

What is recorded, and compared with each table's log before a run writes (both only ever go up):

* this file: at the end of every run that holds the target (``mirror``, ``replay``, ``resync``, the
  streaming sink; also after an error), per table path (relative to the target's root, so that a target
  moved with its state keeps its record: applier.state.stored_path): its Delta table id, version,
  applied LSN, and the position its copy was taken at (the state's ``copied_tables``, written by
  applier.drivers.tablesync);
* the newest consistent cut (applier.sink.cuts), for what a run recorded after this file was written
  (a run killed before its end): the version of each table that holds the cut.

A table found behind either raises ``TableBehindError`` (exit 2) with the way forward. Legitimate changes
never trip it: ``maintain`` only adds versions; a table copied anew (``resync``, a table sync, the slot's
new snapshot) has a new copy position, which resets its record and makes older cuts not apply to it; a
table replaced by another Delta table (a new table id: the registry's case) starts a record of its own; a
moved table (a rename, a retired table) has a record under its new path; a table whose copy is pending
(off ``copied_tables``: the next mirror copies it), a parked table and a table half moved by an
interrupted run are not checked. Removing a table's entry from this file accepts it as it is now.

Cost: one delta-rs open per table (its log since the last checkpoint, without a JVM) and one read of the
newest cut's row; paths delta-rs cannot open (a name holding '%') are not checked.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from applier.errors import TableBehindError
from applier.lsn import format_lsn, parse_lsn
from applier.sink.cuts import Cut, CutLog, CutTable
from applier.sink.identity import saved_bindings
from applier.sink.naming import source_name_of
from applier.sink.parking import STATE_KEY as PARKED_KEY
from applier.sink.pendingmove import RELATIONS_FILE
from applier.sink.spec import PROP_SOURCE, app_id_for
from applier.sink.store.picker import DELTARS
from applier.state import StateDir, resolved_path, stored_path
from applier.storage.paths import location

__all__ = ["FILE", "Behind", "LogEnd", "TableVersions", "read_log_end"]

log = logging.getLogger(__name__)

FILE = "table_versions"
#: the mirror's copied tables (applier.drivers.tablesync.STATE_KEY): name -> LSN its copy was taken at
COPIED_TABLES = "copied_tables"


@dataclass(frozen=True, slots=True)
class LogEnd:
    """A table's Delta log as it ends now."""

    table_id: str | None
    version: int
    applied: int | None  # the end LSN of the last transaction applied (its ``txn`` version)
    source: str  # schema.table of the source table (the ``applier.source`` property)


def read_log_end(path: str) -> LogEnd | None:
    """The log of the Delta table at ``path``; None when there is none, or delta-rs cannot read it (the
    registry reports a table gone; an unreadable log is reported by the engine that writes it)."""
    if not DELTARS.can_open(path) or not (location(path) / "_delta_log").is_dir():
        return None
    try:
        table = DELTARS.open(path)
        meta = table.metadata()
        source = dict(meta.configuration or {}).get(PROP_SOURCE) or ".".join(source_name_of(location(path)))
        applied = table.transaction_version(app_id_for(source))
        return LogEnd(str(meta.id), int(table.version()), int(applied) if applied is not None else None, source)
    except Exception as e:  # noqa: BLE001  # see the docstring
        log.debug("table_versions: %s not read: %s", path, e)
        return None


@dataclass(frozen=True, slots=True)
class Behind:
    """A table whose log ends before what was recorded for it."""

    path: str
    table: str
    relation_oid: int | None
    version: int
    applied: int | None
    recorded_version: int
    recorded_applied: int | None
    by: str  # what recorded it: "this target's state" or "the newest consistent cut (LSN ...)"

    def what(self) -> str:
        oid = f" (relation OID {self.relation_oid})" if self.relation_oid is not None else ""
        return f"table {self.table}{oid}"

    def found(self) -> str:
        applied = (f"transactions applied up to {format_lsn(self.applied)}" if self.applied is not None
                   else "no applied transaction recorded")
        return f"its Delta log ends at version {self.version}, with {applied}"

    def recorded(self) -> str:
        applied = (f" and transactions applied up to {format_lsn(self.recorded_applied)}"
                   if self.recorded_applied is not None else "")
        return f"{self.by} recorded version {self.recorded_version}{applied}"


@dataclass(slots=True)
class _Table:
    """One table path as a check or a record sees it."""

    path: str
    found: LogEnd | None  # its log now (None: gone or unreadable)
    entry: dict[str, Any] | None  # its entry in the file
    listed: bool = False  # one of the target's tables (the registry's, or bound to a live relation)
    keep: bool = True  # not checked, and its entry kept as it is (gone, unreadable, half moved, copy pending)
    parked: bool = False  # not checked (its changes are left out until a resync copies it anew)
    relation_oid: int | None = None
    copied_at: str | None = None  # the position its copy was taken at (``copied_tables``)
    version: int | None = None  # the highest version recorded for it
    applied: int | None = None  # the highest applied LSN recorded for it
    by: str = ""  # what recorded ``version``


def _key(path: str) -> str:
    return str(location(path))


def _max(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


class TableVersions:
    """The record of one target (see the module docstring)."""

    def __init__(self, state: StateDir, target_dir: str) -> None:
        self.state = state
        self.target_dir = str(target_dir)

    def _newest_cut(self) -> Cut | None:
        try:
            cuts = CutLog(self.target_dir)
            return cuts.newest() if cuts.usable else None
        except Exception as e:  # noqa: BLE001  # an unreadable cuts table: the cut recorder reports it
            log.debug("table_versions: the newest cut not read: %s", e)
            return None

    def _survey(self, registered: Iterable[str]) -> tuple[int | None, list[_Table]]:
        """The newest cut's LSN, and every table path (the registry's and the newest cut's) with its log
        and what is recorded for it."""
        saved: dict[str, Any] = self.state.load(FILE) or {}
        entries = {_key(resolved_path(self.target_dir, k)): v for k, v in (saved.get("tables") or {}).items()}
        copied: dict[str, str] | None = self.state.load(COPIED_TABLES)
        relations: dict[str, Any] = self.state.load(RELATIONS_FILE) or {}
        bindings = {_key(b.path): b for b in saved_bindings(relations, self.target_dir) if not b.retired}
        parked: dict[str, dict[str, Any]] = self.state.load(PARKED_KEY) or {}
        parked_oids = {e.get("oid") for e in parked.values() if e.get("oid") is not None}
        moving = relations.get("moving") or {}
        half_moved = {_key(resolved_path(self.target_dir, str(moving[k]))) for k in ("from", "to") if moving.get(k)}
        cut = self._newest_cut()
        recorded_cut = parse_lsn(saved["cut_lsn"]) if saved.get("cut_lsn") else None
        in_cut: dict[str, CutTable] = {}
        if cut is not None and (recorded_cut is None or recorded_cut < cut.lsn):  # recorded after this file
            in_cut = {_key(t.location(self.target_dir)): t for t in cut.tables if t.kind == "mirror"}
        registered_keys = {_key(p) for p in registered}
        out = []
        # the registry's tables, the cut's, and those of the relations followed (a rule's ``target`` puts
        # one elsewhere, where the registry does not look)
        for path in sorted(registered_keys | set(in_cut) | set(bindings)):
            table = _Table(path, None if path in half_moved else read_log_end(path), entries.get(path),
                           listed=path in registered_keys or path in bindings)
            out.append(table)
            found = table.found
            if found is None:
                continue
            binding = bindings.get(path)
            cut_table = in_cut.get(path)
            table.relation_oid = binding.oid if binding is not None else \
                cut_table.relation_oid if cut_table is not None else None
            table.copied_at = copied.get(found.source) if copied is not None else None
            if copied is not None and found.source not in copied:
                continue  # its copy is pending (a resync or a table sync cut short): the next mirror copies it
            table.keep = False
            table.parked = (binding is not None and binding.name in parked) or found.source in parked \
                or table.relation_oid in parked_oids
            entry = table.entry
            same = entry is not None and entry.get("id") == found.table_id and entry.get("copied_at") == table.copied_at
            if entry is not None and same:
                table.version = int(entry["version"])
                table.applied = parse_lsn(entry["applied_lsn"]) if entry.get("applied_lsn") else None
                table.by = "this target's state"
            if cut is not None and cut_table is not None and (same or not saved) \
                    and self._cut_holds(cut, cut_table, path, binding, table.copied_at, registered_keys) \
                    and (table.version is None or cut_table.version > table.version):
                table.version = cut_table.version
                table.by = f"the newest consistent cut (LSN {format_lsn(cut.lsn)})"
        return (cut.lsn if cut is not None else recorded_cut), out

    @staticmethod
    def _cut_holds(cut: Cut, table: CutTable, path: str, binding: Any, copied_at: str | None,
                   registered: set[str]) -> bool:
        """Whether the cut's version is one of the table now at ``path``: the same relation is bound there
        (a name taken by a new relation since is another table), and its copy is not newer than the cut."""
        if binding is not None:
            if binding.oid != table.relation_oid:
                return False
        elif path not in registered:
            return False
        return not copied_at or parse_lsn(copied_at) <= cut.lsn

    # --- the check and the record -------------------------------------------------------------------

    def behind(self, registered: Iterable[str]) -> list[Behind]:
        """Every table whose log ends before the version or the applied LSN recorded for it."""
        out = []
        for t in self._survey(registered)[1]:
            found = t.found
            if found is None or t.keep or t.parked or t.version is None:
                continue
            applied_behind = t.applied is not None and (found.applied is None or found.applied < t.applied)
            if found.version < t.version or applied_behind:
                out.append(Behind(t.path, found.source, t.relation_oid, found.version, found.applied, t.version,
                                  t.applied, t.by))
        return out

    def record(self, registered: Iterable[str]) -> None:
        """Write each table's version and applied LSN now, never lower than what was recorded for the same
        table (a table behind stays behind until it is copied anew, or its entry is removed)."""
        cut_lsn, surveyed = self._survey(registered)
        tables: dict[str, dict[str, Any]] = {}
        for t in surveyed:
            if t.found is None or t.keep:
                if t.entry is not None and t.listed:  # (a path no table has any more is forgotten)
                    tables[t.path] = t.entry
                continue
            applied = _max(t.found.applied, t.applied)
            tables[t.path] = {"table": t.found.source, "id": t.found.table_id, "copied_at": t.copied_at,
                              "version": max(t.found.version, t.version if t.version is not None else -1),
                              "applied_lsn": format_lsn(applied) if applied is not None else None}
        self.state.save(FILE, {"cut_lsn": format_lsn(cut_lsn) if cut_lsn is not None else None,
                               "tables": {stored_path(self.target_dir, k): v for k, v in tables.items()}})

    # --- what a person is told ----------------------------------------------------------------------

    def error(self, behind: list[Behind], command: str, config_file: str | None = None) -> TableBehindError:
        first = behind[0]
        others = "".join(f"; also {b.what()}: {b.found()}, but {b.recorded()}" for b in behind[1:])
        names = " ".join(f"--table {b.table}" for b in behind)
        file = self.state.root / f"{FILE}.json"
        paths = ", ".join(f'"{stored_path(self.target_dir, b.path)}"' for b in behind)
        if command == "replay":
            lost = "the log replayed into it went on past them"
            how = (f"Rebuild it: delete its directory and its entry in {self.state.root / 'tables.json'}, and "
                   "`applier replay` a log that starts before the table's first change (the other tables skip "
                   f"what they hold); or remove its entry ({paths}) from {file} and replay a log that starts "
                   "before the applied LSN found (the table applies again what it lacks)")
        elif command == "resync":
            lost = "the slot was confirmed past them"
            how = ("Unless this resync copies it, the next `applier mirror` stops on it (exit 2); "
                   f"`applier resync {names}` copies it anew")
        else:
            lost = "the slot was confirmed past them, so no run brings them back"
            config = f"--config {config_file}" if config_file else "--config FILE"
            how = (f"Copy it again from Postgres at a new position: `applier resync {config} {names}` (with this "
                   "mirror's config, or its --dsn/--slot/--publication/--target flags), then run `applier mirror` "
                   "again, which follows it from there; or, to keep it as it is (what it lost stays lost), remove "
                   f"its entry ({paths}) from {file}")
        return TableBehindError(
            f"{first.what()} went back in its Delta history: {first.found()}, but {first.recorded()} (its newest "
            f"commit files were deleted, or its directory was restored from an older copy){others}. The "
            f"transactions in between are gone from it, and {lost}. {how}",
            table=first.table, relation_oid=first.relation_oid, path=first.path, version=first.version,
            recorded_version=first.recorded_version,
            applied_lsn=first.applied, recorded_lsn=first.recorded_applied)
