"""``maintenance``: compaction, VACUUM and checkpoints of the mirrored tables."""

from __future__ import annotations

from pydantic import Field

from applier.config.base import SettingsModel


class MaintenanceSettings(SettingsModel):
    """``applier maintain`` (and ``every_minutes`` inside ``mirror``): compaction, VACUUM and checkpoints of the
    mirrored tables, safe beside a running mirror (docs/operations.md, "Table maintenance")."""

    min_small_files: int = Field(
        16, ge=1, description="compact (OPTIMIZE) a table once it has at least this many small data files")
    small_file_bytes: int = Field(32 << 20, ge=1, description="a data file under this size counts as small")
    target_file_bytes: int | None = Field(
        None, ge=1, description="size of the files compaction writes (unset: the table's delta.targetFileSize, "
        "else 100 MiB)")
    z_order: dict[str, list[str]] = Field(
        default_factory=dict, description="glob over 'schema.table' -> columns: compaction of a matching table "
        "Z-orders by them (rewrites every file of the table each time it runs); liquid-clustered tables (the "
        "rule's cluster_by) are clustered by OPTIMIZE instead")
    vacuum: bool = Field(True, description="VACUUM: delete data files no version within the retention references")
    retention_hours: int | None = Field(
        None, ge=0, description="VACUUM keeps files a version of the last N hours references (unset: the table's "
        "delta.deletedFileRetentionDuration, 7 days by default)")
    enforce_retention: bool = Field(
        True, description="refuse a retention_hours under the table's delta.deletedFileRetentionDuration; false "
        "only with no mirror running and no reader of older versions (their files may be deleted)")
    checkpoint: bool = Field(True, description="write a Delta checkpoint (delta-rs tables; Spark writes its own "
                             "every delta.checkpointInterval commits) and remove log files past "
                             "delta.logRetentionDuration")
    every_minutes: float | None = Field(
        None, gt=0, description="mirror: maintain each table at most this often, between groups while the stream "
                                "is idle (unset: only `applier maintain` does it)")

