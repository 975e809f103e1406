"""What a range of the log is, and what travels with it: the range itself (LogRange), an executor's
job (FoldJob) and result (RangeFold), and a range's messages read back (from its log files, or carried
inline for a live stream).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from applier.changes import SkippedTransaction
from applier.config import ApplySettings, TablesSettings
from applier.protocol.messages import LogicalMessage
from applier.sink.fold import FoldedTable
from applier.sources.rawlog import RawMessage, read_file_rows
from applier.storage.options import StorageOptions

#: One piece of a range: rows ``start:stop`` of one log file.
Segment = tuple[str, int, int]


@dataclass(frozen=True, slots=True)
class LogRange:
    """Consecutive messages of the log holding whole transactions, with the catalog at their start."""

    index: int
    segments: tuple[Segment, ...]
    catalog: dict[str, Any]
    messages: int
    first_lsn: int
    last_lsn: int
    relations: frozenset[tuple[str, str]] = frozenset()  # (namespace, name) described up to its end
    #: The messages themselves, (LSNs, datas), for a range read from a live stream (applier.drivers.backlog)
    #: rather than from log files: they travel to the executor inside its task.
    inline: tuple[list[int], list[bytes]] | None = None
    #: The bytes of its messages: the group's estimate of the row images it folds (apply.max_group_bytes_mb)
    size: int = 0


@dataclass(frozen=True, slots=True)
class FoldJob:
    """What an executor needs to fold one range: everything is in it (no session, no state dir)."""

    range: LogRange
    apply: ApplySettings
    tables: TablesSettings
    paths: dict[tuple[str, str], str]
    done: dict[str, int]  # table path -> end LSN it has applied
    #: the driver's explicit storage options (target.storage_options): the executor's process loaded no config
    storage: tuple[StorageOptions, ...] = ()
    #: table path -> the relation OID bound to it (applier.sink.identity): ranges are folded by name, and a
    #: name may lead to another relation's table (the fold then refuses it: ``misbound``)
    owners: dict[str, int] = field(default_factory=dict)

    def misbound(self, path: str, oid: int, qualified: str) -> str | None:
        """Why relation ``oid``'s changes, described as ``qualified``, cannot be folded for ``path``, or None.
        A table sync at the start of a run follows a rename, and gives a reused name to its new relation,
        from the catalog before the stream has described them (applier.drivers.tablesync): the changes
        from before the rename, under the old name, would meet the new table's copy position and be left
        out as applied. The driver path follows relations, not names."""
        owner = self.owners.get(path)
        if owner is None or owner == oid:
            return None
        return (f"{qualified} (relation OID {oid}) is a name the mirror has given to relation {owner} since (a "
                "rename, the name reused): folded on the driver, which follows relations")


@dataclass
class RangeFold:
    """An executor's result for one range."""

    index: int
    folded: list[FoldedTable] = field(default_factory=list)
    transactions: int = 0
    last_end_lsn: int | None = None
    last_commit_time: int | None = None  # PG clock (µs since 2000) of its last transaction: the cut's time
    messages: list[tuple[int, LogicalMessage]] = field(default_factory=list)
    skipped: list[SkippedTransaction] = field(default_factory=list)
    error: str | None = None  # the range failed: the driver path takes over from its start
    columnar: bool = False  # folded column by column (applier.drivers.executors.columnar)
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # of the task's process: below ``seconds`` when the task waited for a CPU


def merged_segments(segments: list[Segment]) -> Iterator[Segment]:
    """Adjacent pieces of one file as one."""
    current: Segment | None = None
    for file, start, stop in segments:
        if current is not None and current[0] == file and current[2] == start:
            current = (file, current[1], stop)
            continue
        if current is not None:
            yield current
        current = (file, start, stop)
    if current is not None:
        yield current


def range_messages(log_range: LogRange) -> Iterator[RawMessage]:
    if log_range.inline is not None:
        for lsn, data in zip(*log_range.inline, strict=True):
            yield RawMessage(lsn, None, data)  # type: ignore[arg-type]  # a live stream has no xid column
        return
    for file, start, stop in log_range.segments:
        yield from read_file_rows(file, start, stop)


def range_columns(log_range: LogRange) -> tuple[Sequence[int], Sequence[int | None] | None, Sequence[bytes]]:
    """A range's messages as columns (lsns, xids or None for a live stream's, datas), in memory: a
    range is at most ``partition_messages`` long, and the fold looks ahead to each Commit."""
    if log_range.inline is not None:
        return log_range.inline[0], None, log_range.inline[1]
    rows = list(range_messages(log_range))
    return [r.lsn for r in rows], [r.xid for r in rows], [r.data for r in rows]
