"""The MERGE condition's key ranges (applier.sink.store.rsmerge.key_ranges): a superset of where the
batch's keys can be, and only the files that hold one of them."""

from __future__ import annotations

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from applier.sink.store import rsmerge
from applier.sink.store.rsmerge import key_ranges


def _table(tmp_path, files: list[range]) -> DeltaTable:
    path = str(tmp_path / "t")
    for keys in files:
        write_deltalake(path, pa.table({"id": pa.array(list(keys), pa.int64())}), mode="append")
    return DeltaTable(path)


def _holds(condition: str, key: int) -> bool:
    """The condition evaluated for one target key (its text is plain comparisons, ANDs and ORs)."""
    return bool(eval(condition.replace('t."id"', str(key)).replace(" AND ", " and ").replace(" OR ", " or ")))


def test_only_the_files_holding_a_key_of_the_batch_are_in_the_ranges(tmp_path):
    table = _table(tmp_path, [range(1, 101), range(101, 201), range(201, 301), range(301, 401)])
    condition = key_ranges(table, "id", pa.chunked_array([[5, 250, 1000]], pa.int64()))
    assert all(_holds(condition, k) for k in (*range(1, 101), *range(201, 301)))  # the files of 5 and 250
    assert not any(_holds(condition, k) for k in (*range(101, 201), *range(301, 401), 1000))


def test_a_batch_of_new_keys_reaches_no_file(tmp_path):
    table = _table(tmp_path, [range(1, 101)])
    condition = key_ranges(table, "id", pa.chunked_array([[500, 600]], pa.int64()))
    assert not any(_holds(condition, k) for k in range(0, 700))


def test_many_files_are_joined_into_few_ranges_that_still_hold_every_key(tmp_path, monkeypatch):
    monkeypatch.setattr(rsmerge, "MOST_KEY_RANGES", 3)
    table = _table(tmp_path, [range(i * 100, i * 100 + 50) for i in range(10)])  # gaps between the files
    batch = [i * 100 + 7 for i in range(10)]
    condition = key_ranges(table, "id", pa.chunked_array([batch], pa.int64()))
    assert condition.count(" OR ") == 2
    assert all(_holds(condition, k) for i in range(10) for k in range(i * 100, i * 100 + 50))
