"""The live data files of a local Delta table at one version, as its log states them: every ``add``
action whole, with its statistics and its deletion vector.

Why not delta-rs's file list: ``DeltaTable.get_add_actions`` gives neither an add action's deletion
vector nor its statistics as written, and a commit that puts a deletion vector on a file must name the
one it replaces and carry the file's statistics on (applier.sink.store.dvmerge). The replay is the
protocol's: the newest checkpoint at or below the version, then the JSON commits after it, a file
identified by its path and its deletion vector's unique id.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from applier.errors import SinkError
from applier.sink.store.dvformat import descriptor_id

__all__ = ["LiveFile", "LogReplay", "live_files", "log_identity", "log_path", "still_at"]

_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(?:\.(\d{10})\.(\d{10}))?\.parquet$")
_ADD_FIELDS = ("path", "partitionValues", "size", "modificationTime", "dataChange", "stats", "tags",
               "deletionVector", "baseRowId", "defaultRowCommitVersion", "clusteringProvider")


@dataclass(frozen=True, slots=True)
class LiveFile:
    """One live data file: its ``add`` action as the log holds it (None-valued fields left out)."""

    add: dict[str, Any]

    @property
    def path(self) -> str:
        return str(self.add["path"])

    @property
    def deletion_vector(self) -> dict[str, Any] | None:
        return self.add.get("deletionVector")

    @property
    def stats(self) -> dict[str, Any]:
        """The file's statistics (``{}`` when the writer left none)."""
        raw = self.add.get("stats")
        return json.loads(raw) if raw else {}


def log_path(root: Path, version: int) -> Path:
    return root / "_delta_log" / f"{version:020d}.json"


def log_identity(root: Path) -> tuple[int, int] | None:
    """Which log this is: its first commit's file (inode, modification time in ns: a table created
    again has a new one even where the filesystem reuses the inode), or once a cleanup removed that,
    the log directory's inode; None without a log."""
    log = root / "_delta_log"
    try:
        first = log_path(root, 0).stat()
        return first.st_ino, first.st_mtime_ns
    except FileNotFoundError:
        pass
    try:
        return log.stat().st_ino, -1
    except FileNotFoundError:
        return None


def still_at(root: Path, version: int, identity: tuple[int, int] | None) -> bool:
    """Whether the table at ``root`` is still at ``version`` of the log ``identity`` names (what a writer
    recorded after its own commit): no entry after it, and not a log made anew, whose next version may
    be far below (an entry at ``version + 1`` there would leave a gap)."""
    return not log_path(root, version + 1).exists() and log_identity(root) == identity


def _key(action: dict[str, Any]) -> tuple[str, str | None]:
    dv = action.get("deletionVector")
    return str(action["path"]), (descriptor_id(dv) if dv else None)


def _checkpoint_files(log: Path, version: int) -> list[Path]:
    """The parts of the newest complete checkpoint at or below ``version`` (none: replay from 0)."""
    found: dict[int, dict[int, Path]] = {}
    wanted: dict[int, int] = {}
    for name in (p.name for p in log.iterdir()):
        m = _CHECKPOINT.match(name)
        if m is None or int(m.group(1)) > version:
            continue
        at = int(m.group(1))
        part, parts = (int(m.group(2)), int(m.group(3))) if m.group(2) else (1, 1)
        found.setdefault(at, {})[part] = log / name
        wanted[at] = parts
    for at in sorted(found, reverse=True):
        if len(found[at]) == wanted[at]:
            return [found[at][p] for p in sorted(found[at])]
    return []


def _checkpoint_adds(parts: list[Path]) -> dict[tuple[str, str | None], dict[str, Any]]:
    import pyarrow.parquet as pq

    files: dict[tuple[str, str | None], dict[str, Any]] = {}
    for part in parts:
        table = pq.read_table(part, columns=["add"])
        for add in table.column("add").to_pylist():
            if add is None:
                continue
            action = {k: add[k] for k in _ADD_FIELDS if add.get(k) is not None}
            for mapped in ("partitionValues", "tags"):  # a map reads as a list of pairs
                if isinstance(action.get(mapped), list):
                    action[mapped] = dict(action[mapped])
            action.setdefault("partitionValues", {})
            if "stats" not in action and add.get("stats_parsed") is not None:
                records = add["stats_parsed"].get("numRecords")
                if records is not None:
                    action["stats"] = json.dumps({"numRecords": records})
            if action.get("deletionVector") is not None:
                action["deletionVector"] = {k: v for k, v in action["deletionVector"].items() if v is not None}
            files[_key(action)] = action
    return files


class LogReplay:
    """One table's log replayed up to a version, and advanced from there: a run that commits to the table
    again and again reads only the commits since its last one (a checkpoint is read again only when the
    replay has to start over: an older version asked, a commit missing)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.version = -1
        self._files: dict[tuple[str, str | None], dict[str, Any]] = {}

    def files_at(self, version: int) -> list[LiveFile]:
        """The live data files at ``version``, in log order."""
        if 0 <= self.version <= version:
            try:
                self._replay(self.version + 1, version)
            except FileNotFoundError:
                self._load(version)
        else:
            self._load(version)
        return [LiveFile(a) for a in self._files.values()]

    def _load(self, version: int) -> None:
        parts = _checkpoint_files(self.root / "_delta_log", version)
        self._files = _checkpoint_adds(parts)
        self.version = int(_CHECKPOINT.match(parts[0].name).group(1)) if parts else -1  # type: ignore[union-attr]
        try:
            self._replay(self.version + 1, version)
        except FileNotFoundError as e:
            self.version = -1
            raise SinkError("the Delta log misses a commit between its checkpoint and its newest version",
                            path=str(self.root), missing=Path(str(e.filename)).name) from None

    def _replay(self, first: int, last: int) -> None:
        for v in range(first, last + 1):
            for line in log_path(self.root, v).read_text(encoding="utf-8").splitlines():
                if not line.strip():
                    continue
                action = json.loads(line)
                if "add" in action:
                    self._files[_key(action["add"])] = action["add"]
                elif "remove" in action:
                    self._files.pop(_key(action["remove"]), None)
            self.version = v


def live_files(root: Path, version: int) -> list[LiveFile]:
    """The data files of the table at ``root`` (a local directory) at ``version``, in log order."""
    return LogReplay(root).files_at(version)
