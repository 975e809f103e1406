"""Smoke test of the whole chain on real parts: Postgres slot -> pgoutput bytes -> Delta MERGE.

It decodes with a deliberately tiny decoder of its own (proto 1, text tuples, I/U/D only) so that it
proves the ground (server, slot, peek, Spark, Delta jars, MERGE) independently of the real decoder.
"""

from __future__ import annotations

import struct

import pytest

pytestmark = [pytest.mark.postgres, pytest.mark.spark]


def _tuple(data: bytes, pos: int) -> tuple[list[str | None], int]:
    (ncols,) = struct.unpack_from("!h", data, pos)
    pos += 2
    values: list[str | None] = []
    for _ in range(ncols):
        kind = data[pos : pos + 1]
        pos += 1
        if kind == b"t":
            (n,) = struct.unpack_from("!i", data, pos)
            values.append(data[pos + 4 : pos + 4 + n].decode())
            pos += 4 + n
        else:
            assert kind == b"n", kind
            values.append(None)
    return values, pos


def tiny_decode(data: bytes) -> tuple[str, list[str | None] | None, list[str | None] | None]:
    """(op, old key tuple or None, new tuple or None) for I/U/D; ("", None, None) for anything else."""
    kind = data[:1]
    if kind not in (b"I", b"U", b"D"):
        return "", None, None
    pos = 5  # type byte + relation oid
    old = new = None
    if data[pos : pos + 1] in (b"K", b"O"):
        old, pos = _tuple(data, pos + 1)
    if kind != b"D":
        assert data[pos : pos + 1] == b"N"
        new, pos = _tuple(data, pos + 1)
    assert pos == len(data)
    return kind.decode(), old, new


def test_changes_from_a_real_slot_merge_into_delta_equal_to_postgres(pg, spark, tmp_path):
    from delta.tables import DeltaTable

    with pg.connect() as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text, qty int)")
        conn.execute("CREATE PUBLICATION smoke_pub FOR TABLE items")
        conn.execute("SELECT pg_create_logical_replication_slot('smoke_slot', 'pgoutput')")
        conn.execute("INSERT INTO items SELECT g, 'item ' || g, g * 10 FROM generate_series(1, 20) g")
        conn.execute("UPDATE items SET qty = qty + 1 WHERE id % 3 = 0")
        conn.execute("UPDATE items SET id = 100 + id WHERE id IN (4, 5)")  # key change: K tuple
        conn.execute("DELETE FROM items WHERE id % 7 = 0")
        conn.execute("UPDATE items SET name = NULL WHERE id = 1")
        rows = conn.execute(
            "SELECT lsn, xid, data FROM pg_logical_slot_peek_binary_changes("
            "'smoke_slot', NULL, NULL, 'proto_version', '1', 'publication_names', 'smoke_pub')"
        ).fetchall()
        expected = sorted(conn.execute("SELECT id, name, qty FROM items").fetchall(), key=lambda r: r[0])

    # Fold the change stream into one MERGE source: last image per key, deletes as tombstones.
    final: dict[int, tuple[int, str | None, int | None, bool]] = {}
    kinds = set()
    for _lsn, _xid, data in rows:
        op, old, new = tiny_decode(bytes(data))
        kinds.add(op)
        if op == "I" or op == "U":
            assert new is not None and new[0] is not None  # the key is never NULL
            if old is not None:  # key changed: the old key is gone
                assert old[0] is not None
                final[int(old[0])] = (int(old[0]), None, None, True)
            final[int(new[0])] = (int(new[0]), new[1], int(new[2]) if new[2] else None, False)
        elif op == "D":
            assert old is not None and old[0] is not None
            final[int(old[0])] = (int(old[0]), None, None, True)
    assert {"I", "U", "D"} <= kinds

    target = str(tmp_path / "items")
    spark.sql(f"CREATE TABLE delta.`{target}` (id INT, name STRING, qty INT) USING delta")
    source = spark.createDataFrame(list(final.values()), "id int, name string, qty int, deleted boolean")
    (
        DeltaTable.forPath(spark, target).alias("t")
        .merge(source.alias("s"), "t.id = s.id")
        .whenMatchedDelete(condition="s.deleted")
        .whenMatchedUpdate(set={"name": "s.name", "qty": "s.qty"})
        .whenNotMatchedInsert(condition="NOT s.deleted", values={"id": "s.id", "name": "s.name", "qty": "s.qty"})
        .execute()
    )
    got = sorted((r.id, r.name, r.qty) for r in spark.read.format("delta").load(target).collect())
    assert got == expected
    # 4 and 5 moved to 104 and 105; then 7, 14 and 105 (divisible by 7) were deleted
    assert len(got) == 17
    assert (104, "item 4", 40) in got and (1, None, 10) in got
