"""The jobs' configs, one per command that reads a config file: ``mirror``, ``replay`` and ``capture``,
each made of the sections it uses."""

from __future__ import annotations

from pydantic import Field, model_validator

from applier.config.apply import ApplySettings
from applier.config.base import PATH, SettingsModel
from applier.config.catalog import CatalogSettings
from applier.config.distributed import DistributedSettings
from applier.config.maintenance import MaintenanceSettings
from applier.config.metrics import MetricsSettings
from applier.config.snapshot import SnapshotSettings
from applier.config.source import SourceSettings
from applier.config.spark import SparkConfig
from applier.config.tables import TablesSettings
from applier.config.target import TargetSettings

_SOURCE = "the slot, publication, DSN and pgoutput options"
_TARGET = "where the Delta tables and the applier's state go"
_TABLES = "which published tables are mirrored, and per-table rules"
_APPLY = "how transactions are grouped and applied, and what stops the run"
_SPARK = ("the SparkSession applier starts when it is not given one (mirror and replay: only when an "
          "operation needs Spark)")
_CATALOG = "registering every mirrored table by name in a catalog other engines read (opt-in)"


def _with_catalog_conf(spark: SparkConfig, catalog: CatalogSettings) -> SparkConfig:
    """``spark`` with the settings ``catalog`` needs that ``spark.conf`` does not give itself."""
    missing = {k: v for k, v in catalog.spark_conf().items() if k not in spark.conf}
    return spark.model_copy(update={"conf": {**spark.conf, **missing}}) if missing else spark


class MirrorConfig(SettingsModel):
    """``applier mirror``: snapshot the published tables, then follow the slot."""

    source: SourceSettings = Field(default_factory=SourceSettings, description=_SOURCE)
    target: TargetSettings = Field(description=_TARGET)
    tables: TablesSettings = Field(default_factory=TablesSettings, description=_TABLES)
    snapshot: SnapshotSettings = Field(default_factory=SnapshotSettings, description="the initial copy of the "
                                       "published tables (how many connections, chunk and commit sizes)")
    apply: ApplySettings = Field(default_factory=ApplySettings, description=_APPLY)
    spark: SparkConfig = Field(default_factory=SparkConfig, description=_SPARK)
    distributed: DistributedSettings = Field(
        default_factory=DistributedSettings, description="catching up a large backlog on Spark's executors")
    metrics: MetricsSettings = Field(default_factory=MetricsSettings,
                                     description="Prometheus metrics and /healthz while the mirror runs")
    maintenance: MaintenanceSettings = Field(
        default_factory=MaintenanceSettings, description="compaction, VACUUM and checkpoints of the mirrored tables")
    catalog: CatalogSettings = Field(default_factory=CatalogSettings, description=_CATALOG)

    def spark_config(self) -> SparkConfig:
        """``spark`` with what ``catalog`` needs of a session applier starts."""
        return _with_catalog_conf(self.spark, self.catalog)


class ReplayConfig(SettingsModel):
    """``applier replay``: apply a stored raw log (Parquet or Delta: lsn, xid, data) to Delta tables."""

    source_log: str = Field(
        json_schema_extra=PATH, description="path of the raw log: a Parquet file, a directory of Parquet parts or "
        "a Delta table with columns lsn, xid, data (what `applier capture` writes)")
    target: TargetSettings = Field(description=_TARGET)
    tables: TablesSettings = Field(default_factory=TablesSettings, description=_TABLES)
    apply: ApplySettings = Field(default_factory=ApplySettings, description=_APPLY)
    spark: SparkConfig = Field(default_factory=SparkConfig, description=_SPARK)
    distributed: DistributedSettings = Field(
        default_factory=DistributedSettings, description="decoding and folding on Spark's executors")
    catalog: CatalogSettings = Field(default_factory=CatalogSettings, description=_CATALOG)

    @model_validator(mode="after")
    def _no_resync(self) -> ReplayConfig:
        """resync, the default, is the mirror's: a replay that was not told otherwise stops where a mirror would
        copy a table again (as evolve does); only a config that asks for resync by name is refused."""
        if self.apply.schema_changes == "resync" and "schema_changes" in self.apply.model_fields_set:
            raise ValueError("apply.schema_changes: resync needs a live source to copy from (applier mirror); "
                             "a replay of a stored log cannot re-copy a table: use evolve or stop")
        return self

    def spark_config(self) -> SparkConfig:
        """``spark`` with what ``catalog`` needs of a session applier starts."""
        return _with_catalog_conf(self.spark, self.catalog)


class CaptureConfig(SettingsModel):
    """``applier capture``: drain a slot into a stored raw log (a Delta table) for replay later."""

    source: SourceSettings = Field(default_factory=SourceSettings, description=_SOURCE)
    log_path: str = Field(json_schema_extra=PATH,
                          description="the Delta table of raw messages (lsn, xid, data, seq, session, captured_at, "
                                      "catalog)")
    batch_changes: int = Field(10_000, ge=1, description="changes per peek (whole transactions are kept together)")
    spark: SparkConfig = Field(default_factory=SparkConfig, description=_SPARK)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings,
                                     description="Prometheus metrics and /healthz while capture runs")
