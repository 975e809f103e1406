"""Write a stored raw log: a Parquet file of (lsn, xid, data) rows in log order.

This is the format ``applier inspect`` and ``applier replay`` read (the same columns
``pg_logical_slot_peek_binary_changes`` returns, with the LSN as text like ``0/16B3748``).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from applier.lsn import format_lsn

RAW_LOG_SCHEMA = pa.schema([("lsn", pa.string()), ("xid", pa.int64()), ("data", pa.binary())])


def write_raw_log(path: str | Path, messages: Iterable[tuple[int, int, bytes]], *, batch_rows: int = 50_000) -> int:
    """Write ``(lsn, xid, data)`` tuples to a Parquet file; returns the number of rows."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with pq.ParquetWriter(str(path), RAW_LOG_SCHEMA) as writer:
        batch: list[tuple[int, int, bytes]] = []
        for msg in messages:
            batch.append(msg)
            if len(batch) >= batch_rows:
                count += _flush(writer, batch)
                batch = []
        count += _flush(writer, batch)
    return count


def _flush(writer: pq.ParquetWriter, batch: list[tuple[int, int, bytes]]) -> int:
    if not batch:
        return 0
    lsns, xids, datas = zip(*batch, strict=True)
    table = pa.Table.from_arrays(
        [pa.array([format_lsn(x) for x in lsns], pa.string()), pa.array(xids, pa.int64()),
         pa.array(datas, pa.binary())], schema=RAW_LOG_SCHEMA)
    writer.write_table(table)
    return len(batch)
