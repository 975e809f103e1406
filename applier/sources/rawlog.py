"""Read a stored raw log: rows ``(lsn, xid, data)`` of pgoutput messages, in log order.

A raw log is what ``pg_logical_slot_peek_binary_changes`` returned, stored for replay or
inspection (``rawlog_writer.py`` writes it). Accepted layouts:

* a Parquet file;
* a directory of Parquet files, read in file-name order (name the parts so they sort);
* a Delta table (a directory with ``_delta_log/``). Read WITHOUT Spark: the JSON commit files are
  replayed (add/remove) to find the live data files, which are then read with pyarrow in commit
  order, in the order each commit lists them. Why no Spark: a Spark read has no row order, while a
  raw log is only meaningful in order. The replay supports what an append-only log needs; a
  table whose early commits were removed after a checkpoint, or that uses deletion vectors,
  column mapping or partitioning, is refused with a SourceError rather than read wrongly.

Columns: ``lsn`` (text like ``0/16B3748`` or int64), ``xid`` (int64), ``data`` (binary). Reading
streams in record batches, so a log larger than memory is fine.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq

from applier.errors import ApplierError, SourceError
from applier.lsn import parse_lsn

__all__ = ["RawMessage", "read_raw_log", "raw_log_files"]

_COLUMNS = ("lsn", "xid", "data")
_COMMIT_FILE = re.compile(r"^(\d{20})\.json$")


@dataclass(frozen=True, slots=True)
class RawMessage:
    lsn: int
    xid: int
    data: bytes


def raw_log_files(path: str | Path) -> list[Path]:
    """The Parquet files of a raw log, in log order."""
    root = Path(path)
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise SourceError("raw log not found", path=str(root))
    if (root / "_delta_log").is_dir():
        return _delta_files(root)
    parts = sorted(p for p in root.iterdir()
                   if p.is_file() and p.suffix == ".parquet" and not p.name.startswith((".", "_")))
    if not parts:
        raise SourceError("no .parquet files in the raw log directory", path=str(root))
    return parts


def _delta_files(table: Path) -> list[Path]:
    log = table / "_delta_log"
    versions = sorted((int(m.group(1)), p) for p in log.iterdir() if (m := _COMMIT_FILE.match(p.name)))
    if not versions or [v for v, _ in versions] != list(range(len(versions))):
        raise SourceError("Delta raw log: commit files are not complete from version 0 (log cleaned up "
                          "after a checkpoint?); cannot recover the append order", path=str(table))
    live: dict[str, None] = {}  # insertion-ordered set: add order = log order
    for version, commit in versions:
        for line in commit.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            action = json.loads(line)
            if "metaData" in action:
                meta = action["metaData"]
                if meta.get("partitionColumns"):
                    raise SourceError("Delta raw log is partitioned; unsupported", path=str(table))
                if meta.get("configuration", {}).get("delta.columnMapping.mode", "none") != "none":
                    raise SourceError("Delta raw log uses column mapping; unsupported", path=str(table))
            elif "add" in action:
                if action["add"].get("deletionVector"):
                    raise SourceError("Delta raw log has deletion vectors; unsupported", path=str(table),
                                      version=version)
                live[unquote(action["add"]["path"])] = None
            elif "remove" in action:
                live.pop(unquote(action["remove"]["path"]), None)
    return [table / rel for rel in live]


def read_raw_log(path: str | Path, *, batch_rows: int = 8192) -> Iterator[RawMessage]:
    """Every message of the raw log at ``path``, in log order, read ``batch_rows`` at a time."""
    for file in raw_log_files(path):
        yield from _read_parquet(file, batch_rows)


def _read_parquet(file: Path, batch_rows: int) -> Iterator[RawMessage]:
    try:
        pf = pq.ParquetFile(str(file))
        names = set(pf.schema_arrow.names)
        missing = [c for c in _COLUMNS if c not in names]
        if missing:
            raise SourceError(f"raw log file lacks column(s) {', '.join(missing)}", path=str(file))
        batches = pf.iter_batches(batch_size=batch_rows, columns=list(_COLUMNS))
        row = 0
        for batch in batches:
            lsns = batch.column(0).to_pylist()
            xids = batch.column(1).to_pylist()
            datas = batch.column(2).to_pylist()
            text_lsn = pa.types.is_string(batch.column(0).type) or pa.types.is_large_string(batch.column(0).type)
            for i in range(len(lsns)):
                lsn, xid, data = lsns[i], xids[i], datas[i]
                if lsn is None or xid is None or data is None:
                    raise SourceError("raw log row has a NULL lsn, xid or data", path=str(file), row=row + i)
                try:
                    yield RawMessage(parse_lsn(lsn) if text_lsn else int(lsn), int(xid), data)
                except ApplierError as e:
                    raise SourceError("raw log row has an invalid LSN", path=str(file), row=row + i) from e
            row += len(lsns)
    except (OSError, pa.ArrowException) as e:
        raise SourceError(f"cannot read raw log file: {e}", path=str(file)) from e
