"""Reading a target at a consistent cut (applier.sink.cuts): which cut, and each table's version there.

What ``applier cut``, ``applier status`` and the Python API (``applier.cut``, ``applier.read_consistent``)
ask. Read with delta-rs (no JVM); a reader of another engine reads the same table,
``<target>/_applier/cuts``, and opens each table at its version (``DeltaTable(path, version=v)``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from applier.errors import ConfigError, CutTableReplacedError, NoCutError
from applier.lsn import format_lsn, parse_lsn
from applier.sink.cuts import Cut, CutLog, CutTable, cuts_path

if TYPE_CHECKING:
    from applier.spark.session import SparkLike

#: what a cut is asked for by: None (the newest), an LSN (int, or PostgreSQL's 'X/Y' text) or a time
At = int | str | datetime | None


def parse_at(at: At) -> int | datetime | None:
    """``at`` as an LSN (int) or an aware datetime (a naive one is taken as UTC): text 'X/Y' or digits is
    an LSN, ISO 8601 text a time."""
    if at is None or isinstance(at, int):
        return at
    if isinstance(at, datetime):
        return at if at.tzinfo is not None else at.replace(tzinfo=UTC)
    text = str(at).strip()
    if text.isdigit():
        return int(text)
    if "/" in text:
        try:
            return parse_lsn(text)
        except ValueError as e:
            raise ConfigError(f"not an LSN: {text!r} (PostgreSQL's form: 0/16B3748)") from e
    try:
        when = datetime.fromisoformat(text)
    except ValueError as e:
        raise ConfigError(f"neither an LSN (0/16B3748) nor an ISO 8601 time: {text!r}") from e
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def find_cut(target: str | Path, at: At = None) -> Cut:
    """The newest cut of ``target`` (with ``at``: the newest at or before that LSN, or whose source commit
    time is at or before that time). NoCutError when there is none."""
    where = parse_at(at)
    cuts = CutLog(str(target)).cuts()
    if isinstance(where, int):
        chosen = [c for c in cuts if c.lsn <= where]
        asked = f" at or before LSN {format_lsn(where)}"
    elif isinstance(where, datetime):
        chosen = [c for c in cuts if c.commit_time is not None and c.commit_time <= where]
        asked = f" with a source commit time at or before {where.isoformat()}"
    else:
        chosen, asked = cuts, ""
    if not chosen:
        oldest = f"; the oldest recorded is at LSN {format_lsn(cuts[0].lsn)}" if cuts else ""
        raise NoCutError(f"no consistent cut{asked} in {cuts_path(str(target))} (cuts are recorded after each "
                         f"group a mirror, replay or streaming sink applies){oldest}", target=str(target))
    return chosen[-1]


def newest_cut(target: str | Path) -> Cut | None:
    """The newest cut, or None (``status``)."""
    try:
        return find_cut(target)
    except NoCutError:
        return None


def table_at(cut: Cut, target: str | Path, table: str, spark: SparkLike | None = None) -> tuple[CutTable, str]:
    """The cut's entry for ``table`` (a mirrored table's schema.table, or any table's path relative to
    the target, e.g. ``_history/public/orders``) and its location. ConfigError when the cut lacks it;
    CutTableReplacedError when the table there now is not the one the cut recorded (its Delta table id)."""
    entry = cut.table(table)
    if entry is None:
        listed = ", ".join(sorted({t.name if t.kind == "mirror" else t.path for t in cut.tables})) or "none"
        raise ConfigError(f"{table} is not in the cut at LSN {format_lsn(cut.lsn)} (a table parked, ahead of the "
                          f"cut, or not mirrored; its tables: {listed})", table=table, target=str(target))
    where = entry.location(str(target))
    if entry.table_id is not None:
        from applier.sink.store.picker import reader

        now = reader(where, spark).table_id(where)  # (Spark only where delta-rs cannot open the path)
        if now != entry.table_id:
            raise CutTableReplacedError(
                f"{table} at {where} is not the Delta table the cut at LSN {format_lsn(cut.lsn)} recorded (table id "
                f"{entry.table_id}, now {now or 'no table'}): it was written anew since, and its version "
                f"{entry.version} holds other rows. Read it at a cut recorded after it was written (applier cut), "
                "or read the table the cut named where it went (a retired table: _retired/)", table=table,
                target=str(target), cut_id=cut.cut_id, recorded_table_id=entry.table_id, table_id=now)
    return entry, where


def cut_status(cut: Cut, now: datetime | None = None) -> dict[str, object]:
    """The newest cut as ``status`` shows it: its LSN, source commit time and age (now minus that time:
    how old the newest state a reader can read across tables is)."""
    age = None
    if cut.commit_time is not None:
        age = round(max(((now or datetime.now(UTC)) - cut.commit_time).total_seconds(), 0.0), 3)
    return {"id": cut.cut_id, "lsn": format_lsn(cut.lsn),
            "commit_time": cut.commit_time.isoformat() if cut.commit_time else None,
            "age_seconds": age, "recorded_at": cut.recorded_at.isoformat(), "tables": len(cut.tables)}
