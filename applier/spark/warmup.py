"""The workload whose classes the class data archive holds (applier.spark.classdata): run by
``write_archive`` as ``python -m applier.spark.warmup ARCHIVE`` in a JVM that dumps the classes it loaded
into ARCHIVE when it exits.

A module of its own because it starts a SparkSession (applier.spark.session), which itself reads the
archive's options from classdata: classdata stays below the session.
"""

from __future__ import annotations

import sys
import tempfile

from applier.spark.session import SparkSettings, build_spark_session


def warm_up(dump_to: str) -> None:
    """What a mirror's JVM does first: start, create a Delta table, MERGE into it, read it."""
    spark = build_spark_session(SparkSettings(java_options=f"-XX:ArchiveClassesAtExit={dump_to}"))
    with tempfile.TemporaryDirectory() as tmp:
        from delta.tables import DeltaTable

        path = f"{tmp}/t"
        spark.range(10).selectExpr("id", "cast(id AS string) AS s").write.format("delta").save(path)
        source = spark.range(5, 15).selectExpr("id", "'x' AS s")
        DeltaTable.forPath(spark, path).alias("t").merge(source.alias("s"), "t.id = s.id") \
            .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute()
        spark.read.format("delta").load(path).collect()
    spark.stop()
    from pyspark import SparkContext

    jvm = SparkContext._gateway.proc  # type: ignore[union-attr]  # the JVM pyspark launched
    SparkContext._gateway.shutdown()  # type: ignore[union-attr]
    jvm.stdin.close()  # the JVM exits when its stdin closes, and writes the archive as it does
    jvm.wait(timeout=600)


if __name__ == "__main__":
    warm_up(sys.argv[1])
