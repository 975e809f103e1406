"""Row changes read straight from an Insert's, Update's or Delete's bytes, for the common shapes.

The folds of ranges (applier.drivers.distributed, through ``TransactionFeeder.feed_range``) spend
most of their CPU turning each message into a row change: the decoder builds an Insert/Update/Delete
and its TupleData, the values layer converts the TupleData, rowchanges builds the TableChange. For the
shapes a busy slot mostly carries (outside a stream block; every column text 't' or NULL 'n') that
is three layers of objects for one tuple of values. :class:`ShortRowReader` reads those bytes in one
loop and converts them with the same per-column parsers (``RowConverter.text_parsers``), and returns
None for anything else: another column kind (binary, unchanged TOAST), a length that does not add up,
a column count that differs from the Relation, a value a parser refuses. The caller then takes the
long way (decode, convert, row_change) for that message, which is the reference and raises the
precise error or applies the special-value policy. So for every message the result is the long way's,
field for field: tests/unit/assembly/test_short_rows.py checks it on bytes captured from real servers and
on the random workloads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import call as _call
from struct import Struct
from struct import error as StructError
from typing import Any

from applier.changes import TableChange
from applier.infra.fastobj import fast_constructor

_change: Callable[..., TableChange] = fast_constructor(TableChange)

#: A TupleData value's Int32 length, read unsigned: a negative one (never valid) pushes the position
#: past the end, and the final length check refuses the message.
_LENGTH = Struct("!I").unpack_from


class ShortRowReader:
    """Reads the common Insert/Update/Delete messages of one schema version into TableChanges."""

    __slots__ = ("_parsers", "_natts", "_key_indexes")

    def __init__(self, text_parsers: Sequence[Callable[[bytes], object]], key_indexes: Sequence[int]) -> None:
        self._parsers = tuple(text_parsers)
        self._natts = len(self._parsers)
        self._key_indexes = tuple(key_indexes)

    def read(self, data: bytes, ordinal: int) -> TableChange | None:
        """The row change of ``data`` (an I/U/D message outside a stream block), the ``ordinal``-th
        change of its transaction; None when it is not one of the shapes read here (see the module)."""
        try:
            kind = data[0]
            tag = data[5]
            if kind == 73:  # 'I'
                if tag != 78:  # 'N'
                    return None
                new, end = self._tuple(data, 6)
                if new is None or end != len(data):
                    return None
                return _change("I", None, None, new, ordinal, False)
            if kind == 85:  # 'U'
                old_key = old_row = None
                pos = 6
                if tag == 75 or tag == 79:  # 'K', 'O'
                    old, pos = self._tuple(data, 6)
                    if old is None:
                        return None
                    if tag == 79:
                        old_row = old
                    else:
                        old_key = tuple([old[i] for i in self._key_indexes])
                    tag = data[pos]
                    pos += 1
                if tag != 78:
                    return None
                new, end = self._tuple(data, pos)
                if new is None or end != len(data):
                    return None
                return _change("U", old_key, old_row, new, ordinal, False)
            if kind == 68 and (tag == 75 or tag == 79):  # 'D' with 'K' or 'O'
                old, end = self._tuple(data, 6)
                if old is None or end != len(data):
                    return None
                if tag == 79:
                    return _change("D", None, old, None, ordinal)
                return _change("D", tuple([old[i] for i in self._key_indexes]), None, None, ordinal)
            return None
        except (IndexError, StructError):
            return None

    def _tuple(self, data: bytes, pos: int, _length: Callable[[bytes, int], tuple[int]] = _LENGTH,
               _map: Any = map, _as_tuple: Any = tuple) -> tuple[tuple[object, ...] | None, int]:
        """The converted values of the TupleData at ``pos`` and the position after it, or (None, pos)
        when a column is neither 't' nor 'n', the column count differs, or a parser refuses a value."""
        natts = (data[pos] << 8) | data[pos + 1]
        if natts != self._natts:
            return None, pos
        p = pos + 2
        values: list[bytes | None] = [None] * natts
        nulls = False
        for i in range(natts):
            kind = data[p]
            if kind == 116:  # 't'
                start = p + 5
                p = start + _length(data, p + 1)[0]
                values[i] = data[start:p]
            elif kind == 110:  # 'n'
                p += 1
                nulls = True
            else:
                return None, pos
        if p > len(data):
            return None, pos
        try:
            if not nulls:
                return _as_tuple(_map(_call, self._parsers, values)), p
            return _as_tuple([None if v is None else f(v) for f, v in zip(self._parsers, values, strict=True)]), p
        except Exception:  # noqa: BLE001 - the long way gives the precise error or applies the policy
            return None, pos
