"""``status``: where each mirrored table is (applied LSN, last commit, rows) and how far the slot lags.

Everything shown is read from the authoritative places: each Delta table's log (its recorded
idempotent-write version is the end LSN it has applied) and the server's slot view.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg

from applier.lsn import format_lsn, parse_lsn
from applier.sink.idempotence import app_id_for, applied_version
from applier.sink.naming import source_name_of
from applier.sink.schema import PROP_SOURCE

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass(frozen=True, slots=True)
class TableStatus:
    source_name: str
    path: str
    applied_lsn: int | None
    last_commit: str | None  # ISO timestamp of the newest Delta commit
    rows: int

    def as_dict(self) -> dict[str, Any]:
        return {"table": self.source_name, "path": self.path, "rows": self.rows, "last_commit": self.last_commit,
                "applied_lsn": format_lsn(self.applied_lsn) if self.applied_lsn is not None else None}


@dataclass(frozen=True, slots=True)
class SlotStatus:
    slot: str
    exists: bool
    active: bool = False
    confirmed_lsn: int | None = None
    server_lsn: int | None = None

    @property
    def lag_bytes(self) -> int | None:
        if self.confirmed_lsn is None or self.server_lsn is None:
            return None
        return max(self.server_lsn - self.confirmed_lsn, 0)

    def as_dict(self) -> dict[str, Any]:
        return {"slot": self.slot, "exists": self.exists, "active": self.active, "lag_bytes": self.lag_bytes,
                "confirmed_lsn": format_lsn(self.confirmed_lsn) if self.confirmed_lsn is not None else None,
                "server_lsn": format_lsn(self.server_lsn) if self.server_lsn is not None else None}


def table_status(spark: SparkSession, path: Path) -> TableStatus:
    from delta.tables import DeltaTable

    table = DeltaTable.forPath(spark, str(path))
    detail = table.detail().first()
    properties = dict(detail["properties"]) if detail is not None else {}
    source = properties.get(PROP_SOURCE) or ".".join(source_name_of(path))
    last = table.history(1).select("timestamp").first()
    return TableStatus(source, str(path), applied_version(spark, str(path), app_id_for(source)),
                       last["timestamp"].isoformat() if last is not None else None,
                       spark.read.format("delta").load(str(path)).count())


def slot_status(dsn: str, slot: str) -> SlotStatus:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT active, confirmed_flush_lsn::text, pg_current_wal_lsn()::text "
                           "FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
    if row is None:
        return SlotStatus(slot, False)
    return SlotStatus(slot, True, bool(row[0]), parse_lsn(row[1]) if row[1] else None, parse_lsn(row[2]))


def status_json(tables: list[TableStatus], slot: SlotStatus | None) -> str:
    return json.dumps({"tables": [t.as_dict() for t in tables], "slot": slot.as_dict() if slot else None})
