"""Build the SparkSession the engine runs on: Delta extensions, local jars, quiet and deterministic.

The session is always passed in to the layers that need it (no global state); this is the one place
that decides how it is configured.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from applier.errors import EnvironmentSetupError
from applier.infra.cache import default_cache_dir
from applier.spark.jars import check_java, delta_jars

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from applier.config import SparkConfig


@dataclass(frozen=True, slots=True)
class SparkSettings:
    master: str = "local[2]"
    app_name: str = "applier"
    shuffle_partitions: int = 2
    driver_memory: str = "2g"
    warehouse_dir: str | None = None
    ui: bool = False
    extra: Mapping[str, str] = field(default_factory=dict)
    cache_dir: Path | None = None


def build_spark_session(settings: SparkSettings | None = None) -> SparkSession:
    """Start (or attach to) a SparkSession with Delta; fails with a clear error when Java or jars are missing."""
    settings = settings or SparkSettings()
    check_java()
    jars = delta_jars(settings.cache_dir or default_cache_dir())
    # Spark picks a non-loopback address by default and warns; a local engine has no reason to.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Python workers (UDFs, the pgoutput data source) must see this interpreter's packages.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(settings.master)
        .appName(settings.app_name)
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .config("spark.sql.shuffle.partitions", str(settings.shuffle_partitions))
        # Delta rebuilds a table's state from its log with this many tasks (default 50); on a local
        # engine that made every small MERGE of the mirror ~2.8 s instead of ~1 s (bench/lag.py).
        .config("spark.databricks.delta.snapshotPartitions", str(settings.shuffle_partitions))
        .config("spark.driver.memory", settings.driver_memory)
        .config("spark.ui.enabled", str(settings.ui).lower())
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.databricks.delta.schema.autoMerge.enabled", "false")
        .config("spark.driver.extraJavaOptions", "-Duser.timezone=UTC")
        .config("spark.executor.extraJavaOptions", "-Duser.timezone=UTC")
    )
    if jars:
        builder = builder.config("spark.jars", ",".join(str(j) for j in jars))
    if settings.warehouse_dir:
        builder = builder.config("spark.sql.warehouse.dir", settings.warehouse_dir)
    for key, value in settings.extra.items():
        builder = builder.config(key, value)
    try:
        session = builder.getOrCreate()
    except Exception as e:  # py4j/gateway failures carry their own detail
        raise EnvironmentSetupError(f"Spark did not start: {e}") from e
    session.sparkContext.setLogLevel("ERROR")
    return session


def build_spark_session_for(config: SparkConfig) -> SparkSession:
    """The session a job's ``spark:`` config section describes."""
    return build_spark_session(SparkSettings(
        master=config.master, app_name=config.app_name, shuffle_partitions=config.shuffle_partitions,
        driver_memory=config.driver_memory, extra=dict(config.conf)))
