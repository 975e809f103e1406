"""Can this raw log continue this target? Checked before ``replay`` writes anything.

Why: each table's applied position is the end LSN of the last transaction applied to it (Delta's
``txnVersion``), and ``replay`` skips every transaction at or below it as "already applied". That
is only true when the target was written from the same history as the log. Two cases are provable
from the log's transaction ends (the LSN of every Commit, Stream Commit, Commit Prepared, Prepare
and Rollback Prepared row is its transaction's end LSN) and stop the run:

* the table is **ahead of the log**: its position lies after the log's last transaction, so the
  whole log would be skipped as already applied although it never reached the table;
* the table holds a transaction **the log does not have**: its position lies inside the log's
  range but is no transaction end of the log (the target was written from another log, or from a
  damaged one).

A position before the log's first transaction is not an error (a log may be replayed in pieces),
but nothing proves that no transaction between them is missing; replay says so on stderr.
Positions are read with delta-rs from the tables' Delta logs, without Spark.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from applier.errors import InputError
from applier.lsn import format_lsn
from applier.sink.naming import mirrored_table_dirs, source_name_of
from applier.sink.spec import app_id_for
from applier.sink.store.picker import log_reader, logged_applied_version, logged_configuration
from applier.sources.rawlog import read_raw_log
from applier.storage.paths import TablePath

__all__ = ["PositionError", "check_log_continues_target"]

_ENDS = frozenset(b"CcKPpr")


class PositionError(InputError):
    """The target's applied position does not fit the raw log about to be replayed into it."""


@dataclass(frozen=True, slots=True)
class TablePosition:
    name: str
    path: TablePath
    applied: int


def table_positions(target_dir: str | Path) -> list[TablePosition]:
    """The applied position of every table under ``target_dir`` that has one."""
    out = []
    for path in mirrored_table_dirs(target_dir):
        store = log_reader(str(path))
        try:  # read from the log without a JVM: by delta-rs, or from the JSON commits of a table it cannot open
            if store is None:
                configuration, applied = logged_configuration(str(path)), logged_applied_version
            else:
                configuration, applied = store.configuration(str(path)), store.applied_version
            source = configuration.get("applier.source") or ".".join(source_name_of(path))
            version = applied(str(path), app_id_for(source))
        except Exception:  # noqa: BLE001  # unreadable here: Spark reports it when it writes
            continue
        if version is not None:
            out.append(TablePosition(source, path, int(version)))
    return out


def check_log_continues_target(target_dir: str | Path, log: str | Path) -> list[str]:
    """Raise PositionError when a table's position contradicts the log; return warnings otherwise."""
    positions = table_positions(target_dir)
    if not positions:
        return []
    wanted = {p.applied for p in positions}
    found: set[int] = set()
    first = last = None
    for msg in read_raw_log(log, check_order=False):
        if msg.data[:1] and msg.data[0] in _ENDS:
            first = msg.lsn if first is None else first
            last = msg.lsn
            if msg.lsn in wanted:
                found.add(msg.lsn)
    if first is None or last is None:
        return []
    warnings = []
    for p in positions:
        where = f"table {p.name} has transactions applied up to {format_lsn(p.applied)}"
        if p.applied > last:
            raise PositionError(
                f"{where}, after the end of this log ({format_lsn(last)}): the target is ahead of the log, "
                "so nothing in it would be applied. Replay a log that reaches the target's position, or "
                "rebuild the target from scratch (docs/guarantees.md: rebuild a table)", table=p.name, path=str(p.path))
        if p.applied >= first and p.applied not in found:
            raise PositionError(
                f"{where}, but no transaction of this log ends there: the target was written from another "
                "history than this log, and skipping what it 'already has' would leave wrong data. Rebuild "
                "the target from scratch (docs/guarantees.md: rebuild a table)", table=p.name, path=str(p.path))
        if p.applied < first:
            warnings.append(f"{where}; this log's first transaction ends at {format_lsn(first)}: nothing "
                            "shows whether transactions in between are missing")
    return warnings
