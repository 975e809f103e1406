"""Data files that store timestamps as Parquet INT96, and their repair.

Spark writes ``timestamp`` columns as INT96 unless told otherwise, and applier did not tell it before
it set ``spark.sql.parquet.outputTimestampType`` (applier.spark.session.PARQUET_TIMESTAMPS). Spark
reads its own INT96 back exactly, but delta-rs (and pyarrow, DuckDB, Polars) reads INT96 as
nanoseconds since 1970 in an int64: a value outside 1677-09-21 .. 2262-04-11 overflows. It reads
wrong, ``verify`` stops on it, and when delta-rs rewrites such a file (a MERGE that touches another
row of it, a compaction) the wrong value is written back for good.

So a table that still holds INT96 files is found (``int96_files``: the footers of its data files,
only for tables with a timestamp column) and rewritten by Spark, which reads the INT96 values right
and writes them as microseconds (``rewrite_with_spark``: every data file, ``dataChange = false``, the
same rows, the ``txn`` actions untouched). ``applier maintain`` does this before it compacts with
delta-rs; ``applier verify`` reports such a table and compares it as Spark reads it. A value delta-rs
already rewrote is wrong in the file itself: no rewrite brings it back, a fresh copy does
(``applier resync``), and ``verify`` finds it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from applier.spark.session import writing_microseconds
from applier.storage.paths import location

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

#: A table property set once a table's data files are known to hold no INT96 (checked, or rewritten):
#: applier writes none since, so maintenance does not read every footer again each time.
PROP_TIMESTAMPS = "applier.parquetTimestamps"
CHECKED = "microseconds"


def has_timestamps(schema_json: str) -> bool:
    """Whether a Delta schema (its JSON, as delta-rs gives it) has a ``timestamp`` column anywhere, nested
    ones included (``timestamp_ntz`` columns are never written as INT96)."""
    def walk(node: Any) -> bool:
        if isinstance(node, dict):
            return any(walk(v) for v in node.values())
        if isinstance(node, list):
            return any(walk(v) for v in node)
        return bool(node == "timestamp")
    return walk(json.loads(schema_json))


def int96_files(table: Any) -> list[str]:
    """The data files of ``table`` (a ``deltalake.DeltaTable``) with an INT96 column: one footer read per
    file (none for a table without a timestamp column)."""
    import pyarrow.parquet as pq

    if not has_timestamps(table.schema().to_json()):
        return []
    found = []
    for uri in table.file_uris():
        where = location(uri.removeprefix("file://") if uri.startswith("file:///") else uri)
        source = str(where) if isinstance(where, Path) else where.open_input_file()
        schema = pq.read_metadata(source).schema
        if any(schema.column(i).physical_type == "INT96" for i in range(len(schema))):
            found.append(uri)
    return found


def int96_files_at(path: str) -> list[str] | None:
    """``int96_files`` of the table at ``path``, or None when there is nothing to check: a table marked as
    checked (``PROP_TIMESTAMPS``), one without a timestamp column, one delta-rs cannot open or list (Spark
    reads it, and reads INT96 right). One open of the table for all of it."""
    from applier.sink.store.deltars import DeltaRsStore

    if not DeltaRsStore.can_open(path):
        return None
    try:
        table = DeltaRsStore.open(path)
        if (table.metadata().configuration.get(PROP_TIMESTAMPS) == CHECKED
                or not has_timestamps(table.schema().to_json())):
            return None
        return int96_files(table)
    except Exception as e:  # noqa: BLE001 - a table delta-rs opens but cannot list: Spark's to read
        log.debug("%s: data files not checked for INT96 timestamps: %s", path, e)
        return None


def int96_advice(files: list[str]) -> str:
    """What a table with INT96 files means, and the command that repairs it."""
    return (f"{len(files)} data files store timestamps as Parquet INT96 (Spark's default, written by an "
            "applier before it wrote microseconds): delta-rs, pyarrow and DuckDB misread values outside "
            "1677-2262, and a delta-rs rewrite keeps the wrong value; `applier maintain` rewrites them with "
            "Spark")


def rewrite_with_spark(spark: SparkSession, path: str) -> None:
    """Rewrite every data file of the table at ``path`` as Spark reads it, with timestamps written as
    microseconds: one commit that changes no row (``dataChange = false``, as a compaction), partitioning
    kept, the exactly-once ``txn`` actions untouched."""
    session = writing_microseconds(spark)
    rows = session.read.format("delta").load(path)
    rows.write.format("delta").mode("overwrite").option("dataChange", "false").save(path)
    log.info("rewrote the data files of %s with timestamps as microseconds", path)
