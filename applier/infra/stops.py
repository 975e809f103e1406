"""The mirror's record of how its runs stopped: the same error N runs in a row is a stall, not an outage.

Why: a supervisor restarts a mirror that exits 3, and a person looks at one that exits 4; neither can
tell from one exit that every run for a day has stopped on the same table. The record (in the state
directory, ``stops``) says which error stopped the last runs, on which table, since when and how many
times in a row; a run that ends well clears it. ``applier status`` and the metrics show it.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from applier.state import StateDir

STATE_KEY = "stops"
MENDS_KEY = "mends"
#: mends kept for ``applier status`` (the newest)
MENDS_KEPT = 20


def record_stop(state: StateDir, error: BaseException) -> int:
    """Note that a run stopped on ``error``; returns how many runs in a row stopped on it (the same kind
    of error on the same table)."""
    context = getattr(error, "context", {}) or {}
    kind, table = type(error).__name__, str(context.get("table") or context.get("relation") or "")
    previous: dict[str, Any] = state.load(STATE_KEY) or {}
    now = datetime.now(UTC).isoformat(timespec="seconds")
    message = str(error).splitlines()[0][:500] if str(error) else kind
    shape = message_shape(message)
    same = previous.get("error") == kind and previous.get("table") == table \
        and previous.get("shape", shape) == shape  # (a record from before shapes were kept: by kind and table)
    count = int(previous.get("count", 0)) + 1 if same else 1
    state.save(STATE_KEY, {"error": kind, "table": table, "message": message, "shape": shape, "count": count,
                           "since": previous.get("since") if same else now, "last": now})
    return count


#: what varies between two stops on the same error: LSNs, numbers, times, quoted values
_VARYING = re.compile(r"\b[0-9A-F]+/[0-9A-F]+\b|\d+(?:[.:-]\d+)*|'[^']*'")


def message_shape(message: str) -> str:
    """``message`` with what varies from run to run (LSNs, counts, times, quoted values) taken out: two
    stops are the same error when their shapes are equal ("connection refused" and "password authentication
    failed" are both SourceError without a table, and were counted as one stall)."""
    return _VARYING.sub("#", message)[:300]


def clear_stops(state: StateDir) -> None:
    """A run ended well: no stall."""
    if state.load(STATE_KEY):
        state.save(STATE_KEY, {})


def last_stops(state: StateDir) -> dict[str, Any]:
    """The record (empty when the last run ended well): error, table, message, count, since, last."""
    return dict(state.load(STATE_KEY) or {})


def record_mend(state: StateDir, tables: str, how: str, error: str) -> None:
    """Note that the mirror mended a table by itself (copied again, or set aside as dropped), for ``applier
    status``: a mirror nobody watches must still say what it did."""
    previous: dict[str, Any] = state.load(MENDS_KEY) or {}
    now = datetime.now(UTC).isoformat(timespec="seconds")
    recent = [*previous.get("recent", []), {"tables": tables, "how": how, "error": error[:500], "at": now}]
    state.save(MENDS_KEY, {"count": int(previous.get("count", 0)) + 1, "recent": recent[-MENDS_KEPT:]})


def mends(state: StateDir) -> dict[str, Any]:
    """What the mirror mended by itself: count (since the target was made) and recent (the newest first)."""
    record = dict(state.load(MENDS_KEY) or {})
    record["recent"] = list(reversed(record.get("recent", [])))
    return record
