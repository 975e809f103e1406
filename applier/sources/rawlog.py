"""Read a stored raw log: rows ``(lsn, xid, data)`` of pgoutput messages, in log order.

A raw log is what ``pg_logical_slot_peek_binary_changes`` returned, stored for replay or
inspection (``rawlog_writer.py`` and ``applier capture`` write it). Accepted layouts:

* a Parquet file, or a directory of Parquet files;
* a Delta table (a directory with ``_delta_log/``), read through delta-rs (``deltalake``): no JVM,
  and checkpoints, cleaned-up JSON commits and compacted (OPTIMIZE) files are all fine.

Log order: when the rows carry ``seq`` (``applier capture`` writes it), they are read in ``seq``
order whatever the file layout - files are ordered by their ``seq`` range and a file whose rows
are not in ``seq`` order (OPTIMIZE may write them so) is sorted; a ``seq`` seen twice or a gap
between two rows is refused (rows lost or doubled). Without ``seq`` the order is the file order:
a Parquet directory's part names, a Delta table's commit order (each version's new files; a
compacted table without ``seq`` has lost that order and is refused).

Then, before anything is yielded, the whole log is checked for transaction order and duplicates
(:mod:`applier.protocol.order`): a log whose parts were concatenated in the wrong order, whose
transactions or changes were swapped, or that holds a message or transaction twice is refused
with a SourceError naming the row and LSN. That costs one more pass over the headers, and it is
what makes a replay stop before it writes anything from such a log instead of after.

Columns: ``lsn`` (text like ``0/16B3748``, or an integer), ``xid`` (integer), ``data`` (binary),
optional ``seq`` (integer) and ``catalog`` (text: the catalog note ``applier capture`` stores on a
Relation row, NULL elsewhere; see applier.sources.catalog_lookup), which travels with its message
(``RawMessage.catalog``); a file of the log without it (written before it existed) reads as NULL.
A column of any other type is a SourceError naming it. Reading streams
in record batches per file, so a log larger than memory is fine.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from applier.errors import ApplierError, InputError, SourceError
from applier.lsn import parse_lsn
from applier.storage.options import deltalake_options
from applier.storage.paths import StorePath, location

__all__ = ["LogFile", "RawMessage", "read_raw_log", "raw_log_files", "log_batches", "log_message_count",
           "read_file_rows", "file_order_is_log_order", "catalog_notes"]

_COLUMNS = ("lsn", "xid", "data")
_NOTE = "catalog"
_EXPECTED = {"lsn": "text (like 0/16B3748) or integer", "xid": "integer", "data": "binary", "seq": "integer",
             _NOTE: "text"}


class RawLogFormatError(SourceError, InputError):
    """The file or table given as a raw log is not one (columns, types, layout): fix the path."""


@dataclass(frozen=True, slots=True)
class RawMessage:
    lsn: int
    xid: int
    data: bytes
    catalog: str | None = None  # a Relation row's catalog note (applier capture), when the log has one


#: A raw log's file: a local path, or an object on a store (``s3://...``, read through pyarrow's file system).
LogFile = Path | StorePath


def raw_log_files(path: str | Path) -> list[LogFile]:
    """The data files of a raw log, in file order (Parquet names, or Delta commit order)."""
    where = location(str(path))
    if isinstance(where, StorePath):
        return _store_files(where)
    root = where
    if root.is_file():
        single: list[LogFile] = [root]
        return single
    if not root.is_dir():
        raise SourceError("raw log not found", path=str(root))
    if (root / "_delta_log").is_dir():
        return _delta_files(root)
    parts: list[LogFile] = sorted(p for p in root.iterdir() if p.is_file() and _is_part(p))
    if not parts:
        raise RawLogFormatError("no .parquet files in the raw log directory", path=str(root))
    return parts


def _is_part(file: LogFile) -> bool:
    """A Parquet part of a raw log directory (hidden and ``_``-prefixed files are not)."""
    return file.suffix == ".parquet" and not file.name.startswith((".", "_"))


def _store_files(root: StorePath) -> list[LogFile]:
    """``raw_log_files`` of a log on an object store: one ``.parquet`` object, a Delta table, or a prefix
    of Parquet objects."""
    if root.suffix == ".parquet":
        return [root]
    if (root / "_delta_log").is_dir():
        return _delta_files(root)
    parts: list[LogFile] = sorted(p for p in root.files() if _is_part(p))
    if not parts:
        raise RawLogFormatError("no raw log (Parquet objects or a Delta table) at this location", path=str(root))
    return parts


def _delta_table(table: LogFile, version: int | None = None):  # type: ignore[no-untyped-def]  # deltalake is untyped here
    from deltalake import DeltaTable

    try:
        return DeltaTable(str(table), version=version, storage_options=deltalake_options(str(table)))
    except Exception as e:  # noqa: BLE001  # delta-rs raises its own classes; say which table
        raise SourceError(f"cannot open Delta raw log: {type(e).__name__}: {str(e).splitlines()[0]}",
                          path=str(table), version=version) from None


def _delta_files(table: LogFile) -> list[LogFile]:
    """The live files of a Delta raw log. With ``seq`` their order does not matter (rows are merged
    by it); without, it is the commit order, recovered version by version through delta-rs."""
    dt = _delta_table(table)
    if dt.metadata().partition_columns:
        raise RawLogFormatError("Delta raw log is partitioned; unsupported", path=str(table))
    config = dt.metadata().configuration or {}
    if config.get("delta.columnMapping.mode", "none") != "none":
        raise RawLogFormatError("Delta raw log uses column mapping; unsupported", path=str(table))
    if "deletionVectors" in (dt.protocol().reader_features or []):
        raise RawLogFormatError("Delta raw log has deletion vectors enabled; unsupported", path=str(table))
    live = [_local(table, uri) for uri in dt.file_uris()]
    if "seq" in {f.name for f in dt.schema().fields}:
        return live
    ordered: list[LogFile] = []
    seen: set[LogFile] = set()
    for version in range(dt.version() + 1):
        files = {_local(table, uri) for uri in _delta_table(table, version).file_uris()}
        if not seen <= files:
            raise SourceError("Delta raw log without a seq column was compacted or rewritten: its "
                              "row order is lost; write it with `applier capture` (which adds seq)",
                              path=str(table), version=version)
        ordered += sorted(files - seen, key=str)  # one commit's files: a commit appends them in name order
        seen = files
    return ordered


def _local(table: LogFile, uri: str) -> LogFile:
    from urllib.parse import unquote, urlparse

    if isinstance(table, StorePath):
        return StorePath(uri) if "://" in uri else table / uri
    if uri.startswith("file:"):
        return Path(unquote(urlparse(uri).path))
    p = Path(uri)
    return p if p.is_absolute() else table / p


def read_raw_log(path: str | Path, *, batch_rows: int = 8192, check_order: bool = True) -> Iterator[RawMessage]:
    """Every message of the raw log at ``path``, in log order, read ``batch_rows`` at a time.

    ``check_order`` (the default) first reads the whole log once and refuses one that is out of
    order or holds duplicates (see the module docstring); ``inspect`` turns it off and reports
    every such problem itself."""
    files = raw_log_files(path)
    if check_order:
        from applier.protocol.order import OrderChecker

        checker = OrderChecker()
        check = checker.check
        for batch, _file, _first in _batches(files, batch_rows):  # columns only: no message objects
            lsns = batch.column(0).to_pylist()
            if _text_lsn(batch):
                lsns = [None if v is None else parse_lsn(v) for v in lsns]
            for lsn, data in zip(lsns, batch.column(2).to_pylist(), strict=True):
                problems = check(lsn, data) if lsn is not None and data is not None else None
                if problems:
                    err = problems[0].error()
                    err.add_context(path=str(path))
                    raise err
    for batch, file, first in _batches(files, batch_rows):
        yield from _rows(batch, file, first)


def log_message_count(path: str | Path) -> int:
    """How many messages the raw log holds (its files' Parquet footers; no row is read)."""
    return sum(_open(f).metadata.num_rows for f in raw_log_files(path))


def log_batches(path: str | Path, batch_rows: int = 65_536) -> Iterator[tuple[pa.RecordBatch | pa.Table, LogFile, int]]:
    """The log's rows in log order, as Arrow batches with the file they come from and the first row's
    number in it (in the sorted cluster when the rows carry ``seq``; see file_order_is_log_order)."""
    return _batches(raw_log_files(path), batch_rows)


def batch_rows(batch: pa.RecordBatch | pa.Table, file: LogFile, first_row: int) -> Iterator[RawMessage]:
    """The messages of one batch of log_batches, checked as read_raw_log checks them."""
    return _rows(batch, file, first_row)


def file_order_is_log_order(path: str | Path) -> str | None:
    """None when every file's rows are in log order and the files follow each other (so rows
    ``start:stop`` of a file are a piece of the log, read_file_rows reads them); otherwise why not.
    Logs without ``seq`` always are; with it, each file must hold an ascending ``seq`` range of its own
    (what ``applier capture`` writes; an OPTIMIZE may merge or reorder them)."""
    files = raw_log_files(path)
    if not any(_has_seq(f) for f in files):
        return None
    ranges: list[tuple[int, int]] = []
    for file in files:
        seqs = _open(file).read(columns=["seq"]).column(0)
        if len(seqs) > 1 and not pc.all(pc.greater(seqs[1:], seqs[:-1])).as_py():
            return f"the rows of {file.name} are not in seq order"
        if len(seqs):
            ranges.append((seqs[0].as_py(), seqs[-1].as_py()))
    ranges.sort()
    if any(b[0] <= a[1] for a, b in zip(ranges, ranges[1:], strict=False)):
        return "files with overlapping seq ranges"
    return None


def read_file_rows(file: str | Path, start: int, stop: int) -> Iterator[RawMessage]:
    """Rows ``start:stop`` of one raw log file, reading only the row groups that hold them."""
    where = location(str(file))
    try:
        pf = _open(where)
        offset = 0
        for group in range(pf.num_row_groups):
            n = pf.metadata.row_group(group).num_rows
            if offset < stop and offset + n > start:
                lo, hi = max(start - offset, 0), min(stop - offset, n)
                table = pf.read_row_group(group, columns=list(_COLUMNS)).slice(lo, hi - lo)
                yield from _rows(table, where, offset + lo)
            offset += n
            if offset >= stop:
                return
    except (OSError, pa.ArrowException) as e:
        raise SourceError(f"cannot read raw log file: {e}", path=str(file)) from e


def _batches(files: list[LogFile], batch_rows: int) -> Iterator[tuple[pa.RecordBatch | pa.Table, LogFile, int]]:
    """The log's rows in log order as (batch, file, first row's number in it): the order check reads
    the columns, the messages are built from them once, only on the second pass."""
    if not any(_has_seq(f) for f in files):
        for file in files:
            yield from _read_parquet(file, batch_rows)
        return
    yield from _by_seq(files, batch_rows)


def _text_lsn(batch: pa.RecordBatch | pa.Table) -> bool:
    t = batch.column(0).type
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t))


# -- reading ---------------------------------------------------------------------------------------


def _open(file: LogFile) -> pq.ParquetFile:
    try:
        pf = pq.ParquetFile(file.open_input_file() if isinstance(file, StorePath) else str(file))
    except (OSError, pa.ArrowException) as e:
        raise SourceError(f"cannot read raw log file: {e}", path=str(file)) from e
    schema = pf.schema_arrow
    missing = [c for c in _COLUMNS if c not in schema.names]
    if missing:
        raise RawLogFormatError(f"raw log file lacks column(s) {', '.join(missing)}", path=str(file))
    for name in (*_COLUMNS, "seq", _NOTE):
        if name in schema.names and not _type_ok(name, schema.field(name).type):
            raise RawLogFormatError(f"raw log column {name} has type {schema.field(name).type}, expected "
                              f"{_EXPECTED[name]}", path=str(file), column=name)
    return pf


def _type_ok(name: str, t: pa.DataType) -> bool:
    if name == "lsn":
        return bool(pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t))
    if name == "data":
        return bool(pa.types.is_binary(t) or pa.types.is_large_binary(t))
    if name == _NOTE:
        return bool(pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_null(t))
    return bool(pa.types.is_integer(t))


def _columns_of(pf: pq.ParquetFile) -> list[str]:
    """The columns read for messages: lsn, xid, data, and the catalog note when the file has it."""
    return [*_COLUMNS, _NOTE] if _NOTE in pf.schema_arrow.names else list(_COLUMNS)


def catalog_notes(path: str | Path) -> list[str]:
    """The log's catalog notes in log order, reading only the ``catalog`` and ``seq`` columns (a log
    without notes: none). For a look at what the log records before replaying it."""
    files = raw_log_files(path)
    by_seq = any(_has_seq(f) for f in files)
    found: list[tuple[int, int, str]] = []
    for n, file in enumerate(files):
        try:
            pf = _open(file)
            if _NOTE not in pf.schema_arrow.names:
                continue
            table = pf.read(columns=[_NOTE, "seq"] if by_seq else [_NOTE])
        except (OSError, pa.ArrowException) as e:
            raise SourceError(f"cannot read raw log file: {e}", path=str(file)) from e
        notes = table.column(0).to_pylist()
        seqs = table.column(1).to_pylist() if by_seq else [None] * len(notes)
        found += [(n if seq is None else seq, row, note)  # (seq, -) or (file, row): log order
                  for row, (seq, note) in enumerate(zip(seqs, notes, strict=True)) if note is not None]
    found.sort(key=lambda f: (f[0], f[1]))
    return [note for _k, _r, note in found]


def _has_seq(file: LogFile) -> bool:
    return "seq" in _open(file).schema_arrow.names


def _read_parquet(file: LogFile, batch_rows: int) -> Iterator[tuple[pa.RecordBatch, LogFile, int]]:
    try:
        pf = _open(file)
        row = 0
        for batch in pf.iter_batches(batch_size=batch_rows, columns=_columns_of(pf)):
            yield batch, file, row
            row += batch.num_rows
    except (OSError, pa.ArrowException) as e:
        raise SourceError(f"cannot read raw log file: {e}", path=str(file)) from e


def _rows(batch: pa.RecordBatch | pa.Table, file: LogFile, first_row: int) -> Iterator[RawMessage]:
    lsns = batch.column(0).to_pylist()
    xids = batch.column(1).to_pylist()
    datas = batch.column(2).to_pylist()
    text_lsn = _text_lsn(batch)
    at = batch.schema.get_field_index(_NOTE)
    notes = batch.column(at).to_pylist() if at >= 0 else [None] * len(lsns)
    for i in range(len(lsns)):
        lsn, xid, data = lsns[i], xids[i], datas[i]
        if lsn is None or xid is None or data is None:
            raise SourceError("raw log row has a NULL lsn, xid or data", path=str(file), row=first_row + i)
        try:
            yield RawMessage(parse_lsn(lsn) if text_lsn else int(lsn), int(xid), data, notes[i])
        except ApplierError as e:
            raise SourceError("raw log row has an invalid LSN", path=str(file), row=first_row + i) from e


def _by_seq(files: list[LogFile], batch_rows: int) -> Iterator[tuple[pa.Table, LogFile, int]]:
    """Rows of files that carry ``seq``, in ``seq`` order: files ordered by their ``seq`` range,
    files whose ranges overlap read together and sorted, a duplicate or a gap refused."""
    ranges: list[tuple[int, int, LogFile]] = []
    for file in files:
        try:
            seqs = _open(file).read(columns=["seq"]).column(0)
        except (OSError, pa.ArrowException) as e:
            raise SourceError(f"cannot read raw log file: {e}", path=str(file)) from e
        if seqs.null_count:
            raise SourceError("raw log row has a NULL seq", path=str(file))
        if len(seqs):
            bounds = pc.min_max(seqs)
            ranges.append((bounds["min"].as_py(), bounds["max"].as_py(), file))
    ranges.sort(key=lambda r: (r[0], r[1]))
    clusters: list[list[LogFile]] = []
    top: int | None = None
    for low, high, file in ranges:
        if top is not None and low <= top:
            clusters[-1].append(file)
        else:
            clusters.append([file])
        top = high if top is None else max(top, high)
    previous: int | None = None
    for cluster in clusters:
        try:
            parts = [(pf := _open(f)).read(columns=[*_columns_of(pf), "seq"]) for f in cluster]
            if any(_NOTE in t.schema.names for t in parts):  # files from before the column: NULL notes
                parts = [t if _NOTE in t.schema.names else t.append_column(_NOTE, pa.nulls(t.num_rows, pa.string()))
                         for t in parts]
            table = pa.concat_tables(parts, promote_options="permissive")
        except (OSError, pa.ArrowException) as e:
            raise SourceError(f"cannot read raw log file: {e}", path=str(cluster[0])) from e
        table = table.sort_by("seq")
        seqs = table.column("seq").to_pylist()
        for seq in seqs:
            if previous is not None and seq != previous + 1:
                what = "seen twice" if seq == previous else f"missing after {previous}"
                raise SourceError(f"raw log rows out of sequence: seq {seq} {what} (rows lost or "
                                  f"doubled)", path=str(cluster[0]), seq=seq)
            previous = seq
        for start in range(0, table.num_rows, batch_rows):
            yield table.slice(start, batch_rows), cluster[0], start
