"""applier.sink.rowimage: where an unchanged TOAST value ('u') takes its value, step by step.

Pure Python: the old FULL image first, then an earlier image of the row (inheriting what it still
reads from the target), then the target, unless the row is known to be gone.
"""

from __future__ import annotations

import pytest

from applier.errors import SinkError
from applier.sink.rowimage import (
    KEY_CHANGE,
    NO_POSITIONS,
    TOAST,
    check_key,
    check_old_image,
    refusal,
    resolve,
    take_from_earlier,
    target_missing,
    unchanged_positions,
)
from applier.values import UNCHANGED_TOAST as U


def test_a_full_image_is_returned_as_it_is_with_nothing_to_read() -> None:
    row, unresolved = resolve((1, "a", "b"), U, "U", None, None, no_earlier="never raised")
    assert row == [1, "a", "b"] and unresolved is NO_POSITIONS


def test_the_old_full_image_comes_first_even_with_an_earlier_image() -> None:
    row, unresolved = resolve((1, U, "new"), U, "U", (1, "old", "x"), (1, "earlier", "y"), {1})
    assert row == [1, "old", "new"] and unresolved == frozenset()


def test_an_earlier_image_fills_what_it_holds_and_passes_on_what_it_still_reads() -> None:
    row, unresolved = resolve((1, U, U, "c"), U, "U", None, (1, "a", U, "z"), frozenset({2}))
    assert row == [1, "a", U, "c"]  # position 2 still holds the marker: the target's value goes there
    assert unresolved == frozenset({2})


def test_without_any_image_every_unchanged_position_reads_the_target() -> None:
    row, unresolved = resolve((1, U, "b", U), U, "U", None, None)
    assert row == [1, U, "b", U] and unresolved == frozenset({1, 3})


def test_without_any_image_a_reason_refuses_the_change_with_its_op() -> None:
    reason = refusal(TOAST, deleted=True, truncated=False)
    assert reason is not None
    with pytest.raises(SinkError, match="deleted earlier in the same batch") as e:
        resolve((1, U), U, "U", None, None, no_earlier=reason)
    assert e.value.context == {"op": "U"}


@pytest.mark.parametrize("reading,deleted,truncated,expected", [
    (TOAST, False, False, None),
    (TOAST, True, False, "an unchanged TOAST value refers to a row deleted earlier in the same batch"),
    (TOAST, False, True, "an unchanged TOAST value refers to a row removed by a TRUNCATE in the same batch"),
    (TOAST, True, True, "an unchanged TOAST value refers to a row deleted earlier in the same batch"),
    (KEY_CHANGE, False, False, None),
    (KEY_CHANGE, True, False, "a key change refers to a row that is gone earlier in the same batch"),
    (KEY_CHANGE, False, True, "a key change refers to a row that is gone earlier in the same batch"),
])
def test_refusal_says_why_the_batch_has_no_row_to_read(reading: str, deleted: bool, truncated: bool,
                                                       expected: str | None) -> None:
    assert refusal(reading, deleted=deleted, truncated=truncated) == expected


def test_take_from_earlier_by_positions_without_scanning_for_the_marker() -> None:
    row: list[object] = [1, None, None, "keep"]  # a combination only knows positions; placeholders vary
    assert take_from_earlier(row, frozenset({1, 2}), (1, "a", "b", "z")) is NO_POSITIONS
    assert row == [1, "a", "b", "keep"]
    row = [1, None, None]
    assert take_from_earlier(row, [1, 2], (1, "a", None), {2}) == frozenset({2})
    assert row == [1, "a", None]


def test_markers_are_found_by_identity_only() -> None:
    assert unchanged_positions((U, "U", None, U), U) == [0, 3]


def test_a_key_with_the_marker_and_an_old_image_with_it_are_refused() -> None:
    check_key((1, "a"), U, "U")
    with pytest.raises(SinkError, match="key column arrived as unchanged TOAST"):
        check_key((1, U), U, "U")
    check_old_image((1, "a"), U, "D")
    with pytest.raises(SinkError, match="old row image holds unchanged TOAST markers"):
        check_old_image((1, U), U, "D")


def test_target_missing_counts_rows_and_names_the_table_and_key() -> None:
    e = target_missing(2, table="public.t", key_columns=["id", "k"])
    assert str(e).startswith("2 row(s) carry unchanged TOAST values but the target has no row to take them from")
    assert e.context == {"table": "public.t", "key_columns": "id, k"}


def test_an_old_image_that_holds_the_marker_is_refused_where_a_value_is_taken_from_it() -> None:
    """Postgres sends old images in full (worker.c never sees 'u' there); the key-less fold always
    refused such an image, the keyed fold, the history and the change feed copied the marker on."""
    with pytest.raises(SinkError, match="old row image holds unchanged TOAST markers"):
        resolve((1, U, "b"), U, "U", (1, U, "a"), None)
    row, _ = resolve((1, "x", U), U, "U", (1, U, "a"), None)  # only the positions taken are checked
    assert row == [1, "x", "a"]
