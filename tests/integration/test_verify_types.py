"""verify compares column types, not only values: a value of another type can compare equal.

The text 't' in Postgres and a Delta boolean true both read as ``t``; the text '12.5' and a Delta
decimal 12.50 both as ``12.5``. A Delta column left with its old type after an ``ALTER COLUMN ... TYPE``
the mirror never applied must be a difference (exit 1), never "equal".
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest

from applier.checks.verify import verify_table

pytestmark = [pytest.mark.postgres]


def _delta(path: Path, table: pa.Table) -> None:
    from deltalake import write_deltalake

    write_deltalake(str(path), table)


def test_a_column_of_another_type_is_a_difference_even_when_its_values_read_alike(pg, tmp_path, capsys, no_spark):
    from applier.cli import main

    with pg.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, c text, n text)")
        conn.execute("INSERT INTO t VALUES (1, 't', '12.5'), (2, 'f', NULL)")
        conn.execute("CREATE TABLE same (id int PRIMARY KEY, c text)")
        conn.execute("INSERT INTO same VALUES (1, 't')")
    path = tmp_path / "public" / "t"
    _delta(path, pa.table({"id": pa.array([1, 2], pa.int32()), "c": pa.array([True, False]),
                           "n": pa.array([Decimal("12.50"), None], pa.decimal128(10, 2))}))
    _delta(tmp_path / "public" / "same", pa.table({"id": pa.array([1], pa.int32()), "c": pa.array(["t"])}))
    with pg.connect() as conn:
        result = verify_table(None, conn, str(path), "public", "t")
        # the rows alone read alike: only the types tell them apart
        assert result.source_checksum == result.target_checksum and result.source_rows == result.target_rows == 2
        assert not result.equal
        assert len(result.problems) == 2, result.problems
        assert "'c' is boolean in the Delta table" in result.problems[0] and "text in Postgres" in result.problems[0]
        assert "'n' is decimal(10,2) in the Delta table" in result.problems[1]
        assert verify_table(None, conn, str(tmp_path / "public" / "same"), "public", "same").equal
    assert main(["verify", "--dsn", pg.dsn, "--target", str(tmp_path), "--table", "public.t"]) == 1
    out = capsys.readouterr().out
    assert "'c' is boolean in the Delta table" in out
    assert main(["verify", "--dsn", pg.dsn, "--target", str(tmp_path), "--table", "public.same"]) == 0


def test_the_types_the_mirror_writes_are_no_difference(pg, tmp_path, no_spark):
    """Every column of a table the mirror's own type mapping writes compares equal by type: arrays,
    instants, naive timestamps, decimals, an unconstrained numeric (text), a domain by its base type."""
    with pg.connect() as conn:
        conn.execute("CREATE DOMAIN small AS int")
        conn.execute("CREATE TABLE w (id bigint PRIMARY KEY, a int[], ts timestamptz, nt timestamp, d numeric(6,2), "
                     "u numeric, s small, b bytea, f float8)")
        conn.execute("INSERT INTO w VALUES (1, '{1,NULL}', '2024-01-01 00:00+00', '2024-01-01 00:00', 1.25, 7, 3, "
                     "'\\x00', 0.5)")
        path = tmp_path / "public" / "w"
        from datetime import UTC, datetime
        _delta(path, pa.table({
            "id": pa.array([1], pa.int64()),
            "a": pa.array([[1, None]], pa.list_(pa.field("element", pa.int32(), nullable=True))),
            "ts": pa.array([datetime(2024, 1, 1, tzinfo=UTC)], pa.timestamp("us", "UTC")),
            "nt": pa.array([datetime(2024, 1, 1)], pa.timestamp("us")),
            "d": pa.array([Decimal("1.25")], pa.decimal128(6, 2)),
            "u": pa.array(["7"]), "s": pa.array([3], pa.int32()), "b": pa.array([b"\x00"]),
            "f": pa.array([0.5])}))
        result = verify_table(None, conn, str(path), "public", "w")
        assert result.equal, (result.problems, result.only_in_source, result.only_in_target)
