"""A copy's Parquet files, written where the rows are (a Spark task) and committed by the driver.

Why not Spark's Delta writer for a table delta-rs writes: Spark turns every Arrow row into one of its
own and writes Parquet on the JVM (bench/RESULTS.md: a third of the driver's copy rate on the same
cores), while pyarrow writes a task's Arrow pieces as they are. The file goes into the table's own
directory through delta-rs's object store (the same ``storage_options`` as every delta-rs write),
named like Spark's and delta-rs's (``part-<uuid>-c000.snappy.parquet``), and the driver commits the
files of all tasks in one delta-rs commit (``DeltaRsStore.commit_files``). A task that fails or is
run again leaves a file no commit names: VACUUM removes it, as it removes Spark's.

Each file's statistics are exact and cover what readers skip files by: the row count, NULL counts of
the columns that are not nested, and the smallest and largest value of integer, date, timestamp and
text columns (as delta-rs writes them, timestamps cut to the millisecond; other types have none, which
readers take as "may hold anything": a float's NaN or a decimal's digits are not worth a wrong skip).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass(frozen=True, slots=True)
class CopyFile:
    """One written Parquet file: what its ``add`` action says."""

    path: str  # relative to the table's root
    size: int
    rows: int
    modified_ms: int
    stats: str  # the add action's statistics (JSON)


def file_stats(piece: pa.Table) -> str:
    """The Delta statistics of a file holding exactly ``piece``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    nulls: dict[str, int] = {}
    lows: dict[str, Any] = {}
    highs: dict[str, Any] = {}
    for field, column in zip(piece.schema, piece.columns, strict=True):
        kind = field.type
        if pa.types.is_nested(kind):
            continue
        nulls[field.name] = column.null_count
        if not (pa.types.is_integer(kind) or pa.types.is_date32(kind) or pa.types.is_string(kind)
                or pa.types.is_large_string(kind) or pa.types.is_timestamp(kind)) or column.null_count == len(column):
            continue
        bounds = pc.min_max(column)
        try:
            low, high = bounds["min"].as_py(), bounds["max"].as_py()
        except (OverflowError, ValueError):  # a date or time Python cannot hold (past year 9999): no bounds
            continue
        if pa.types.is_date32(kind):
            low, high = low.isoformat(), high.isoformat()
        elif pa.types.is_timestamp(kind):
            if not (isinstance(low, datetime) and isinstance(high, datetime)):
                continue  # (a unit finer than µs: no bounds, which readers take as "may hold anything")
            low, high = _timestamp_bound(low), _timestamp_bound(high)
        lows[field.name], highs[field.name] = low, high
    return json.dumps({"numRecords": piece.num_rows, "minValues": lows, "maxValues": highs, "nullCount": nulls},
                      separators=(",", ":"), ensure_ascii=False)


def _timestamp_bound(value: datetime) -> str:
    """A timestamp bound as delta-rs and Spark write it: cut to the millisecond (readers allow for the
    cut: Spark adds a millisecond to a maximum), UTC with a Z for a timestamp with a time zone, plain
    for one without."""
    text = value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z" if value.tzinfo is not None \
        else value.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    return text.rjust(len(text) + 4 - text.index("-"), "0")  # (%Y does not pad years before 1000)
