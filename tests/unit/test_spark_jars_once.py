"""Each jar file name goes on ``spark.jars`` once. hadoop-azure's dependencies repeat Delta's commons-logging
(and hadoop-aws's wildfly-openssl); Spark refused the second file of a name with an ERROR in the log of every
run on abfss:// ("already registered with a different path"). No JVM: ``_merged_jars`` reads spark-submit's
``--jars`` only when one runs (tests/unit/test_session_master.py runs a fresh interpreter for that)."""

from __future__ import annotations

from pathlib import Path

from applier.spark import session


def test_a_jar_name_the_connectors_repeat_goes_on_spark_jars_once(monkeypatch) -> None:
    monkeypatch.setattr(session, "_jvm_conf", lambda: None)
    delta = [Path("/c/jars/delta/delta-spark.jar"), Path("/c/jars/delta/commons-logging-1.3.0.jar")]
    azure = [Path("/c/jars/azure/hadoop-azure-3.5.0.jar"), Path("/c/jars/azure/commons-logging-1.3.0.jar"),
             Path("/c/jars/azure/wildfly-openssl-2.2.5.Final.jar")]
    aws = [Path("/c/jars/aws/hadoop-aws-3.5.0.jar"), Path("/c/jars/aws/wildfly-openssl-2.2.5.Final.jar")]
    assert session._merged_jars([*delta, *azure, *aws]).split(",") == [
        "/c/jars/delta/delta-spark.jar", "/c/jars/delta/commons-logging-1.3.0.jar",
        "/c/jars/azure/hadoop-azure-3.5.0.jar", "/c/jars/azure/wildfly-openssl-2.2.5.Final.jar",
        "/c/jars/aws/hadoop-aws-3.5.0.jar"]
