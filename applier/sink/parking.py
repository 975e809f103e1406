"""Parked tables (``apply.on_table_error: park``): a table the mirror cannot apply past a point is set
aside, and the other tables keep flowing.

Why: a mirror of 500 tables should not stop all of them for one. A table whose change cannot be applied
exactly (a retype Delta cannot widen, a diverged Delta table, a column rename no catalog can prove, a
key changed inside a transaction: each a ``ResyncNeededError``) is parked: its changes from then on are
left out of every group, its Delta table stays as it was (marked by nothing but this record: readers
see its last good state), and the slot moves on for the others. Nothing is lost for it: the only way
back is a fresh copy at a new position (``applier resync --table``), which holds every change the
parked stretch left out, and un-parks it. ``applier status`` lists parked tables and the metrics count
them. Kept in the state (``parked``), by relation OID when known and by name.
"""

from __future__ import annotations

from collections.abc import MutableSequence
from datetime import UTC, datetime
from typing import Any

from applier.catalog.batches import GroupedTransactions
from applier.errors import SinkError
from applier.state import StateDir

STATE_KEY = "parked"


class ParkedTables:
    """The parked tables of one target: name -> {oid, error, message, since}."""

    def __init__(self, state: StateDir) -> None:
        self.state = state
        self._tables: dict[str, dict[str, Any]] = dict(state.load(STATE_KEY) or {})

    def __bool__(self) -> bool:
        return bool(self._tables)

    def __len__(self) -> int:
        return len(self._tables)

    def entries(self) -> dict[str, dict[str, Any]]:
        return dict(self._tables)

    def reload(self) -> None:
        """Read the record again (another part of the run parked or released a table through its own)."""
        self._tables = dict(self.state.load(STATE_KEY) or {})

    def park(self, table: str, oid: int | None, error: BaseException | str, *, until: int | None = None) -> None:
        """Set ``table`` aside for ``error`` (or a reason, said as it is: a table set aside for good).

        ``until``: a relation Postgres dropped (set aside for good): only its changes in transactions ending
        at or before that LSN (the server's position when it was found gone, past its drop) are left out, and
        it is recorded under its name and OID, so that a new table of the same name is not (nor, far later, a
        relation that reuses the OID)."""
        kind, message = ("Gone", error) if isinstance(error, str) else (type(error).__name__, str(error))
        entry: dict[str, Any] = {"oid": oid, "error": kind, "message": message.splitlines()[0][:500],
                                 "since": datetime.now(UTC).isoformat(timespec="seconds")}
        if until is not None:
            entry["until"] = until
            table = f"{table} (relation OID {oid}, dropped)"
        self._tables[table] = entry
        self.state.save(STATE_KEY, self._tables)

    def release(self, table: str, oid: int | None = None) -> bool:
        """Un-park ``table`` (copied again); True when it was parked."""
        names = [n for n, e in self._tables.items() if n == table or (oid is not None and e.get("oid") == oid)]
        for name in names:
            del self._tables[name]
        if names:
            self.state.save(STATE_KEY, self._tables)
        return bool(names)

    def leave_out(self, transactions: GroupedTransactions) -> int:
        """Take the parked tables' changes out of a group, in place; returns how many batches were left out."""
        if not self._tables:
            return 0
        # by OID when it is known (a name may be a new table's since), by name otherwise
        until = {int(e["oid"]): int(e.get("until", 1 << 64)) for e in self._tables.values() if e.get("oid") is not None}
        names = {n for n, e in self._tables.items() if e.get("oid") is None}
        dropped = 0
        for end, batches in transactions:
            keep = [b for b in batches if not (end <= until.get(b.relation_oid, -1) or b.qualified_name in names)]
            if len(keep) != len(batches):
                if not isinstance(batches, MutableSequence):
                    raise SinkError("internal: a group's batches cannot be left out", end_lsn=end)
                dropped += len(batches) - len(keep)
                batches[:] = keep
        return dropped
