"""Many row messages scanned at once: numpy over their bytes, no object per message or per column.

Why: folding a range of a backlog one message at a time costs about 5-10 us a change in Python (the
TupleData scan, a value object per column, a row change per message), most of a catch-up's CPU. The
layout of a TupleData (``tupledata.py``) is a walk, but the n-th column of every message can be found
at once: from the array of every message's position at column n, its kind byte, its Int32 length and
so the array of positions at column n + 1. A range of 200,000 changes of 3 columns is a few dozen
numpy operations instead of 600,000 Python steps.

The per-message decoder (``decoder.py``) stays the reference. This module only answers for the plain
shapes, and says None for anything else: a kind or tag out of place, a column count other than the
relation's, a length that does not end exactly at the message's end. The caller then takes the
reference path for the whole range, which reads or reports it precisely.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from applier.protocol import wire
from applier.protocol.headers import (
    CHANGE_OID_AT,
    CHANGE_TAG_AT,
    CHANGE_TUPLE_AT,
    DELETE,
    INSERT,
    NEW_TUPLE,
    OLD_KEY,
    OLD_ROW,
    UPDATE,
)

if TYPE_CHECKING:
    import numpy as np

__all__ = ["MAX_CELLS", "MessageBlock", "RowSpans", "TupleSpans", "message_block", "relation_oids", "scan_row_messages",
           "text_values"]

#: Zero bytes after the last message: a read a few bytes past a message's end (a length read at a
#: NULL column near the end) stays inside the buffer; the exact-end check refuses it afterwards.
_PAD = 8

_TEXT, _BINARY, _NULL, _UNCHANGED = ord("t"), ord("b"), ord("n"), ord("u")


@dataclass(frozen=True, slots=True)
class MessageBlock:
    """Messages back to back in one buffer: message ``i`` is ``buf[starts[i]:starts[i + 1]]``."""

    buf: np.ndarray  # uint8, with _PAD zero bytes after the last message
    starts: np.ndarray  # int64, one more than there are messages
    kinds: np.ndarray  # uint8: each message's first byte (0 for an empty message)

    def __len__(self) -> int:
        return len(self.kinds)

    def uint32_at(self, index: np.ndarray, offset: int) -> np.ndarray:
        """The big-endian UInt32 at ``offset`` of each message of ``index`` (as int64)."""
        return _be32(self.buf, self.starts[index] + offset)


def message_block(datas: Sequence[bytes]) -> MessageBlock:
    """The messages in one buffer (one copy, made in C by ``bytes.join``)."""
    import numpy as np

    lengths = np.fromiter(map(len, datas), dtype=np.int64, count=len(datas))
    starts = np.zeros(len(datas) + 1, dtype=np.int64)
    np.cumsum(lengths, out=starts[1:])
    buf = np.frombuffer(b"".join([*datas, bytes(_PAD)]), dtype=np.uint8)  # not join + pad: a second copy
    kinds = np.where(lengths > 0, buf[np.minimum(starts[:-1], len(buf) - 1)], 0).astype(np.uint8)
    return MessageBlock(buf, starts, kinds)


def commit_fields(block: MessageBlock, begins: np.ndarray, commits: np.ndarray) \
        -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The commit LSN and end LSN (uint64) and the commit time (int64, PostgreSQL's microseconds) of each
    Commit at ``commits``, read from the buffer at once; None when a Begin at ``begins`` or a Commit is not
    of its fixed size (the decoder then says what is wrong). One decode per message cost about a tenth
    of a follow round's fold (two messages for every transaction of pgbench's)."""
    import numpy as np

    starts = block.starts
    if np.any(starts[begins + 1] - starts[begins] != 1 + wire.BEGIN.size) \
            or np.any(starts[commits + 1] - starts[commits] != 1 + wire.COMMIT.size):
        return None
    at = starts[commits][:, None] + np.arange(2, 1 + wire.COMMIT.size)  # past the kind and the flags
    fields = np.ascontiguousarray(block.buf[at])  # (commits, 24): commit LSN, end LSN, commit time
    lsns = fields.view(">u8").astype(np.uint64)
    return lsns[:, 0], lsns[:, 1], fields.view(">i8")[:, 2].astype(np.int64)


@dataclass(frozen=True, slots=True)
class TupleSpans:
    """Column ``c`` of the ``r``-th of some TupleDatas: kind byte ``kinds[c, r]``, value bytes
    ``buf[starts[c, r]:starts[c, r] + lengths[c, r]]`` (length 0 unless 't' or 'b')."""

    kinds: np.ndarray  # (columns, rows) uint8
    starts: np.ndarray  # (columns, rows) int32 (a block of 2 GiB or more is not scanned)
    lengths: np.ndarray  # (columns, rows) int32


@dataclass(frozen=True, slots=True)
class RowSpans:
    """The tuples of Insert, Update and Delete messages of one relation (outside stream blocks)."""

    ops: np.ndarray  # uint8: INSERT, UPDATE or DELETE per message
    old_tags: np.ndarray  # uint8: OLD_KEY, OLD_ROW, or 0 (no old tuple)
    old_rows: np.ndarray  # the messages with an old tuple (a Delete, an Update with one) ...
    old: TupleSpans  # ... and their old tuples, in that order
    new_rows: np.ndarray  # the messages with a new tuple (an Insert or Update) ...
    new: TupleSpans  # ... and their new tuples


#: The most column values one scan lays out (9 bytes each, per tuple): a wider or longer run of
#: messages is the reference path's, so that a range of a very wide table cannot take gigabytes.
MAX_CELLS = 32 << 20


def scan_row_messages(block: MessageBlock, index: np.ndarray, natts: int) -> RowSpans | None:
    """The tuples of the messages ``index`` of ``block``, every one an Insert, Update or Delete outside a
    stream block whose tuples have ``natts`` columns; None when one is not exactly that (or the run
    is over MAX_CELLS values, or the block is 2 GiB or more)."""
    import numpy as np

    buf, size = block.buf, len(block.buf) - _PAD
    if size >= 1 << 31 or natts * len(index) > MAX_CELLS:
        return None
    ops = block.kinds[index]
    start = block.starts[index]
    end = block.starts[index + 1]
    if not np.all((ops == INSERT) | (ops == UPDATE) | (ops == DELETE)) or np.any(end - start < CHANGE_TUPLE_AT + 2):
        return None
    tags = buf[start + CHANGE_TAG_AT]
    has_old = (tags == OLD_KEY) | (tags == OLD_ROW)
    # an Insert has only a new tuple, a Delete only an old one, an Update an optional old one then a new one
    if np.any((ops == INSERT) & has_old) or np.any((ops == DELETE) & ~has_old) \
            or np.any(~has_old & (tags != NEW_TUPLE)):
        return None
    new_at = start + CHANGE_TUPLE_AT
    old_rows = np.flatnonzero(has_old)
    old = _empty(natts)
    if old_rows.size:
        scanned = _scan(buf, start[old_rows] + CHANGE_TUPLE_AT, end[old_rows], natts)
        if scanned is None:
            return None
        old, after = scanned
        deletes = ops[old_rows] == DELETE
        if np.any(after[deletes] != end[old_rows][deletes]):  # a Delete ends with its old tuple
            return None
        updates = old_rows[~deletes]
        after = after[~deletes]
        if np.any(after >= end[updates]) or np.any(buf[after] != NEW_TUPLE):
            return None
        new_at[updates] = after + 1
    new_rows = np.flatnonzero(ops != DELETE)
    new = _empty(natts)
    if new_rows.size:
        scanned = _scan(buf, new_at[new_rows], end[new_rows], natts)
        if scanned is None:
            return None
        new, after = scanned
        if np.any(after != end[new_rows]):
            return None
    return RowSpans(ops, np.where(has_old, tags, 0).astype(np.uint8), old_rows, old, new_rows, new)


def text_values(block: MessageBlock, spans: TupleSpans, column: int) -> Any | None:
    """Column ``column`` of every tuple of ``spans`` as a pyarrow binary array (NULL for 'n'), built
    over the values' bytes without a Python object per value; None when one of them is not 't' or
    'n' (unchanged TOAST 'u' and binary 'b' values are the reference path's)."""
    import numpy as np
    import pyarrow as pa

    kinds = spans.kinds[column]
    text = kinds == _TEXT
    if not np.all(text | (kinds == _NULL)):
        return None
    lengths = np.where(text, spans.lengths[column], 0).astype(np.int64)
    offsets = np.zeros(len(kinds) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    if total >= 1 << 31:  # beyond a binary array's Int32 offsets: the reference path
        return None
    validity = None if text.all() else pa.py_buffer(np.packbits(text, bitorder="little"))
    if total >= _VIEWS_FROM_BYTES * len(kinds):
        views = _views(block.buf, spans.starts[column], lengths)
        return pa.Array.from_buffers(pa.binary_view(), len(kinds), [validity, pa.py_buffer(views),
                                                                    pa.py_buffer(block.buf)]).cast(pa.binary())
    # every value's bytes gathered in order: position k of value r is starts[r] + (k - offsets[r])
    gather = np.repeat(spans.starts[column] - offsets[:-1], lengths) + np.arange(total, dtype=np.int64)
    data = block.buf[gather]
    return pa.Array.from_buffers(pa.binary(), len(kinds), [validity, pa.py_buffer(offsets.astype(np.int32)),
                                                           pa.py_buffer(data)])


#: From this many bytes a value on average, ``text_values`` copies the values with Arrow (views over the
#: block, cast to binary: one memcpy each) rather than gathering them byte by byte with numpy, whose
#: index takes 8 bytes a byte. Measured, 200,000 values: 20 bytes 22 vs 38 ms (the gather wins), 40
#: bytes 54 vs 37, 3 kB 533 vs 19, 300 kB (1,000 values) 2,522 vs 62.
_VIEWS_FROM_BYTES = 32


def _views(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Arrow's binary views (16 bytes a value: Int32 length, then up to 12 bytes of the value inline,
    or its first 4 bytes, buffer 0 and its Int32 offset in ``buf``), padded with zeros."""
    import numpy as np

    n = len(lengths)
    small = lengths <= 12
    at = starts.astype(np.int64)[:, None] + np.arange(12)
    np.minimum(at, len(buf) - 1, out=at)
    shown = np.where(small, lengths, 4)[:, None]
    views = np.zeros((n, 16), dtype=np.uint8)
    views[:, 0:4] = lengths.astype("<i4").view(np.uint8).reshape(n, 4)
    views[:, 4:16] = np.where(np.arange(12) < shown, buf[at], 0)
    large = np.flatnonzero(~small)
    views[large, 12:16] = starts[large].astype("<i4").view(np.uint8).reshape(len(large), 4)  # buffer 0: zeros
    return views


def relation_oids(block: MessageBlock, index: np.ndarray) -> np.ndarray:
    """The relation OID of each row message of ``index`` (outside stream blocks; at least 5 bytes long)."""
    return block.uint32_at(index, CHANGE_OID_AT)


def _empty(natts: int, rows: int = 0) -> TupleSpans:
    import numpy as np

    return TupleSpans(np.zeros((natts, rows), dtype=np.uint8), np.zeros((natts, rows), dtype=np.int32),
                      np.zeros((natts, rows), dtype=np.int32))


def _scan(buf: np.ndarray, at: np.ndarray, end: np.ndarray, natts: int) -> tuple[TupleSpans, np.ndarray] | None:
    """TupleDatas at positions ``at`` of messages ending at ``end``: their spans and the position after
    each, or None when one is not a TupleData of ``natts`` columns inside its message."""
    import numpy as np

    if np.any(at + 2 > end) or np.any(((buf[at].astype(np.int64) << 8) | buf[at + 1]) != natts):
        return None
    spans = _empty(natts, len(at))
    p = at + 2
    for column in range(natts):
        if np.any(p >= end):  # a column missing (and every read below stays inside the buffer)
            return None
        kind = buf[p]
        sized = (kind == _TEXT) | (kind == _BINARY)
        if not np.all(sized | (kind == _NULL) | (kind == _UNCHANGED)):
            return None
        length = np.where(sized, _be32(buf, p + 1), 0)
        spans.kinds[column] = kind
        spans.starts[column] = p + 5
        p = np.where(sized, p + 5 + length, p + 1)  # lengths read unsigned: a bad one overruns its message
        if np.any(p > end):
            return None
        spans.lengths[column] = length  # (at most the message's size here: it fits an int32)
    return spans, p


def _be32(buf: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The big-endian UInt32 at each position ``at`` of ``buf`` (as int64): one gather from a view whose
    n-th element is the 4 bytes from byte n (stride 1), three times faster than four byte gathers."""
    import numpy as np

    words = np.ndarray(shape=(len(buf) - 3,), dtype=">u4", buffer=buf, strides=(1,))
    value: np.ndarray = words[at].astype(np.int64)
    return value
