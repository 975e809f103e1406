"""``snapshot``: the initial copy of the published tables."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import Field

from applier.config.base import SettingsModel


class SnapshotSettings(SettingsModel):
    """The initial copy: chunks of each table read on several connections under the slot's snapshot."""

    parallelism: int | None = Field(
        None, ge=1, description="connections copying chunks at the same time (default: the number of cores)")
    chunk_mb: int = Field(
        32, ge=1, description="heap pages per chunk, in MB (ctid ranges on PostgreSQL 14+; one chunk before)")
    commit_mb: int = Field(
        128, ge=1, description="rows (Arrow size) per Delta commit of a table's copy; the copy's threads write "
        "their chunks as Parquet files as they come, and the files are committed every commit_mb and at the end")
    on_executors: bool | Literal["auto"] = Field(
        "auto", description="copy on Spark's executors: each table is one Spark job of one task per chunk, "
        "every task reading its chunk under the slot's snapshot (the executors must reach source.dsn) and "
        "writing Parquet files, the driver committing each table once (commit_mb does not apply). auto: when "
        "Spark's master is a cluster, for tables of at least two chunks; true: every table with columns; false: "
        "on the driver's connections")

    def workers(self) -> int:
        return self.parallelism or os.cpu_count() or 1

    def executor_chunks(self, spark_is_local: bool) -> int | None:
        """The fewest chunks a table needs to be copied on executors, or None: every table on the driver."""
        if self.on_executors == "auto":
            return None if spark_is_local else 2
        return 1 if self.on_executors else None

