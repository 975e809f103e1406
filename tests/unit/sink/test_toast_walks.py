"""The mirror fold, a combination of folds, the history and the change feed walk unchanged TOAST values
the same way (applier.sink.rowimage): the same changes give the same values, or the same refusal.

Pure Python: the history's open versions and the feed's mirror rows are given, not read.
"""

from __future__ import annotations

from datetime import datetime
from functools import partial
from typing import Any, cast

import pytest

from applier.changes import OP_DELETE, OP_INSERT, OP_TRUNCATE, OP_UPDATE, TableChange
from applier.errors import SinkError
from applier.sink.changefeed import MirrorRows, feed_rows
from applier.sink.combine import combine_plans
from applier.sink.history import plan_history
from applier.sink.plan import SoftDelete, TablePlan, fold_changes, freeze
from applier.sink.rowkeys import keys_continued
from applier.values import UNCHANGED_TOAST as U

COLS = ("id", "a", "big")
KEYS = (0,)
TARGET = (1, "a0", "big0")  # the row of key 1 before the changes, in every target


def fold(changes: list[TableChange], *, soft: bool = False) -> TablePlan:
    columns = (*COLS, "lsn", "at", "op", "deleted") if soft else COLS
    return fold_changes(changes, columns, KEYS, unchanged_marker=U,
                        soft_delete=SoftDelete(3, 6, 5, (3, 4)) if soft else None)


def history(changes: list[TableChange], *, one_transaction: bool = False) -> list[tuple[Any, ...]]:
    """The versions the history opens; each change its own transaction, or all of them one."""
    target: dict[object, tuple[int, datetime | None, list[Any]]] = {freeze((1,)): (5, None, list(TARGET))}
    events = [(10 if one_transaction else 10 + i, None, c) for i, c in enumerate(changes)]
    plan = plan_history(events, KEYS, (0, 1, 2), target, U)
    return [r[:3] for r in plan.inserts]


def feed(changes: list[TableChange]) -> list[tuple[Any, ...]]:
    mirror = MirrorRows(cast(Any, None), rows={freeze((1,)): list(TARGET)}, everything=True)
    return [r[:4] for r in feed_rows([(10 + i, None, c, True) for i, c in enumerate(changes)], KEYS, 3, mirror, U)]


def refusals(changes: list[TableChange], *, one_transaction: bool = False) -> list[str]:
    out = []
    for walk in (fold, partial(history, one_transaction=one_transaction), feed):
        with pytest.raises(SinkError) as e:
            walk(changes)
        out.append(e.value.message)
    return out


def test_an_old_full_image_holding_the_marker_is_refused_by_every_walk() -> None:
    """Postgres sends old images in full. The key-less fold refused one holding 'u'; the keyed fold,
    the history and the feed copied the marker into the new row."""
    changes = [TableChange(OP_UPDATE, None, (1, "a0", U), (1, "a1", U), 0, new_partial=True)]
    assert set(refusals(changes)) == {"old row image holds unchanged TOAST markers"}


def test_every_walk_takes_the_old_full_image_first() -> None:
    changes = [TableChange(OP_UPDATE, None, (1, "a0", "old"), (1, "a1", U), 0, new_partial=True)]
    assert fold(changes).keyed[(1,)].row == (1, "a1", "old")
    assert history(changes) == [(1, "a1", "old")]
    assert feed(changes) == [(1, "a1", "old", OP_UPDATE)]


def _split_refusal(changes: list[TableChange], cut: int, *, soft: bool = False) -> tuple[str, str]:
    with pytest.raises(SinkError) as whole:
        fold(changes, soft=soft)
    earlier, later = fold(changes[:cut], soft=soft), fold(changes[cut:], soft=soft)
    with pytest.raises(SinkError) as split:
        combine_plans(earlier, later)
    return whole.value.message, split.value.message


@pytest.mark.parametrize("first", [
    TableChange(OP_DELETE, (1,), None, None, 0),
    TableChange(OP_TRUNCATE, None, None, None, 0),
])
def test_a_combination_refuses_with_the_one_pass_folds_message(first: TableChange) -> None:
    """It said "an unchanged value (toast) refers to ..." where the one-pass fold says "an unchanged
    TOAST value refers to ..."."""
    changes = [first, TableChange(OP_UPDATE, None, None, (1, "a1", U), 1, new_partial=True)]
    whole, split = _split_refusal(changes, 1)
    assert whole == split


def test_a_combination_refuses_a_soft_deleted_key_change_with_the_one_pass_folds_message() -> None:
    changes = [TableChange(OP_DELETE, (1,), None, None, 0),
               TableChange(OP_UPDATE, (1,), None, (2, "a1", "b", 7, None, "U", False), 1)]
    whole, split = _split_refusal(changes, 1, soft=True)
    assert whole == split == "a key change refers to a row that is gone earlier in the same batch"


def test_a_key_column_arriving_unchanged_is_refused_by_every_walk() -> None:
    """The fold refused it; the history and the feed took the marker for the row's key (and the feed,
    committed before the mirror table, wrote it)."""
    changes = [TableChange(OP_UPDATE, (1,), None, (U, "a1", "b"), 0, new_partial=True)]
    assert set(refusals(changes)) == {"a key column arrived as unchanged TOAST; the key must be sent in full"}


def test_an_insert_with_unchanged_values_keeps_the_rows_values_in_every_walk() -> None:
    """A row filter can turn an update into an insert that still has 'u' columns (notes on pgoutput
    semantics): the value is the row's from before, when there is one. The fold and the history took
    it; the feed refused, and neither read the row of such a key before the walk."""
    changes = [TableChange(OP_INSERT, None, None, (1, "a1", U), 0, new_partial=True)]
    entry = fold(changes).keyed[(1,)]
    assert entry.unresolved == frozenset({2}) and entry.lookup_key == (1,)  # the target's value
    assert history(changes) == [(1, "a1", "big0")]
    assert feed(changes) == [(1, "a1", "big0", OP_INSERT)]
    assert keys_continued(changes, KEYS) == [(1,)]
    assert keys_continued([TableChange(OP_INSERT, None, None, (1, "a1", "b"), 0)], KEYS) == []


@pytest.mark.parametrize("first,why", [
    (TableChange(OP_DELETE, (1,), None, None, 0), "deleted earlier in the same batch"),
    (TableChange(OP_UPDATE, (1,), None, (2, "a1", "b"), 0), "deleted earlier in the same batch"),  # key change
    (TableChange(OP_TRUNCATE, None, None, None, 0), "removed by a TRUNCATE in the same batch"),
])
@pytest.mark.parametrize("same_transaction", [True, False])
def test_unchanged_values_of_a_row_gone_earlier_in_the_batch_are_refused_alike(
        first: TableChange, why: str, same_transaction: bool) -> None:
    """The history and the feed said the target was missing the row ("no version to come from",
    "the mirror table is missing a row") where the batch itself had removed it."""
    later = TableChange(OP_UPDATE, None, None, (1, "a2", U), 1, new_partial=True)
    messages = refusals([first, later], one_transaction=same_transaction)
    assert messages == [f"an unchanged TOAST value refers to a row {why}"] * 3


def test_a_truncate_then_a_delete_is_a_deleted_row_for_every_walk() -> None:
    changes = [TableChange(OP_TRUNCATE, None, None, None, 0), TableChange(OP_INSERT, None, None, (1, "a", "b"), 1),
               TableChange(OP_DELETE, (1,), None, None, 2),
               TableChange(OP_UPDATE, None, None, (1, "a2", U), 3, new_partial=True)]
    for one_transaction in (True, False):
        assert set(refusals(changes, one_transaction=one_transaction)) == {
            "an unchanged TOAST value refers to a row deleted earlier in the same batch"}
