"""Column readers of the initial copy's fast path: PostgreSQL's CSV text of one chunk -> Arrow columns
with exactly the values the stream's per-value parsers (applier/values/) give.

Why: a table with one date, timestamp, numeric or float column used to take the per-value Python
path for every column (about ten times slower). Here each column is read by the cheapest reader that
is exact for its type:

- ``native``: pyarrow's CSV reader builds the column itself (integers, booleans, every type the
  stream keeps as PostgreSQL's own text: text, uuid, json(b), enums, time, interval, unconstrained
  numeric, ...);
- ``cast``: the CSV text is read as a string column and cast by Arrow (dates, timestamps with and
  without time zone, numeric(p, s) as DECIMAL(p, s), float4/float8 with NaN/±Infinity and -0);
  float4 goes through float64 first, as the stream's parser does (``float4_text``);
- ``bytea``: the ``\\x..`` hex text decoded with numpy;
- ``python``: the stream's own text parser per value, for this column only (arrays, anything
  else).

The copy session is pinned like the walsender (DateStyle=ISO, TimeZone=UTC, extra_float_digits=3,
bytea_output=hex: ``open_snapshot`` -> ``pin_session``), so the text is the stream's text.

Values the Spark type cannot hold (date/timestamp ±infinity, BC or 5-digit years, numeric
NaN/±Infinity in a DECIMAL column, array bounds) are not decided here: a reader that meets one, or
any value it cannot read, returns None for the whole chunk, and the caller copies that chunk on the
per-value path, which applies ``apply.special_values`` (or raises) exactly as the stream does.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from applier.values import datetime as dt
from applier.values import numeric, scalars
from applier.values.scalars import NotText
from applier.values.special import Unrepresentable

if TYPE_CHECKING:
    import pyarrow as pa

    from applier.catalog import TypeCache
    from applier.protocol.messages import Relation

#: The text parsers whose result pyarrow's CSV reader gives itself (text: the string as it is).
_NATIVE = (scalars.text_str, scalars.int_text, scalars.bool_text, numeric.numeric_text_to_str)
_DATE, _TS = (dt.date_text,), (dt.timestamp_text, dt.timestamptz_text)
_CAST = (numeric.numeric_text_to_decimal, scalars.float_text, scalars.float4_text)

#: What a reader may raise on a value it cannot read exactly; the chunk then takes the per-value path.
_FALLBACK_ERRORS: tuple[type[BaseException], ...] = (
    ValueError, TypeError, OverflowError, ArithmeticError, IndexError, UnicodeError, struct.error,
    Unrepresentable, NotText)


class NotFast(Exception):
    """A chunk holds a value a fast reader does not give exactly: copy it on the per-value path."""


Convert = Callable[[Any], Any]  # a pyarrow ChunkedArray of CSV text -> the column's ChunkedArray


@dataclass(frozen=True, slots=True)
class ColumnReader:
    """How one column of a chunk is read: the type pyarrow's CSV reader builds, then a conversion."""

    kind: str  # native, cast, date, timestamp, bytea, python (for messages and tests)
    csv_type: Any  # pyarrow DataType the CSV reader produces
    target: Any  # pyarrow DataType of the column (the Spark mapping's Arrow type)
    convert: Convert | None  # None: the CSV reader's column is the value


def column_readers(relation: Relation, types: TypeCache | None, schema: pa.Schema) -> list[ColumnReader] | None:
    """One reader per column, or None when the table has no columns (CSV lines of no columns are not
    rows to pyarrow; the per-value path counts them)."""
    if not relation.columns:
        return None
    import pyarrow as pa

    from applier.values.registry import handler_for

    out: list[ColumnReader] = []
    for col, field in zip(relation.columns, schema, strict=True):
        text = handler_for(col.type_oid, col.type_modifier, types).text
        target = field.type
        if text in _NATIVE:
            out.append(ColumnReader("native", target, target, None))
        elif text in _DATE:
            out.append(ColumnReader("date", pa.string(), target, _datetime_reader(target, date=True)))
        elif text in _TS:
            out.append(ColumnReader("timestamp", pa.string(), target, _datetime_reader(target, date=False)))
        elif text in _CAST:
            out.append(ColumnReader("cast", pa.string(), target, _cast_reader(target)))
        elif text is scalars.bytea_text:
            out.append(ColumnReader("bytea", pa.binary(), target, _bytea))
        else:
            out.append(ColumnReader("python", pa.string(), target, _python_reader(text, target)))
    return out


def convert_chunk(table: Any, readers: list[ColumnReader], names: list[str]) -> Any | None:
    """The chunk read by the CSV reader (columns in order) as the copy's Arrow table, or None when one
    of its values must take the per-value path."""
    import pyarrow as pa

    columns = []
    try:
        for column, reader in zip(table.columns, readers, strict=True):
            columns.append(column if reader.convert is None else reader.convert(column))
    except (NotFast, pa.ArrowException, *_FALLBACK_ERRORS):
        return None
    return pa.Table.from_arrays(columns, names=names)


def text_column(values: Any, reader: ColumnReader) -> Any | None:
    """A column of the stream's text values (a pyarrow binary array, SQL NULL as null: what
    ``applier.protocol.columnar.text_values`` builds from row messages) read as the copy reads the same
    text from CSV, or None when a value must take the per-value path, or the column is one the copy
    reads per value anyway ('python'). The text is the same: the walsender's session is pinned as the
    copy's is (applier.sources.snapshot.pin_session), and the CSV reader only removed the quoting."""
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        if reader.kind == "python":
            return None
        if reader.convert is not None:
            converted = reader.convert(pa.chunked_array([pc.cast(values, reader.csv_type)]))
            return converted.combine_chunks() if isinstance(converted, pa.ChunkedArray) else converted
        # native: what pyarrow's CSV reader builds itself (the cast to string checks the UTF-8)
        target = reader.target
        if pa.types.is_string(target) or pa.types.is_large_string(target) or pa.types.is_integer(target):
            return pc.cast(pc.cast(values, pa.string()), target)
        if pa.types.is_boolean(target):
            true, false = pc.equal(values, pa.scalar(b"t")), pc.equal(values, pa.scalar(b"f"))
            return true if pc.all(pc.or_(true, false)).as_py() is not False else None
    except (NotFast, pa.ArrowException, *_FALLBACK_ERRORS):
        return None
    return None


# --- readers ---------------------------------------------------------------------------------------

def _cast_reader(target: Any) -> Convert:
    """numeric(p, s) -> DECIMAL(p, s) (NaN/±Infinity, or a value that needs rounding, fail the cast),
    float8 -> double, float4 -> double -> float (the stream's float4_text rounds the same way)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    via = pa.float64() if pa.types.is_float32(target) else None

    def convert(column: Any) -> Any:
        if via is not None:
            column = pc.cast(column, via)
        return pc.cast(column, target)
    return convert


def _datetime_reader(target: Any, *, date: bool) -> Convert:
    """date / timestamp / timestamptz text ('2021-03-04 05:06:07.123456+00' with TimeZone=UTC). A value
    outside years 1..9999 or infinite is spelled so that it never looks like 'YYYY-': ±infinity,
    5+ digit years; BC years end in ' BC'."""
    import pyarrow.compute as pc

    def convert(column: Any) -> Any:
        if date:
            odd = pc.any(pc.not_equal(pc.utf8_length(column), 10)).as_py()
        else:
            odd = (pc.any(pc.not_equal(pc.utf8_slice_codeunits(column, 4, 5), "-")).as_py()
                   or pc.any(pc.ends_with(column, " BC")).as_py())
        if odd:
            raise NotFast("a date/time value outside years 1..9999 or infinite")
        return pc.cast(column, target)
    return convert


def _python_reader(text: Callable[[bytes], object], target: Any) -> Convert:
    """The stream's own parser per value, for this column only (arrays and other rare types)."""
    import pyarrow as pa

    def convert(column: Any) -> Any:
        values = [None if v is None else text(v.encode("utf-8")) for v in column.to_pylist()]
        return pa.chunked_array([pa.array(values, type=target, from_pandas=False)], type=target)
    return convert


@cache
def _hex_table() -> Any:
    import numpy as np

    lut = np.full(256, 0xFF, dtype=np.uint8)
    for i, ch in enumerate(b"0123456789abcdef"):
        lut[ch] = i
    for i, ch in enumerate(b"ABCDEF"):
        lut[ch] = 10 + i
    return lut


def _bytea(column: Any) -> Any:
    """bytea's hex output (``\\x`` then two hex digits per byte) -> binary, without a Python object per
    value: the prefixes are dropped by a mask and the digit pairs combined through a lookup table."""
    import numpy as np
    import pyarrow as pa

    lut = _hex_table()
    out = []
    for chunk in column.chunks:
        n = len(chunk)
        bufs = chunk.buffers()
        offsets = np.frombuffer(bufs[1], dtype=np.int32)[chunk.offset:chunk.offset + n + 1].astype(np.int64)
        data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
        valid = chunk.is_valid().to_numpy(zero_copy_only=False)
        starts, ends = offsets[:-1][valid], offsets[1:][valid]
        lengths = ends - starts
        if np.any(lengths < 2) or np.any(lengths % 2):
            raise NotFast("bytea text that is not hex")
        if starts.size and (np.any(data[starts] != ord("\\")) or np.any(data[starts + 1] != ord("x"))):
            raise NotFast("bytea text that is not hex")
        base, stop = int(offsets[0]), int(offsets[-1])
        marks = np.zeros(stop - base + 1, dtype=np.int32)
        marks[starts + 2 - base] += 1  # starts are distinct, and so are ends (every value has >= 2 bytes)
        marks[ends - base] -= 1
        digits = data[base:stop][np.cumsum(marks[:-1]) > 0]
        hi, lo = lut[digits[0::2]], lut[digits[1::2]]
        if np.any(hi == 0xFF) or np.any(lo == 0xFF):
            raise NotFast("bytea text that is not hex")
        decoded = (hi << 4) | lo
        sizes = np.zeros(n, dtype=np.int64)
        sizes[valid] = (lengths - 2) // 2
        new_offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
        mask = pa.array(valid).buffers()[1] if chunk.null_count else None
        out.append(pa.Array.from_buffers(pa.binary(), n, [mask, pa.py_buffer(new_offsets.tobytes()),
                                                          pa.py_buffer(decoded.tobytes())],
                                         null_count=chunk.null_count))
    return pa.chunked_array(out, type=pa.binary())
