"""Combine the folds of consecutive ranges of one table's changes into the fold of the whole range.

Why: a distributed replay (applier.drivers.executors) folds each range of the log on an executor;
the driver commits the combination. The combination must equal what :func:`fold_changes` gives for
all the changes in one pass, value for value, and refuse what it refuses:

- a later fold's TRUNCATE wipes the earlier fold (the barrier is kept, with its flags);
- key-less tables add their signed counts;
- a keyed row of the later fold that still reads columns from "before it" (unchanged TOAST, or a
  soft-deleted row's other columns) reads them from the earlier fold's image of its lookup key
  when there is one, inheriting what that image itself still reads from the target; otherwise it
  keeps reading from the target;
- every key the later fold read from before it (``TablePlan.external``) must not be deleted or
  truncated away in the earlier fold: the one-pass fold raises the same errors there.

Every later entry is resolved against the earlier fold as it was before the later range, then
written: the later range's entries never see each other's effects twice.
"""

from __future__ import annotations

from applier.errors import SinkError
from applier.sink.columnfold import combine_keyed_columns
from applier.sink.plan import KeyedRow, TablePlan, _freeze_key
from applier.sink.rowimage import refusal, take_from_earlier

__all__ = ["combine_plans"]


def combine_plans(earlier: TablePlan, later: TablePlan) -> TablePlan:
    """``earlier`` updated in place to the fold of both ranges (and returned)."""
    if earlier.columns != later.columns or earlier.key_positions != later.key_positions:
        raise SinkError("folds of different table layouts cannot be combined (commit between them)")
    _check_external(earlier, later)
    earlier.changes += later.changes
    if later.truncated:
        earlier.truncated = True
        earlier.keyed = {}  # (and no columnar entries either)
        earlier.counts.clear()
        earlier.images.clear()
        earlier.restart_identity = earlier.restart_identity or later.restart_identity
        earlier.cascade = earlier.cascade or later.cascade
    if later.multiset:
        for image, n in later.counts.items():
            earlier.images.setdefault(image, later.images[image])
            earlier.counts[image] += n
        return earlier
    if later.columnar is not None and (earlier.columnar is not None or not earlier.keyed_count()):
        # both columnar (or nothing before): the entries stay Arrow columns (no entry of these reads
        # from before it, and none is external)
        both = later.columnar if earlier.columnar is None else combine_keyed_columns(earlier.columnar, later.columnar)
        if both is not None:
            earlier.columnar = both
            return earlier
    still_external = [e for e in later.external if e[0] not in earlier.keyed]
    resolved: dict[object, KeyedRow] = {}
    for key, entry in later.keyed.items():
        if entry.row is not None and entry.unresolved and not later.truncated:
            entry = _resolve(earlier, entry)
        resolved[key] = entry
    earlier.keyed.update(resolved)
    earlier.external.extend(still_external)
    return earlier


def _check_external(earlier: TablePlan, later: TablePlan) -> None:
    """Refuse what the one-pass fold refuses, with its message: a later row that reads from a row the
    earlier fold deleted or truncated away."""
    for key, reading in later.external:
        previous = earlier.keyed.get(key)
        reason = refusal(reading, deleted=previous is not None and previous.row is None,
                         truncated=previous is None and earlier.truncated)
        if reason is not None:
            raise SinkError(reason)


def _resolve(earlier: TablePlan, entry: KeyedRow) -> KeyedRow:
    """``entry``'s columns read from before it, taken from the earlier fold where it has the row."""
    assert entry.row is not None and entry.lookup_key is not None
    previous = earlier.keyed.get(_freeze_key(entry.lookup_key))
    if previous is None or previous.row is None:
        return entry  # still the target's row (a deleted or truncated one was refused above)
    row = list(entry.row)
    inherited = take_from_earlier(row, entry.unresolved, previous.row, previous.unresolved)
    return KeyedRow(tuple(row), inherited, previous.lookup_key if inherited else None)
