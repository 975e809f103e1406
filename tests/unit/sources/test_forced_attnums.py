"""``forced_attnums``: a Relation's attnums when the catalog has moved on, only where they cannot be other
(issue 73 item 5), and the dropped columns an ``AttnumRecorder`` remembers from a log's notes."""

from __future__ import annotations

import json

from applier.sources.catalog_lookup import AttnumRecorder, forced_attnums


def test_as_many_columns_as_attnums_ever_is_the_only_assignment():
    # (id, a, b) renamed twice: the first Relation's (id, a, b2) is the relation's three attnums in order
    assert forced_attnums(("id", "a", "b2"), {1, 2, 3}) == {"id": 1, "a": 2, "b2": 3}


def test_an_attnum_more_than_columns_gives_no_answer():
    # a column added since, a generated column pgoutput does not send, a column dropped at an unknown time
    assert forced_attnums(("id", "a", "b2"), {1, 2, 3, 4}) is None


def test_columns_dropped_before_the_relation_are_left_out():
    assert forced_attnums(("id", "a", "b2"), {1, 2, 3, 4}, {2}) == {"id": 1, "a": 3, "b2": 4}
    assert forced_attnums(("id", "a", "a"), {1, 2, 3}) is None  # a name twice: not a Relation


def test_a_recorder_takes_drops_from_notes_only_for_relations_written_after_them():
    recorder = AttnumRecorder()
    note = {"v": 1, "oid": 7, "name": ["public", "t"], "columns": ["id", "a"], "now": ["public", "t"],
            "attnums": {"id": 1, "a": 3}, "others": {}, "dropped": [2], "at": "0/100"}
    recorder.remember([json.dumps(note)])
    assert recorder.dropped_before(7, 0x100) == {2}
    assert recorder.dropped_before(7, 0xFF) == set()  # written before the drop was seen: it may have had it
    assert recorder.dropped_before(8, 0x100) == set()
