"""applier.infra.fastobj: a fast constructor builds exactly what the dataclass's own constructor builds."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from applier.assembly.transactions import Change
from applier.changes import TableChange
from applier.infra.fastobj import fast_constructor
from applier.protocol.messages import Insert, TupleData


def test_built_objects_equal_the_regular_ones_and_stay_frozen():
    make = fast_constructor(TableChange)
    fast = make("U", (1,), None, (1, "a"))
    regular = TableChange("U", (1,), None, (1, "a"))
    assert type(fast) is TableChange
    assert fast == regular and hash(fast) == hash(regular)
    truncate = TableChange("T", None, None, None, 3, False, True, True)
    assert make("T", None, None, None, 3, False, True, cascade=True) == truncate
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.op = "D"  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(fast)) == regular  # spilled changes are pickled


def test_every_per_change_record_round_trips():
    tup = TupleData(b"tt", (b"1", b"x"))
    insert = Insert(None, 16384, tup)
    change = fast_constructor(Change)(5, 0, insert, ())
    assert change == Change(5, 0, insert, ()) and pickle.loads(pickle.dumps(change)) == change
    row = fast_constructor(TableChange)("I", None, None, (1, "x"), 5, True)
    assert row == TableChange("I", None, None, (1, "x"), 5, True) and row.new_shape == "partial"


def test_refuses_classes_it_cannot_build():
    @dataclasses.dataclass
    class Plain:
        a: int

    with pytest.raises(TypeError):
        fast_constructor(Plain)
