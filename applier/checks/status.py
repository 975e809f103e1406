"""``status``: where each mirrored table is (applied LSN, last commit, rows) and how far the slot lags.

Everything shown is read from the authoritative places: each Delta table's log (its recorded
idempotent-write version is the end LSN it has applied) and the server's slot view. The log is read
with delta-rs, so ``status`` needs no JVM: rows are counted from the log's per-file statistics.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import psycopg

from applier.lsn import format_lsn, parse_lsn
from applier.sink.idempotence import source_commit_time_of
from applier.sink.naming import source_name_of
from applier.sink.spec import PROP_PUBLICATION, PROP_SOURCE, PROP_WIDENED, app_id_for
from applier.sink.store.picker import log_reader, logged_applied_version
from applier.storage.paths import TablePath

if TYPE_CHECKING:
    from applier.state import StateDir


@dataclass(frozen=True, slots=True)
class TableStatus:
    source_name: str
    path: str
    applied_lsn: int | None
    last_commit: str | None  # ISO timestamp of the newest Delta commit
    rows: int | None  # None when a writer left no row counts in the log
    widened: tuple[str, ...] = ()  # columns whose type was widened in place (the table needs type widening)
    reader_features: tuple[str, ...] = ()  # Delta reader features: a reader must support each to open it
    option_mismatches: tuple[str, ...] = ()  # configured table options the existing table does not have
    kind: str = "mirror"  # or 'history', 'changes': a table derived from the mirrored table's changes
    files: int | None = None  # data files of the newest version
    size_bytes: int | None = None  # their size
    #: the source commit time of the last transaction applied (ISO), from its Delta commit's userMetadata
    source_commit_time: str | None = None
    #: how long that transaction took to reach Delta: its Delta commit time minus its source commit time
    lag_seconds: float | None = None
    #: "published", or "not published since ..." (taken out of the publication: no longer followed); None:
    #: never marked (followed)
    publication: str | None = None
    #: its name in the catalog ``catalog:`` names (database.table; None: not registered there)
    catalog_name: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"table": self.source_name, "kind": self.kind, "path": self.path, "rows": self.rows,
                "last_commit": self.last_commit,
                "applied_lsn": format_lsn(self.applied_lsn) if self.applied_lsn is not None else None,
                "widened_columns": list(self.widened), "reader_features": list(self.reader_features),
                "option_mismatches": list(self.option_mismatches), "files": self.files,
                "size_bytes": self.size_bytes, "source_commit_time": self.source_commit_time,
                "lag_seconds": self.lag_seconds, "publication": self.publication,
                "catalog_name": self.catalog_name}


@dataclass(frozen=True, slots=True)
class SlotStatus:
    slot: str
    exists: bool
    active: bool = False
    confirmed_lsn: int | None = None
    server_lsn: int | None = None
    #: while a table sync's slot is being created (it waits for every open transaction): what it waits for
    sync_waits: tuple[str, ...] = ()
    wal_status: str | None = None  # reserved | extended | unreserved | lost (PostgreSQL 13+)
    safe_wal_size: int | None = None  # bytes until the slot exceeds max_slot_wal_keep_size; None: no limit
    failover: bool | None = None  # PostgreSQL 17+
    #: why the slot may lose WAL it still needs (source.wal_warning_bytes); None: safe
    risk: str | None = None
    #: the server is holding the slot's changes back for a standby: which standby slots, and why; None: not
    held_back: str | None = None
    #: the source is a standby (PostgreSQL 16+): ``server_lsn`` is what it has replayed
    standby: bool = False

    @property
    def lag_bytes(self) -> int | None:
        if self.confirmed_lsn is None or self.server_lsn is None:
            return None
        return max(self.server_lsn - self.confirmed_lsn, 0)

    def as_dict(self) -> dict[str, Any]:
        return {"slot": self.slot, "exists": self.exists, "active": self.active, "lag_bytes": self.lag_bytes,
                "confirmed_lsn": format_lsn(self.confirmed_lsn) if self.confirmed_lsn is not None else None,
                "server_lsn": format_lsn(self.server_lsn) if self.server_lsn is not None else None,
                "table_sync_waits_for": list(self.sync_waits), "wal_status": self.wal_status,
                "safe_wal_size": self.safe_wal_size, "failover": self.failover, "risk": self.risk,
                "held_back": self.held_back, "standby": self.standby}


def _app_id(kind: str, source: str) -> str:
    from applier.sink.derived import KINDS

    return next((k.app_id for k in KINDS if k.name == kind), app_id_for)(source)


def table_status(path: TablePath, *, expected_options: Any = None, kind: str = "mirror") -> TableStatus:
    """One table's status from its Delta log alone (delta-rs; no JVM, no data files read).

    ``expected_options`` (a ``TableOptions`` from the table's rule) adds the options the existing table
    lacks: they are applied only when a table is created, so a later config change shows up here."""
    store = log_reader(str(path))
    if store is None:  # an escaped name ('%' in the path): delta-rs cannot open it
        name = ".".join(source_name_of(path))
        return TableStatus(name, str(path), logged_applied_version(str(path), app_id_for(name)), None, None,
                           option_mismatches=("applied LSN read from the JSON log only; delta-rs cannot open a "
                                              "path holding '%'",))
    table = store.table_log(str(path), history=HISTORY_LOOKBACK)
    properties = dict(table.configuration)
    source = properties.get(PROP_SOURCE) or ".".join(source_name_of(path))
    applied = store.applied_version(str(path), _app_id(kind, source))
    history = list(table.history)
    last = history[0].get("timestamp") if history else None
    last_commit = (datetime.fromtimestamp(int(last) / 1000, tz=UTC).isoformat() if last is not None else None)
    source_time, lag = _source_commit(history)
    widened = tuple(json.loads(properties[PROP_WIDENED])) if PROP_WIDENED in properties else ()
    mismatches: tuple[str, ...] = ()
    if expected_options is not None:
        from applier.sink.spec import option_mismatches

        found = option_mismatches(properties, list(table.partition_columns), expected_options)
        if expected_options.cluster_by and "clustering" not in table.writer_features:
            found.append(f"cluster_by {list(expected_options.cluster_by)} configured, table is not clustered")
        mismatches = tuple(found)
    return TableStatus(source, str(path), applied, last_commit, table.files.rows, widened,
                       table.reader_features, mismatches, kind, table.files.count, table.files.size_bytes,
                       source_time.isoformat() if source_time is not None else None, lag,
                       properties.get(PROP_PUBLICATION))


#: Commits looked at, newest first, for the last one applier made (maintenance commits come between)
HISTORY_LOOKBACK = 20


def _source_commit(history: Sequence[Mapping[str, Any]]) -> tuple[datetime | None, float | None]:
    """The source commit time of the last transaction applied, and its Delta commit time minus it."""
    for commit in history:
        source_time = source_commit_time_of(commit.get("userMetadata"))
        if source_time is not None:
            committed = commit.get("timestamp")
            lag = max(int(committed) / 1000 - source_time.timestamp(), 0.0) if committed is not None else None
            return source_time, lag
    return None, None


def slot_status(dsn: str, slot: str, *, warn_below: int = 1 << 30) -> SlotStatus:
    """The slot's position, lag and WAL state (at risk when ``safe_wal_size`` is under ``warn_below``);
    and, while a table sync of this mirror creates its temporary slot (one with no confirmed position
    yet), the prepared and open transactions that creation waits for."""
    from applier.sources.heldback import holding_back
    from applier.sources.slothealth import read_slot_health
    from applier.sources.slots import slot_creation_blockers, sync_slot_prefix
    from applier.sources.sql_slot import SERVER_POSITION_SQL

    waits: tuple[str, ...] = ()
    held = None
    with psycopg.connect(dsn, autocommit=True) as conn:
        # the server's position: on a standby what it has replayed (pg_current_wal_lsn() is an error there)
        row = conn.execute(f"SELECT active, confirmed_flush_lsn::text, ({SERVER_POSITION_SQL})::text, "
                           "pg_is_in_recovery() FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
        creating = [str(r[0]) for r in conn.execute(
            "SELECT slot_name FROM pg_replication_slots WHERE confirmed_flush_lsn IS NULL AND slot_type = 'logical'")
            if str(r[0]).startswith(sync_slot_prefix(slot))]
        if creating:
            gids, running = slot_creation_blockers(conn)
            waits = tuple([f"prepared transaction {g}" for g in gids] + running)
        health = read_slot_health(conn, slot)
        if row is not None and row[2]:
            held = holding_back(conn, slot, parse_lsn(row[2]))
    if row is None or health is None:
        return SlotStatus(slot, False, sync_waits=waits)
    return SlotStatus(slot, True, bool(row[0]), parse_lsn(row[1]) if row[1] else None,
                      parse_lsn(row[2]) if row[2] else None, sync_waits=waits, wal_status=health.wal_status,
                      safe_wal_size=health.safe_wal_size, failover=health.failover, risk=health.risk(warn_below),
                      held_back=held.phrase() if held is not None else None, standby=bool(row[3]))


def status_json(tables: list[TableStatus], slot: SlotStatus | None, stops: Mapping[str, Any] | None = None,
                parked: Mapping[str, Any] | None = None, cut: Mapping[str, Any] | None = None) -> str:
    """``stops``: how the mirror's last runs stopped (applier.infra.stops; empty: the last run ended well);
    ``parked``: the tables set aside (applier.sink.parking), by name; ``cut``: the newest consistent cut
    (applier.checks.cuts.cut_status; None: none recorded)."""
    return json.dumps({"tables": [t.as_dict() for t in tables], "slot": slot.as_dict() if slot else None,
                       "stops": dict(stops or {}), "parked": dict(parked or {}),
                       "cut": dict(cut) if cut is not None else None})


@dataclass(frozen=True, slots=True)
class StatusReport:
    """What ``applier status`` shows, read once: its lines, ``--json`` and the status page all show this."""

    tables: list[TableStatus]
    slot: SlotStatus | None
    stops: Mapping[str, Any]  # applier.infra.stops.last_stops: how the last runs stopped (empty: well)
    parked: Mapping[str, Any]  # applier.sink.parking: the tables set aside, by name
    cut: Mapping[str, Any] | None  # applier.checks.cuts.cut_status of the newest cut (None: none recorded)

    def as_json(self) -> str:
        return status_json(self.tables, self.slot, self.stops, self.parked, self.cut)


def gather_status(target: str, state: StateDir, *, dsn: str | None, slot: str, warn_below: int,
                  paths: Iterable[TablePath] = (), options: Mapping[TablePath, Any] | None = None) -> StatusReport:
    """Every table under ``target`` (and ``paths``: tables a config's rules put elsewhere, checked against
    ``options``), its history and change-feed tables and the retired ones; with a ``dsn`` the slot."""
    from applier.checks.cuts import cut_status, newest_cut
    from applier.infra.stops import last_stops
    from applier.sink.catalogs import STATE_KEY as CATALOG_STATE_KEY
    from applier.sink.derived import derived_table_dirs
    from applier.sink.naming import mirrored_table_dirs, retired_table_dirs
    from applier.sink.parking import ParkedTables

    listed = sorted(set(paths) | set(mirrored_table_dirs(target)))  # and tables created since
    tables = [table_status(p, expected_options=(options or {}).get(p)) for p in listed]
    tables += [table_status(p, kind=kind.name) for kind, p in derived_table_dirs(target)]
    # dropped in Postgres while a new table took the name: kept apart, no longer followed
    tables += [table_status(p, kind="retired") for p in retired_table_dirs(target)]
    registered = {path: name for name, path in (state.load(CATALOG_STATE_KEY) or {}).items()}
    if registered:
        tables = [replace(t, catalog_name=registered.get(str(t.path))) for t in tables]
    newest = newest_cut(str(target))
    return StatusReport(tables, slot_status(dsn, slot, warn_below=warn_below) if dsn is not None else None,
                        last_stops(state), ParkedTables(state).entries(),
                        cut_status(newest) if newest is not None else None)


def stops_line(stops: Mapping[str, Any]) -> str | None:
    """One line on the mirror's last runs when they stopped on an error (None: the last run ended well)."""
    if not stops:
        return None
    table = f" on {stops['table']}" if stops.get("table") else ""
    runs = int(stops.get("count", 1))
    what = "the last run stopped" if runs == 1 else f"STALLED: the last {runs} runs stopped"
    return (f"mirror: {what} with {stops.get('error')}{table} (since {stops.get('since')}, last {stops.get('last')}): "
            f"{stops.get('message')}")


