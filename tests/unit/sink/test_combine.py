"""combine_plans: folding a run of changes in pieces and combining equals folding it in one pass.

Random runs of inserts, updates (with and without key changes, with unchanged TOAST values, with and
without the old row), deletes and truncates over a few keys, cut at random places: the combined
plan must equal the one-pass plan entry for entry, or both must refuse the run. Pure Python: no
Spark, no server (the distributed replay's end-to-end tests compare against Postgres).
"""

from __future__ import annotations

import random

import pytest

from applier.changes import OP_DELETE, OP_INSERT, OP_TRUNCATE, OP_UPDATE, TableChange
from applier.errors import SinkError
from applier.sink.combine import combine_plans
from applier.sink.plan import KeyedRow, SoftDelete, TablePlan, fold_changes
from applier.values import UNCHANGED_TOAST

COLUMNS = ("id", "a", "b", "at_lsn", "at_time", "op", "deleted")
KEYS = (0,)


def random_changes(rng: random.Random, n: int, *, keyed: bool) -> list[TableChange]:
    """A run that is mostly what Postgres sends, with some nonsense (TOAST after a delete) mixed in."""
    live: dict[int, tuple[object, ...]] = {}
    out: list[TableChange] = []
    for i in range(n):
        roll = rng.random()
        key = rng.randrange(6)
        value = (key, rng.randrange(3), f"t{rng.randrange(3)}", i, i, "U", False)
        if roll < 0.05:
            out.append(TableChange(OP_TRUNCATE, None, None, None, i))
            live.clear()
        elif roll < 0.3 or (key not in live and rng.random() < 0.7):
            out.append(TableChange(OP_INSERT, None, None, value, i))
            live[key] = value
        elif roll < 0.45:
            old = live.pop(key, value)
            out.append(TableChange(OP_DELETE, (key,) if keyed else None, None if keyed else old, None, i))
        else:
            old = live.pop(key, value)
            new_key = rng.randrange(6) if rng.random() < 0.3 else key
            new = list(value)
            new[0] = new_key
            partial = rng.random() < 0.5
            if partial:
                new[2] = UNCHANGED_TOAST
            old_row = old if (not keyed or rng.random() < 0.2) else None
            old_key = (key,) if keyed and old_row is None and new_key != key else None
            out.append(TableChange(OP_UPDATE, old_key, old_row, tuple(new), i, new_partial=partial))
            live[new_key] = tuple(new)
    return out


def fold(changes: list[TableChange], *, keyed: bool, soft: bool) -> TablePlan | str:
    try:
        return fold_changes(changes, COLUMNS, KEYS if keyed else (), unchanged_marker=UNCHANGED_TOAST,
                            soft_delete=SoftDelete(3, 6, 5, (3, 4)) if soft else None)
    except SinkError:
        return "refused"


def pieces(changes: list[TableChange], cuts: list[int], *, keyed: bool, soft: bool) -> TablePlan | str:
    bounds = [0, *sorted(cuts), len(changes)]
    plans = [fold(changes[a:b], keyed=keyed, soft=soft) for a, b in zip(bounds, bounds[1:], strict=False)]
    if any(isinstance(p, str) for p in plans):
        return "refused"
    combined = plans[0]
    assert isinstance(combined, TablePlan)
    try:
        for p in plans[1:]:
            assert isinstance(p, TablePlan)
            combined = combine_plans(combined, p)
    except SinkError:
        return "refused"
    return combined


def same(a: TablePlan | str, b: TablePlan | str) -> bool:
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    if a.multiset:
        counts = lambda p: {k: v for k, v in p.counts.items() if v}  # noqa: E731
        return (a.truncated, counts(a)) == (b.truncated, counts(b))
    return (a.truncated, a.restart_identity, a.changes, entries(a)) == (b.truncated, b.restart_identity, b.changes,
                                                                         entries(b))


def entries(plan: TablePlan) -> dict[object, KeyedRow]:
    """The plan's rows with the placeholders at unresolved positions blanked (the merge reads those
    positions from the target, whatever the placeholder)."""
    return {k: KeyedRow(None if e.row is None else tuple(None if i in e.unresolved else v
                                                         for i, v in enumerate(e.row)), e.unresolved, e.lookup_key)
            for k, e in plan.keyed.items()}


@pytest.mark.parametrize("keyed,soft", [(True, False), (True, True), (False, False)])
def test_combined_pieces_equal_one_pass(keyed: bool, soft: bool) -> None:
    rng = random.Random(7)
    agreed = refused = 0
    for _ in range(3000):
        changes = random_changes(rng, rng.randrange(1, 14), keyed=keyed)
        whole = fold(changes, keyed=keyed, soft=soft)
        cuts = [rng.randrange(1, len(changes)) for _ in range(rng.randrange(0, 3))] if len(changes) > 1 else []
        split = pieces(changes, cuts, keyed=keyed, soft=soft)
        assert same(whole, split), (changes, cuts, whole, split)
        agreed += 1
        refused += whole == "refused"
    assert refused and refused < agreed / 2  # both kinds of outcome were exercised
