"""``applier.sink.store.dvformat`` against deletion vectors a real Spark/Delta writes.

One table of 100000 ids in one file, deletion vectors enabled; a DELETE of every third id, then one of
scattered ids and a range across 65536 (so Spark merges the new DV into the file's first). The positions
``read_dv`` finds must be exactly the rows of the deleted ids in the parquet file, and
``encode_positions`` must give Spark's own bytes (neither bitmap has run containers).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from applier.sink.store.dvformat import (
    decode_positions,
    descriptor_id,
    dv_file_bytes,
    dv_path,
    encode_positions,
    read_dv,
)

pytestmark = pytest.mark.spark

ROWS = 100_000
SCATTERED = [1, 2, 4, 65_534, 65_535, 65_537, 99_998]
RANGE = (60_000, 70_000)  # inclusive, across 65536


def newest_commit(table: Path) -> list[dict]:
    newest = max((table / "_delta_log").glob("*.json"), key=lambda p: int(p.stem))
    return [json.loads(line) for line in newest.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def table(spark, tmp_path_factory):
    """The table's path and, after each DELETE, the newest commit's actions."""
    path = tmp_path_factory.mktemp("dvformat") / "t"
    spark.sql(f"CREATE TABLE delta.`{path}` (id BIGINT) USING delta "
              "TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")
    spark.range(ROWS).coalesce(1).write.format("delta").mode("append").save(str(path))
    commits = []
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id % 3 = 0")
    commits.append(newest_commit(path))
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id IN ({', '.join(map(str, SCATTERED))}) "
              f"OR id BETWEEN {RANGE[0]} AND {RANGE[1]}")
    commits.append(newest_commit(path))
    remaining = spark.read.format("delta").load(str(path)).count()
    return path, commits, remaining


def deleted_ids(after: int) -> np.ndarray:
    ids = np.arange(ROWS)
    gone = ids % 3 == 0
    if after == 2:
        gone |= np.isin(ids, SCATTERED) | ((ids >= RANGE[0]) & (ids <= RANGE[1]))
    return ids[gone]


@pytest.mark.parametrize("after", [1, 2])
def test_spark_deletion_vectors_read_back(table, after):
    path, commits, remaining = table
    adds = [a["add"] for a in commits[after - 1] if "add" in a]
    assert len(adds) == 1
    add = adds[0]
    dv = add["deletionVector"]
    assert dv["storageType"] == "u" and dv["offset"] == 1

    positions = read_dv(path, dv)
    expected = deleted_ids(after)
    assert dv["cardinality"] == positions.size == expected.size
    ids = pq.read_table(path / add["path"], columns=["id"]).column("id").to_numpy()
    assert ids.size == ROWS == json.loads(add["stats"])["numRecords"]
    np.testing.assert_array_equal(np.sort(ids[positions.astype(np.int64)]), expected)
    if after == 2:
        assert remaining == ROWS - expected.size

    stored = dv_path(path, dv).read_bytes()
    bitmap = stored[dv["offset"] + 4:dv["offset"] + 4 + dv["sizeInBytes"]]
    np.testing.assert_array_equal(decode_positions(bitmap), positions)
    assert encode_positions(positions) == bitmap  # what applier writes is what Spark writes
    assert dv_file_bytes([bitmap]) == (stored, [1])


def test_spark_replaces_the_dv_of_the_file(table):
    path, commits, _ = table
    first = next(a["add"] for a in commits[0] if "add" in a)
    removed = next(a["remove"] for a in commits[1] if "remove" in a)
    second = next(a["add"] for a in commits[1] if "add" in a)
    assert removed["path"] == first["path"] == second["path"]
    assert descriptor_id(removed["deletionVector"]) == descriptor_id(first["deletionVector"])
    assert descriptor_id(second["deletionVector"]) != descriptor_id(first["deletionVector"])
