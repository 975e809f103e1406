"""The stall record (applier.infra.stops): the same error run after run is a stall; another error, even
of the same class on the same table, starts a new count (issue 77: different errors were counted as one)."""

from __future__ import annotations

from applier.errors import SourceError, TransientSourceError
from applier.infra.stops import last_stops, mends, message_shape, record_mend, record_stop
from applier.state import StateDir


def test_the_same_error_with_other_positions_counts_as_a_stall(tmp_path):
    state = StateDir(tmp_path)
    assert record_stop(state, SourceError("slot s: stream ended at 0/16B3748 after 12 messages")) == 1
    assert record_stop(state, SourceError("slot s: stream ended at 0/2A00010 after 3 messages")) == 2
    assert last_stops(state)["count"] == 2


def test_another_error_of_the_same_class_starts_a_new_count(tmp_path):
    state = StateDir(tmp_path)
    assert record_stop(state, SourceError("connection failed: connection refused")) == 1
    assert record_stop(state, SourceError("connection failed: password authentication failed for user 'a'")) == 1
    assert record_stop(state, TransientSourceError("connection failed: password authentication failed for "
                                                   "user 'b'")) == 1
    assert message_shape("at 0/16B3748, 12 rows, '2026-12-07'") == "at #, # rows, #"


def test_a_record_from_before_shapes_were_kept_goes_by_kind_and_table(tmp_path):
    state = StateDir(tmp_path)
    state.save("stops", {"error": "SourceError", "table": "", "message": "old", "count": 3, "since": "x", "last": "x"})
    assert record_stop(state, SourceError("anything")) == 4


def test_mends_are_counted_and_the_newest_comes_first(tmp_path):
    state = StateDir(tmp_path)
    for i in range(25):
        record_mend(state, f"public.t{i} (relation OID {i})", "copied again", "diverged")
    record = mends(state)
    assert record["count"] == 25 and len(record["recent"]) == 20
    assert record["recent"][0]["tables"].startswith("public.t24")
