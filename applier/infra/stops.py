"""The mirror's record of how its runs stopped: the same error N runs in a row is a stall, not an outage.

Why: a supervisor restarts a mirror that exits 3, and a person looks at one that exits 4; neither can
tell from one exit that every run for a day has stopped on the same table. The record (in the state
directory, ``stops``) says which error stopped the last runs, on which table, since when and how many
times in a row; a run that ends well clears it. ``applier status`` and the metrics show it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from applier.state import StateDir

STATE_KEY = "stops"


def record_stop(state: StateDir, error: BaseException) -> int:
    """Note that a run stopped on ``error``; returns how many runs in a row stopped on it (the same kind
    of error on the same table)."""
    context = getattr(error, "context", {}) or {}
    kind, table = type(error).__name__, str(context.get("table") or context.get("relation") or "")
    previous: dict[str, Any] = state.load(STATE_KEY) or {}
    now = datetime.now(UTC).isoformat(timespec="seconds")
    same = previous.get("error") == kind and previous.get("table") == table
    count = int(previous.get("count", 0)) + 1 if same else 1
    state.save(STATE_KEY, {"error": kind, "table": table, "message": str(error).splitlines()[0][:500] if str(error)
                           else kind, "count": count, "since": previous.get("since") if same else now, "last": now})
    return count


def clear_stops(state: StateDir) -> None:
    """A run ended well: no stall."""
    if state.load(STATE_KEY):
        state.save(STATE_KEY, {})


def last_stops(state: StateDir) -> dict[str, Any]:
    """The record (empty when the last run ended well): error, table, message, count, since, last."""
    return dict(state.load(STATE_KEY) or {})
