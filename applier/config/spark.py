"""``spark``: the SparkSession applier starts when it is not given one."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from applier.config.base import SettingsModel


class SparkConfig(SettingsModel):
    """The SparkSession the job runs on (ignored when the job is given a session). ``mirror`` and
    ``replay`` start it only when an operation needs Spark (a table delta-rs does not write, a schema
    change, executors...; docs/applying.md, "Spark only when needed").

    ``master`` is a fallback: a master that spark-submit (``--master``), ``PYSPARK_SUBMIT_ARGS``, the
    ``MASTER`` environment variable or ``spark-defaults.conf`` already set wins, so
    ``spark-submit --master spark://host:7077 jobs/mirror.py ...`` runs on that cluster."""

    master: str | None = Field(
        None, description="Spark master used only when spark-submit, PYSPARK_SUBMIT_ARGS, $MASTER or "
        "spark-defaults.conf set none (then 'local[2]' when unset here too), e.g. local[4] or yarn")
    app_name: str = Field("applier", description="application name shown in the Spark UI (spark.app.name)")
    shuffle_partitions: int = Field(
        2, ge=1, description="spark.sql.shuffle.partitions: small, because a MERGE source holds one row per key")
    driver_memory: str = Field(
        "2g", description="spark.driver.memory (only takes effect when applier starts the JVM itself)")
    jit: Literal["full", "quick"] = Field(
        "full", description="the driver JVM's compiler when applier starts the JVM: 'quick' compiles with C1 only "
        "(-XX:TieredStopAtLevel=1), which starts Spark and runs short jobs (a mirror --once of a few changes, a "
        "resync of a small table) up to twice as fast on few cores; 'full' (tiered, C1 then C2) for long runs "
        "and large catch-ups")
    conf: dict[str, str] = Field(
        default_factory=dict, description="any other Spark settings, as name: value strings (they win over the "
        "fields above)")

