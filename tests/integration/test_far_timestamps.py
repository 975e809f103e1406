"""Timestamps outside 1677-2262 through every writer (issue 47, repro 13b): Spark wrote ``timestamp``
columns as Parquet INT96, which delta-rs reads as 64-bit nanoseconds: a later delta-rs rewrite of the
file (an update of another row) wrote the overflowed value back, and the mirror ended with exit 0 over
1500-06-01 turned into 2084-12-18. Every write must keep every value PostgreSQL and Delta both hold."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from applier.checks.verify import verify_against_postgres
from applier.config import ApplySettings, MirrorConfig, SourceSettings, TargetSettings
from applier.drivers.mirror import mirror

pytestmark = [pytest.mark.postgres, pytest.mark.spark]

FAR = ("(1, '1500-06-01 00:00+00', '1500-06-01 12:00', 1), (2, '2024-01-01+00', '2024-01-01', 2), "
       "(3, '9999-12-31 23:59:59.999999+00', '9999-12-31 23:59:59.999999', 3)")


def _physical_types(table: Path) -> set[str]:
    """The Parquet physical types of the timestamp columns in every data file of the table."""
    out = set()
    for f in table.rglob("*.parquet"):
        if "_delta_log" in f.parts:
            continue
        schema = pq.ParquetFile(f).schema
        for i in range(len(schema)):
            column = schema.column(i)
            if column.name in ("tstz", "ts"):
                out.add(column.physical_type)
    return out


@pytest.mark.parametrize("spark_write", ["fill", "merge_engine_spark"])
def test_far_timestamps_survive_a_spark_write_then_a_delta_rs_rewrite(pg, spark, tmp_path, spark_write):
    target = tmp_path / "delta"
    engine = "spark" if spark_write == "merge_engine_spark" else "auto"
    config = MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="far", publication="far"),
                          target=TargetSettings(path=str(target)), apply=ApplySettings(merge_engine=engine))
    with pg.connect() as conn:
        conn.execute("CREATE TABLE rc (id int PRIMARY KEY, tstz timestamptz, ts timestamp, v int)")
        conn.execute(f"INSERT INTO rc VALUES {FAR}")
        conn.execute("CREATE PUBLICATION far FOR TABLE rc")
        mirror(spark, config, once=True)
        conn.execute("ALTER TABLE rc ADD COLUMN w int DEFAULT 5")  # Spark fills the rows that existed
        conn.execute("INSERT INTO rc (id, tstz, ts, v) VALUES (4, '0001-01-01 00:00+00', '2262-04-12', 4)")
        mirror(spark, config, once=True)
        assert "INT96" not in _physical_types(target / "public" / "rc")
        # delta-rs (or Spark) rewrites the files for an update of another row
        config = config.model_copy(update={"apply": ApplySettings()})
        conn.execute("UPDATE rc SET v = 20 WHERE id = 2")
        mirror(spark, config, once=True)
        results = verify_against_postgres(spark, conn, str(target), [("public", "rc")])
        assert all(r.equal for r in results), [(r.only_in_source, r.only_in_target) for r in results]
    assert _physical_types(target / "public" / "rc") <= {"INT64"}
