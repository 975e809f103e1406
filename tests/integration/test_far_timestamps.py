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


def test_int96_files_of_an_older_applier_are_found_by_verify_and_rewritten_by_maintain(pg, spark, tmp_path):
    """Issue 47: tables an older applier wrote through Spark hold INT96 files. ``verify`` stopped with exit 5
    (ArrowInvalid) on them, and ``maintain``'s delta-rs compaction wrote the overflowed values back. Now
    verify says what they are and compares them as Spark reads them; maintain rewrites them with Spark as
    microseconds before it compacts, and marks the table so that it does not read every footer again."""
    import deltalake

    from applier.config import MaintenanceSettings
    from applier.sink.int96 import PROP_TIMESTAMPS, int96_files
    from applier.sink.maintenance import TableMaintainer
    from applier.spark.session import PARQUET_TIMESTAMPS, SparkProvider

    target = tmp_path / "delta"
    path = target / "public" / "rc"
    config = MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="int96", publication="int96"),
                          target=TargetSettings(path=str(target)))
    with pg.connect() as conn:
        conn.execute("CREATE TABLE rc (id int PRIMARY KEY, tstz timestamptz, ts timestamp, v int)")
        conn.execute(f"INSERT INTO rc VALUES {FAR}")
        conn.execute("CREATE PUBLICATION int96 FOR TABLE rc")
        mirror(spark, config, once=True)
        spark.conf.set("spark.sql.parquet.outputTimestampType", "INT96")  # as an older applier wrote
        try:
            for _ in range(2):  # (two commits: small files for the compaction after the rewrite)
                spark.read.format("delta").load(str(path)).write.format("delta").mode("overwrite") \
                    .option("dataChange", "false").save(str(path))
        finally:
            spark.conf.set(*PARQUET_TIMESTAMPS)
        assert len(int96_files(deltalake.DeltaTable(str(path)))) >= 1

        [result] = verify_against_postgres(spark, conn, str(target), [("public", "rc")])
        assert not result.equal and any("INT96" in p and "applier maintain" in p for p in result.problems)
        assert (result.source_rows, result.source_checksum) == (result.target_rows, result.target_checksum)

        maintainer = TableMaintainer(MaintenanceSettings(min_small_files=1), SparkProvider(session=spark))
        done = maintainer.maintain(path, "public.rc")
        assert any("rewrote" in n and "INT96" in n for n in done.notes), done.notes
        assert int96_files(deltalake.DeltaTable(str(path))) == []  # (the replaced files stay until VACUUM)
        assert deltalake.DeltaTable(str(path)).metadata().configuration[PROP_TIMESTAMPS] == "microseconds"
        again = maintainer.maintain(path, "public.rc")
        assert not any("INT96" in n for n in again.notes), again.notes
        conn.execute("UPDATE rc SET v = 30 WHERE id = 2")  # delta-rs rewrites the file of the far values
        mirror(spark, config, once=True)
        [result] = verify_against_postgres(spark, conn, str(target), [("public", "rc")])
        assert result.equal, (result.problems, result.only_in_source, result.only_in_target)
        far = {r["id"]: r["ts"] for r in deltalake.DeltaTable(str(path)).to_pyarrow_table().to_pylist()}
        assert far[3].year == 9999 and far[1].year == 1500, far
