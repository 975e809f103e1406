"""``applier resync``: chosen tables of a mirror copied again, by the parts a mirror run is made of.

Why a module of its own: the re-copy (applier.drivers.resync) is a step the mirror itself takes
(``apply.schema_changes: resync``), so the mirror depends on it; the command builds a mirror to get
its table sync, so it depends on the mirror. Here, above both, neither depends on the other's user.
"""

from __future__ import annotations

import psycopg

from applier.config import MirrorConfig
from applier.drivers.mirror import Mirror
from applier.drivers.resync import choose_tables, require_mirror, resync_tables, set_aside
from applier.infra.progress import Progress
from applier.spark.session import SparkLike


def resync(spark: SparkLike, config: MirrorConfig, names: list[str], *,
           progress: Progress | None = None) -> dict[str, int]:
    """``applier resync``: the named tables of the mirror of ``config`` copied again (the mirror must
    have taken its snapshot: this follows a mirror, it does not start one)."""
    require_mirror(config)
    mirror = Mirror(spark, config, progress=progress)
    try:
        gone: dict[str, int] = {}
        with psycopg.connect(mirror.dsn, autocommit=True) as conn:
            tables = choose_tables(conn, config, names, gone=gone)
        if gone:
            set_aside(mirror.tablesync, gone, "set aside by applier resync")
        return resync_tables(mirror.tablesync, tables,
                             reason="copied again as asked (applier resync)") if tables else {}
    finally:
        mirror.live_catalog.close()  # (Mirror.run closes it; this one never runs)
