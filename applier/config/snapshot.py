"""``snapshot``: the initial copy of the published tables."""

from __future__ import annotations

import os

from pydantic import Field

from applier.config.base import SettingsModel


class SnapshotSettings(SettingsModel):
    """The initial copy: chunks of each table read on several connections under the slot's snapshot."""

    parallelism: int | None = Field(
        None, ge=1, description="connections copying chunks at the same time (default: the number of cores)")
    chunk_mb: int = Field(
        32, ge=1, description="heap pages per chunk, in MB (ctid ranges on PostgreSQL 14+; one chunk before)")
    commit_mb: int = Field(
        128, ge=1, description="rows gathered (Arrow size) per Delta commit of a table's copy")

    def workers(self) -> int:
        return self.parallelism or os.cpu_count() or 1

