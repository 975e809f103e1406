"""TOAST-sized values decoded without a copy (``protocol.tupledata.scan_tuple_views``): a value of
``VIEW_FROM_BYTES`` or more is a read-only ``memoryview`` of its message. Everything downstream must
not tell the difference: the same kinds and values as the copying scan, the same converted row, and a
pickled or copied tuple (a spill, a staged prepared transaction, a fold shipped from an executor) that
holds ``bytes``.

The captured streams (tests/fixtures/pgoutput, from real PostgreSQL 15, 16 and 18) have no value that
long, so here every value is viewed (``_large=1``): a stricter case than the decoder's. The decoder's own
choice on a real server's TOAST values is tested in tests/integration/test_big_values.py."""

from __future__ import annotations

import copy
import pickle

import pytest
from pgoutput_fixtures import all_messages, files, load

from applier.catalog import RelationCache
from applier.errors import ValueConversionError
from applier.lsn import parse_lsn
from applier.protocol import MessageDecoder
from applier.protocol.headers import CHANGE_TUPLE_AT, ROW_KINDS
from applier.protocol.messages import Delete, Insert, Relation, TupleData, Type, Update, ValuesWithViews
from applier.protocol.tupledata import (
    SCAN_ERRORS,
    Scanned,
    ScannedViews,
    scan_row_change,
    scan_tuple,
    scan_tuple_views,
)
from applier.values import RowConverter


def _every_value_viewed(data: bytes, pos: int, n: int) -> Scanned:
    kinds, values, end = scan_tuple_views(data, pos, n, _large=1)
    assert type(values) is ValuesWithViews
    return kinds, tuple(values), end


def _scanned(data: bytes, pos: int, n: int) -> ScannedViews:
    """The copying scan's result (values as a tuple, as the viewing scan's)."""
    return scan_tuple(data, pos, n)


def _viewed(t: TupleData, marked: bool = True) -> TupleData:
    """``t`` with every value a view, as the decoder gives a TOAST-sized one (``marked``: in the
    ValuesWithViews the decoder gives; else in a plain tuple, as a caller might build one)."""
    values = tuple(None if v is None else memoryview(b"<" + v + b">")[1:-1] for v in t.values)
    return TupleData(t.kinds, ValuesWithViews(values) if marked else values)


def test_the_viewing_scan_finds_what_the_copying_scan_finds() -> None:
    """The first tuple of every captured change (in and out of stream blocks), and both tuples of
    every change outside one: the same kinds, values and end; every value a read-only view."""
    checked = 0
    for m in all_messages():
        if m.data[0] not in ROW_KINDS:
            continue
        pos, n = CHANGE_TUPLE_AT + (4 if m.in_stream else 0), len(m.data)
        kinds, values, end = scan_tuple_views(m.data, pos, n, _large=1)
        assert (kinds, values, end) == _scanned(m.data, pos, n), m
        assert all(type(v) is memoryview and v.readonly for v in values if v is not None)
        assert type(values) is (ValuesWithViews if any(v is not None for v in values) else tuple)
        if not m.in_stream:
            assert scan_row_change(m.data, _every_value_viewed) == scan_row_change(m.data)
        checked += 1
    assert checked > 100


def test_a_value_of_a_mutable_message_does_not_change_with_it() -> None:
    """The decoder takes ``bytes``; were it handed a buffer its reader then reuses, a view would
    change under the value. It views a copy of such a message instead."""
    for m in all_messages()[:300]:
        if m.data[0] not in ROW_KINDS:
            continue
        pos, buffer = CHANGE_TUPLE_AT + (4 if m.in_stream else 0), bytearray(m.data)
        _kinds, values, end = scan_tuple_views(buffer, pos, len(buffer), _large=1)  # type: ignore[arg-type]
        buffer[pos:end] = bytes(end - pos)
        assert values == _scanned(m.data, pos, len(m.data))[1]


@pytest.mark.parametrize("file", files())
def test_a_cut_short_change_raises_only_what_callers_catch(file: str) -> None:
    for m in load(file):
        if m.data[0] not in ROW_KINDS:
            continue
        pos = CHANGE_TUPLE_AT + (4 if m.in_stream else 0)
        for cut in range(pos, len(m.data)):
            try:
                got = scan_tuple_views(m.data[:cut], pos, cut, _large=1)
            except SCAN_ERRORS:
                with pytest.raises(SCAN_ERRORS):
                    scan_tuple(m.data[:cut], pos, cut)
            else:
                assert got == _scanned(m.data[:cut], pos, cut)


def _changes_with_converters() -> list[tuple[TupleData, RowConverter]]:
    """Every captured row image with the converter of its relation's schema at that point."""
    out = []
    for name in files():
        catalog, decoder = RelationCache(), MessageDecoder()
        for m in load(name):
            msg = decoder.decode(m.data, parse_lsn(m.lsn))
            if isinstance(msg, Relation):
                catalog.update(msg)
            elif isinstance(msg, Type):
                catalog.update_type(msg)
            elif isinstance(msg, Insert | Update | Delete):
                converter = RowConverter(catalog.get(msg.relation_oid), catalog.types, "null")
                out += [(t, converter) for t in (getattr(msg, "old", None), getattr(msg, "new", None)) if t is not None]
    return out


def test_a_viewed_row_converts_to_the_same_values() -> None:
    """Text and binary rows, NULLs and unchanged TOAST: the values layer gives the same Python values."""
    rows = _changes_with_converters()
    assert {k for t, _ in rows for k in t.kinds} == set(b"tnub")
    for t, converter in rows:
        want = converter.convert(t)
        assert converter.convert(_viewed(t)) == want and converter.convert(_viewed(t, marked=False)) == want, t


def test_a_viewed_value_that_cannot_be_read_stops_as_its_bytes_do() -> None:
    """Damaged text (not UTF-8) and damaged binary values: the same error, naming the same column."""
    tried = 0
    for t, converter in _changes_with_converters():
        for i, v in enumerate(t.values):
            if v is None or not v:
                continue
            damaged = TupleData(t.kinds, (*t.values[:i], b"\xff" + v[1:], *t.values[i + 1:]))
            try:
                want: object = converter.convert(damaged)
            except ValueConversionError as e:
                want = str(e)
            for marked in (True, False):
                try:
                    got: object = converter.convert(_viewed(damaged, marked))
                except ValueConversionError as e:
                    got = str(e)
                assert got == want
            tried += isinstance(want, str)
    assert tried > 50


def test_a_pickled_or_copied_tuple_holds_bytes() -> None:
    """Spills and staged prepared transactions pickle their changes; executors pickle what they ship."""
    for t, _ in _changes_with_converters()[:200]:
        viewed = _viewed(t)
        assert viewed == t and hash(viewed) == hash(t)
        for again in (pickle.loads(pickle.dumps(viewed, protocol=pickle.HIGHEST_PROTOCOL)),
                      pickle.loads(pickle.dumps(viewed, protocol=2)), copy.deepcopy(viewed), copy.copy(viewed)):
            assert again == t and all(v is None or type(v) is bytes for v in again.values)
            assert type(again.values) is tuple


def test_a_message_below_the_view_size_is_decoded_as_bytes() -> None:
    """The decoder picks the viewing scan by the message's length only: every captured message (all
    shorter than VIEW_FROM_BYTES) decodes to bytes values."""
    for m in all_messages():
        if m.data[0] in ROW_KINDS:
            msg = MessageDecoder().decode(m.data) if not m.in_stream else None
            for t in ([] if msg is None else [getattr(msg, "old", None), getattr(msg, "new", None)]):
                assert t is None or all(v is None or type(v) is bytes for v in t.values)


