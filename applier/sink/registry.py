"""Which Delta tables this target's runs wrote, by path and Delta table id (``<state>/tables.json``).

Why: the Delta tables are the record of what is applied. A table directory deleted between two
runs made the next run recreate it from the later changes only (1 of 100 rows, exit 0), and a
directory replaced by another Delta table (a restore from the wrong backup, another job's table)
would be merged into as if it were ours. Both are caught by remembering, per table, the Delta
table id (``metaData.id``, fixed when a table is created) when a run first sees it, and checking
every remembered table before a run writes anything. The id is read with delta-rs from the Delta
log alone, without Spark.

Paths are kept relative to the target's root (applier.state.stored_path), and the root the state was
last used with is kept beside them (``<state>/target.json``): a target copied, restored or moved to
another path with its state goes on there, and nothing is written under the old path. When the root
differs (the target moved, or a ``target.state_dir`` outside it now names another target), the check
below is what decides: every remembered table must be under the new root and be the same Delta table
(its id), else the run stops (exit 2) naming both roots, before anything is written anywhere.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from pathlib import Path

from applier.errors import InputError
from applier.sink.naming import mirrored_table_dirs, source_name_of
from applier.sink.pendingmove import interrupted_move
from applier.sink.store import reader
from applier.state import StateDir, resolved_path, same_location, stored_path
from applier.storage.paths import TablePath, location

__all__ = ["ROOT_FILE", "TargetRegistry", "TargetMissingError", "delta_table_id", "recorded_root"]

log = logging.getLogger(__name__)

_FILE = "tables"
#: ``<state>/target.json``: ``{"path": "<the target's root>"}``, as the last run that held the target had it
ROOT_FILE = "target"


def recorded_root(state: StateDir) -> str | None:
    """The target root the state was last used with (None: not recorded yet, or a state of format 1)."""
    saved = state.load(ROOT_FILE)
    return str(saved["path"]) if isinstance(saved, dict) and saved.get("path") else None


class TargetMissingError(InputError):
    """A table this target's runs wrote is gone, or is no longer the same Delta table."""


def delta_table_id(path: TablePath) -> str | None:
    """The Delta table id of ``path`` (None when it is no Delta table or cannot be read)."""
    if not (path / "_delta_log").is_dir():
        return None
    return reader(str(path)).table_id(str(path))


def _rebuild_advice(command: str, state: StateDir, name: str) -> str:
    if command in ("mirror", "resync"):
        how = (f"re-copy just this table: `applier resync --config FILE --table {name}` (it copies the table alone "
               "under a snapshot of its own; `applier mirror` then follows it from the stream); or re-copy every "
               "table: stop the mirror, drop its slot (SELECT pg_drop_replication_slot('<slot>')) and run "
               "`applier mirror` again")
    else:
        how = ("rebuild it: delete this table's directory and run `applier replay` with a log that starts "
               "before the table's first change (the other tables skip what they have)")
    return (f"{how}; or, to accept the table as it is now, remove the entry \"{name}\" from "
            f"{state.root / (_FILE + '.json')}")


class TargetRegistry:
    """``{path: {"table": "schema.name", "id": "<Delta table id>"}}`` for every table of the target (paths as
    they are under the target's root now; the file keeps them relative to it)."""

    def __init__(self, state: StateDir, target_dir: str | Path) -> None:
        self.state = state
        self.target_dir = str(target_dir)  # a local directory or an object-store URI (a Path folds s3://)
        self.entries: dict[str, dict[str, str | None]] = self._load()

    def _load(self) -> dict[str, dict[str, str | None]]:
        return {resolved_path(self.target_dir, k): v for k, v in (self.state.load(_FILE) or {}).items()}

    def _save(self) -> None:
        self.state.save(_FILE, {stored_path(self.target_dir, k): v for k, v in self.entries.items()})

    def check(self, command: str, *, mended: Collection[str] = ()) -> None:
        """Raise TargetMissingError for the first remembered table that is gone or was replaced. ``mended``:
        the tables (schema.table) this run copies anew (``applier resync --table``), which the stop names
        as the remedy: a gone or replaced one is forgotten here, and its copy is remembered when it ends.
        A target whose root is not the one the state was last used with is told of, and the same check
        (under the new root) decides whether it goes on (see the module docstring)."""
        was = recorded_root(self.state)
        moved = was is not None and not same_location(was, self.target_dir)
        if moved and self.entries:
            log.warning("the state %s was last used with the target at %s, and target.path is %s now: the "
                        "target's %d table(s) are taken from there (each must be the same Delta table), and nothing "
                        "is written under %s", self.state.root, was, self.target_dir, len(self.entries), was)
        moving_from = interrupted_move(self.state, self.target_dir)
        for path, entry in sorted(self.entries.items()):
            name = str(entry.get("table"))
            if path == moving_from:
                continue  # gone or half moved by a move a run began: the sink finishes and records it
            if name in mended and (not (location(path) / "_delta_log").is_dir()
                                   or delta_table_id(location(path)) != entry.get("id")):
                del self.entries[path]
                self._save()
                continue
            if not (location(path) / "_delta_log").is_dir():
                if moved:
                    raise self._elsewhere(str(was), name, path, "is not there")
                raise TargetMissingError(
                    f"table {name} was written by an earlier run but its directory is gone; its rows "
                    f"cannot come back from later changes alone. To {_rebuild_advice(command, self.state, name)}",
                    path=path)
            found = delta_table_id(location(path))
            if entry.get("id") and found and found != entry["id"]:
                if moved:
                    raise self._elsewhere(str(was), name, path, f"is another Delta table there (table id {found}, "
                                          f"not {entry['id']})")
                raise TargetMissingError(
                    f"table {name} is no longer the Delta table earlier runs wrote (its table id changed "
                    f"from {entry['id']} to {found}). To {_rebuild_advice(command, self.state, name)}",
                    path=path)

    def _elsewhere(self, was: str, name: str, path: str, what: str) -> TargetMissingError:
        """The stop for a target whose root changed and whose tables are not all under the new one."""
        return TargetMissingError(
            f"the state {self.state.root} was last used with the target at {was}, and target.path is "
            f"{self.target_dir} now, but table {name} of that target {what} ({path}); nothing was written, "
            f"under either path. If the target was moved, copied or restored to {self.target_dir}, bring all of "
            f"it (every table directory, and its _applier state directory unless target.state_dir is set) and "
            f"run again; if this state belongs to the target at {was}, set target.path back to {was}; a new "
            f"target at {self.target_dir} needs a state directory of its own (target.state_dir, empty) and a "
            "slot of its own", table=name, path=path, recorded_target=was, target=self.target_dir)

    def moved(self, src: str, dst: str | None) -> None:
        """The table at ``src`` was moved to ``dst`` by this mirror (a rename followed), or retired
        (``dst`` None: no longer one of the target's tables)."""
        self.entries = self._load()
        entry = self.entries.pop(src, None)
        if entry is not None and dst is not None:
            self.entries[dst] = {"table": ".".join(source_name_of(location(dst))), "id": entry.get("id")}
        self._save()

    def record(self, extra: list[TablePath] | None = None) -> None:
        """Remember every table now under the target (and ``extra`` paths), with its id (moves made
        during the run are in the file already: it is read again first), and the target's root."""
        self.entries = self._load()
        if recorded_root(self.state) != self.target_dir:
            self.state.save(ROOT_FILE, {"path": self.target_dir})
        changed = False
        for path in [*mirrored_table_dirs(self.target_dir), *(extra or [])]:
            key = str(path)
            table_id = delta_table_id(path)
            if table_id is None:
                continue
            entry = self.entries.get(key)
            if entry is None or entry.get("id") != table_id:
                self.entries[key] = {"table": ".".join(source_name_of(path)), "id": table_id}
                changed = True
        if changed:
            self._save()
