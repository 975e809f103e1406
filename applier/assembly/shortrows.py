"""Row changes read straight from an Insert's, Update's or Delete's bytes, for the common shapes.

The folds of ranges (applier.drivers.executors, through ``TransactionFeeder.feed_range``) spend
most of their CPU turning each message into a row change: the decoder builds an Insert/Update/Delete
and its TupleData, the values layer converts the TupleData, rowchanges builds the TableChange. For the
shapes a busy slot mostly carries (outside a stream block; every column text 't' or NULL 'n') that
is three layers of objects for one tuple of values. :class:`ShortRowReader` has those bytes scanned in
place by the decoder's own TupleData scanner (``applier.protocol.tupledata.scan_row_change``: the
layout is protocol's business, not this module's) and converts the value spans with the same
per-column parsers (``RowConverter.text_parsers``), and returns
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
from typing import Any

from applier.changes import TableChange
from applier.infra.fastobj import fast_constructor
from applier.protocol.headers import DELETE, INSERT, OLD_ROW, UPDATE
from applier.protocol.tupledata import ALL_TEXT, SCAN_ERRORS, RowScan, scan_row_change

_change: Callable[..., TableChange] = fast_constructor(TableChange)


class ShortRowReader:
    """Reads the common Insert/Update/Delete messages of one schema version into TableChanges."""

    __slots__ = ("_parsers", "_natts", "_key_indexes", "_all_text")

    def __init__(self, text_parsers: Sequence[Callable[[bytes], object]], key_indexes: Sequence[int]) -> None:
        self._parsers = tuple(text_parsers)
        self._natts = len(self._parsers)
        self._key_indexes = tuple(key_indexes)
        # the scanner's kinds of an all-text tuple of this width (shared: compared by identity)
        self._all_text = ALL_TEXT[self._natts] if self._natts < len(ALL_TEXT) else None

    def read(self, data: bytes, ordinal: int, _scan: Callable[[bytes], RowScan] = scan_row_change,
             _errors: Any = SCAN_ERRORS) -> TableChange | None:
        """The row change of ``data`` (an I/U/D message outside a stream block), the ``ordinal``-th
        change of its transaction; None when it is not one of the shapes read here (see the module).
        The bytes are protocol's: scanned by applier.protocol.tupledata, converted here."""
        try:
            kind, old_tag, old_kinds, old_values, new_kinds, new_values = _scan(data)
        except _errors:
            return None
        convert = self._values
        if kind == INSERT:
            new = convert(new_kinds, new_values)  # type: ignore[arg-type]  # an Insert has a new tuple
            return None if new is None else _change("I", None, None, new, ordinal, False)
        old_key = old_row = None
        if old_values is not None:
            old = convert(old_kinds, old_values)
            if old is None:
                return None
            if old_tag == OLD_ROW:
                old_row = old
            else:
                old_key = tuple([old[i] for i in self._key_indexes])
        if kind == UPDATE:
            new = convert(new_kinds, new_values)  # type: ignore[arg-type]  # an Update has a new tuple
            return None if new is None else _change("U", old_key, old_row, new, ordinal, False)
        if kind == DELETE:
            return _change("D", old_key, old_row, None, ordinal)
        return None

    def _values(self, kinds: bytes | None, values: tuple[bytes | None, ...], _map: Any = map,
                _as_tuple: Any = tuple) -> tuple[object, ...] | None:
        """The converted values of a scanned tuple, or None when a column is neither 't' nor 'n', the
        column count differs, or a parser refuses a value."""
        if len(values) != self._natts:
            return None
        try:
            if kinds is self._all_text:  # every column text
                return _as_tuple(_map(_call, self._parsers, values))  # type: ignore[no-any-return]
            if kinds is None or kinds.translate(None, b"tn"):  # binary 'b' or unchanged TOAST 'u'
                return None
            return _as_tuple([None if v is None else f(v)  # type: ignore[no-any-return]
                              for f, v in zip(self._parsers, values, strict=True)])
        except Exception:  # noqa: BLE001 - the long way gives the precise error or applies the policy
            return None
