"""The one TupleData scanner: where each column of a row image starts and ends, without objects.

Why one: the decoder (``decoder.py``, into :class:`~applier.protocol.messages.TupleData`) and the
short-row reader (``applier.assembly.shortrows``, straight into converted values) both walk the
same bytes; two copies of the layout drift apart, and the bytes are only this package's business.

The layout (PostgreSQL's ``logicalrep_write_tuple`` in ``proto.c``): Int16 column count, then per
column a kind byte, and for 't' (text) and 'b' (binary) an Int32 length and that many bytes; 'n'
(NULL) and 'u' (unchanged TOAST) stand alone.

Three readers, one result shape ``(kinds, values, end)``:

* :func:`scan_tuple`, the hot path: per column count a scanner of its own, the loop unrolled
  (:data:`SCANNERS`, generated on first use), kind and length unpacked with ONE call (for 'n'/'u'
  the length read is ignored; ~10% faster than indexing the kind, then unpacking the length; the
  last 4 bytes, where only 'n' or 'u' fit, are read by index), no bound check but for the last
  columns, and no kinds built while every column is text (the common tuple: it gets the shared
  ``ALL_TEXT[n]``), so no per-column object but the value slices. It raises one of
  :data:`SCAN_ERRORS` on anything unusual, saying nothing of where.
* :func:`scan_tuple_views`, the same loop for a message of at least :data:`VIEW_FROM_BYTES`: a value
  that long is a ``memoryview`` of the message, not a copy (TOAST values are decoded in place).
* :func:`scan_tuple_checked`, the careful one: checks every read and raises :class:`Malformed`
  with the exact byte. Callers run it only after the fast one failed (the decoder, to report), or
  give up (the short-row reader, which then takes the long way).
"""

from __future__ import annotations

from collections.abc import Callable
from struct import Struct
from struct import error as StructError

from applier.protocol import wire
from applier.protocol.headers import (
    CHANGE_TAG_AT,
    CHANGE_TUPLE_AT,
    DELETE,
    INSERT,
    NEW_TUPLE,
    OLD_KEY,
    OLD_ROW,
    UPDATE,
)
from applier.protocol.messages import ValuesWithViews

__all__ = ["ALL_TEXT", "SCAN_ERRORS", "VIEW_FROM_BYTES", "Malformed", "RowScan", "Scanned", "ScannedViews", "Unusual",
           "scan_row_change", "scan_tuple", "scan_tuple_checked", "scan_tuple_views"]

#: A column's kind byte and (for 't'/'b') its Int32 length, in one unpack. Read UNSIGNED: a negative
#: length (never valid) then reads as >= 2**31, which pushes the position past the end, so the one
#: bound check after the loop catches it as well as any overrun.
_KIND_LENGTH = Struct("!BI").unpack_from


class Malformed(Exception):
    """What is wrong and at which byte of the message. Internal to ``protocol``: the decoder turns it
    into a :class:`~applier.errors.DecodeError` with the message kind and LSN."""

    def __init__(self, reason: str, offset: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.offset = offset


class Unusual(Exception):
    """The fast scan met something it leaves to the careful one (no details: it is never shown)."""


_UNUSUAL = Unusual()

#: What :func:`scan_tuple` (and the fast readers built on it) may raise: catch exactly these.
SCAN_ERRORS = (Unusual, StructError, IndexError)

#: One scanned tuple: kinds, raw values (None for 'n' and 'u'), and the position after the tuple.
Scanned = tuple[bytes, tuple[bytes | None, ...], int]

#: :data:`Scanned` of :func:`scan_tuple_views`: a long value may be a ``memoryview`` of the message.
ScannedViews = tuple[bytes, tuple[bytes | memoryview | None, ...], int]

#: ``kinds`` of an all-text tuple, per column count (PostgreSQL allows at most 1664 columns): the
#: common tuple shares one bytes object instead of building one, and callers can tell it by identity.
ALL_TEXT: tuple[bytes, ...] = tuple(b"t" * n for n in range(1665))


#: Columns up to this count get a scanner of their own (see :func:`_unrolled`); wider tuples, rare,
#: the loop of :func:`_scan_loop`.
UNROLL_UP_TO = 64

#: The last this many columns of a tuple may sit in the last 4 bytes of a message ('n' and 'u' are one
#: byte each), too few for the 5-byte read of kind and length: only they check the room first. Any
#: earlier column of a well-formed tuple has at least 4 one-byte columns after it.
_GUARDED = 4


def _unrolled_source(natts: int) -> str:
    """The source of the scanner of tuples of ``natts`` columns: the loop of :func:`_scan_loop`
    unrolled, one block per column, each value in a local of its own, the values returned as one
    tuple display. ``odd`` is set by the rare kinds; only then are the kinds put together."""
    lines = [f"def scan_{natts}(data, pos, n, _kind_length=_kind_length, _all_text=_all_text, "
             "_unusual=_unusual, _bytes=bytes):",
             "    p = pos + 2",
             "    odd = 0"]
    for i in range(natts):
        if i < natts - _GUARDED:
            lines.append(f"    k{i}, length = _kind_length(data, p)")
        else:
            lines += ["    if p + 5 <= n:",
                      f"        k{i}, length = _kind_length(data, p)",
                      "    else:",
                      f"        k{i}, length = data[p], 0"]
        lines += [f"    if k{i} == 116:  # 't'",
                  "        start = p + 5",
                  "        p = start + length",
                  f"        v{i} = data[start:p]",
                  f"    elif k{i} == 110 or k{i} == 117:  # 'n', 'u'",
                  "        p += 1",
                  f"        v{i} = None",
                  "        odd = 1",
                  f"    elif k{i} == 98:  # 'b'",
                  "        start = p + 5",
                  "        p = start + length",
                  f"        v{i} = data[start:p]",
                  "        odd = 1",
                  "    else:",
                  "        raise _unusual"]
    kinds = "".join(f"k{i}, " for i in range(natts))
    values = "".join(f"v{i}, " for i in range(natts))
    lines += ["    if p > n:",
              "        raise _unusual",
              f"    return _bytes(({kinds})) if odd else _all_text, ({values}), p"]
    return "\n".join(lines) + "\n"


def _unrolled(natts: int) -> Callable[[bytes, int, int], Scanned]:
    """The scanner of tuples of exactly ``natts`` columns (the column count at ``pos`` is not read).

    Why generated: per column, the loop's iteration, its index, the list store and the list turned
    into a tuple cost about as much as the column's read and slice; one block per column leaves only
    those (bench/decode.py: ~10% of a 6-column Insert). Built with ``exec``, as the dataclasses module
    builds ``__init__`` (and applier.infra.fastobj its constructors), from :func:`_unrolled_source`."""
    namespace: dict[str, object] = {"_kind_length": _KIND_LENGTH, "_all_text": ALL_TEXT[natts], "_unusual": _UNUSUAL}
    exec(_unrolled_source(natts), namespace)  # noqa: S102 - our own source text, built above
    return namespace[f"scan_{natts}"]  # type: ignore[return-value]  # defined by the exec above


def _scan_loop(data: bytes, pos: int, n: int, _kind_length: Callable[[bytes, int], tuple[int, int]] = _KIND_LENGTH,
               _unusual: Unusual = _UNUSUAL, _bytearray: type[bytearray] = bytearray, _bytes: type[bytes] = bytes,
               _all_text: tuple[bytes, ...] = ALL_TEXT) -> Scanned:
    """:func:`scan_tuple` as one loop, for tuples of more than :data:`UNROLL_UP_TO` columns (and the
    reference the unrolled scanners are tested against)."""
    natts = (data[pos] << 8) | data[pos + 1]
    p = pos + 2
    values: list[bytes | None] = [None] * natts
    kinds = None
    for i in range(natts):
        if p + 5 <= n:
            kind, length = _kind_length(data, p)
        else:  # under 5 bytes left: a tuple ending in NULL or unchanged columns
            kind, length = data[p], 0  # (a 't' or 'b' cut short here ends past the end: refused below)
        if kind == 116:  # 't'
            start = p + 5
            p = start + length
            values[i] = data[start:p]
            continue
        if kinds is None:
            kinds = _bytearray(b"t" * natts)
        kinds[i] = kind
        if kind == 110 or kind == 117:  # 'n', 'u'
            p += 1
        elif kind == 98:  # 'b'
            start = p + 5
            p = start + length
            values[i] = data[start:p]
        else:
            raise _unusual
    if p > n:
        raise _unusual
    return _all_text[natts] if kinds is None else _bytes(kinds), tuple(values), p


class _Scanners(dict[int, Callable[[bytes, int, int], Scanned]]):
    """Column count -> its scanner, each built on first use (a count past PostgreSQL's 1664 columns,
    only ever read from damaged bytes, is not kept)."""

    def __missing__(self, natts: int) -> Callable[[bytes, int, int], Scanned]:
        if natts > UNROLL_UP_TO:
            if natts < len(ALL_TEXT):
                self[natts] = _scan_loop
            return _scan_loop
        scanner = self[natts] = _unrolled(natts)
        return scanner


#: The scanner of each column count: ``SCANNERS[natts](data, pos, n)`` is :func:`scan_tuple`, one call
#: less (the decoder's hot messages read the count themselves).
SCANNERS: dict[int, Callable[[bytes, int, int], Scanned]] = _Scanners()


def scan_tuple(data: bytes, pos: int, n: int, _scanners: dict[int, Callable[[bytes, int, int], Scanned]] = SCANNERS
               ) -> Scanned:
    """The TupleData at ``pos`` of ``data`` (``n`` is ``len(data)``, which every caller has at hand:
    passed, not recomputed, on this hot path): ``(kinds, values, end)``. ``kinds`` holds the kind
    bytes (``b'tnub'``), the shared ``ALL_TEXT[n]`` when every column is text; ``values[i]`` holds the
    bytes of a 't' or 'b' column, None for 'n' and 'u'; ``end`` is the position after the tuple.
    Raises one of :data:`SCAN_ERRORS` (nothing else) for a read past the end, a bad kind or length.

    Read by the scanner of the tuple's column count (:data:`SCANNERS`): kind and length unpacked with
    ONE call (~10% faster than indexing the kind, then unpacking the length), no bound check but for
    the last columns (:data:`_GUARDED`: a read past the end there is no exception either, which cost
    about 0.7 µs a column, and a Delete's key tuple ends in NULLs), no kinds built while every column
    is text. This runs once per row image of a busy slot."""
    return _scanners[(data[pos] << 8) | data[pos + 1]](data, pos, n)


#: From this many bytes a value of :func:`scan_tuple_views` is a read-only ``memoryview`` into the
#: message instead of a copy: a TOAST value of hundreds of kB is then decoded without copying it (the
#: copy, at memory speed, was nearly all a 300 kB value's decode). Below it a slice is cheaper than a
#: view (one memcpy of a few kB against a view object and the message kept alive). A key is seldom this
#: long (a btree entry holds at most about 2.7 kB, compressed), but one can be (REPLICA IDENTITY FULL
#: sends whole rows): a view works as its bytes do there too, equal and hashed alike (the unit tier and
#: the random workloads pass with every value a view, bench/RESULTS.md, thirty-first session).
VIEW_FROM_BYTES = 16 * 1024


def scan_tuple_views(data: bytes, pos: int, n: int,
                     _kind_length: Callable[[bytes, int], tuple[int, int]] = _KIND_LENGTH,
                     _unusual: Unusual = _UNUSUAL, _all_text: tuple[bytes, ...] = ALL_TEXT,
                     _large: int = VIEW_FROM_BYTES,
                     _with_views: type[ValuesWithViews] = ValuesWithViews) -> ScannedViews:
    """:func:`scan_tuple` for a message of at least :data:`VIEW_FROM_BYTES` (the decoder picks it by the
    message's length, so the common small message keeps the scanners above): the same result, except that
    a value of ``_large`` bytes or more is a read-only ``memoryview`` slice of ``data``, and the values
    come as a tuple (a :class:`~applier.protocol.messages.ValuesWithViews` when one is a view). Such a value
    is equal to, and hashes as, the ``bytes`` it views; whoever needs ``bytes`` methods copies it then
    (``bytes(value)``): the values layer does, for the one row that holds it."""
    natts = (data[pos] << 8) | data[pos + 1]
    p = pos + 2
    values: list[bytes | memoryview | None] = [None] * natts
    kinds = None
    view = None
    for i in range(natts):
        if p + 5 <= n:
            kind, length = _kind_length(data, p)
        else:
            kind, length = data[p], 0
        if kind == 116 or kind == 98:  # 't', 'b'
            start = p + 5
            p = start + length
            if length < _large:
                values[i] = data[start:p]
            else:
                if view is None:
                    view = memoryview(data)
                    if not view.readonly:  # a bytearray a reader may reuse: view a copy of it, once
                        view = memoryview(bytes(data))
                values[i] = view[start:p]
            if kind == 116:
                continue
        elif kind != 110 and kind != 117:  # not 'n', 'u'
            raise _unusual
        else:
            p += 1
        if kinds is None:
            kinds = bytearray(b"t" * natts)
        kinds[i] = kind
    if p > n:
        raise _unusual
    return (_all_text[natts] if kinds is None else bytes(kinds), tuple(values) if view is None else _with_views(values),
            p)


def scan_tuple_checked(data: bytes, pos: int) -> Scanned:
    """:func:`scan_tuple` with every read checked, for a malformed tuple to be reported at the exact
    byte (:class:`Malformed`); ``kinds`` is always given. Only runs when the fast scan failed."""
    n = len(data)
    if pos + 2 > n:
        raise Malformed("truncated TupleData column count", n)
    natts = (data[pos] << 8) | data[pos + 1]
    pos += 2
    kinds = bytearray(natts)
    values: list[bytes | None] = [None] * natts
    i32 = wire.INT32.unpack_from
    for i in range(natts):
        if pos >= n:
            raise Malformed(f"truncated TupleData: column {i + 1} of {natts} missing", n)
        kind = data[pos]
        if kind == 116 or kind == 98:  # 't' text, 'b' binary
            if pos + 5 > n:
                raise Malformed(f"truncated TupleData: length of column {i + 1}", n)
            length = i32(data, pos + 1)[0]
            start = pos + 5
            pos = start + length
            if length < 0:
                raise Malformed(f"TupleData: negative length {length} of column {i + 1}", start - 4)
            if pos > n:
                raise Malformed(f"truncated TupleData: value of column {i + 1} ({length} bytes)", n)
            values[i] = data[start:pos]
        elif kind == 110 or kind == 117:  # 'n' NULL, 'u' unchanged TOAST
            pos += 1
        else:
            raise Malformed(f"TupleData: unknown column kind {bytes((kind,))!r} of column {i + 1}", pos)
        kinds[i] = kind
    return bytes(kinds), tuple(values), pos


#: A scanned Insert/Update/Delete: kind, old tuple tag (0 for none), old kinds and values (None for
#: none), new kinds and values (None for a Delete).
RowScan = tuple[int, int, bytes | None, tuple[bytes | None, ...] | None, bytes | None,
                tuple[bytes | None, ...] | None]


def scan_row_change(data: bytes, _scan: Callable[[bytes, int, int], Scanned] = scan_tuple,
                    _unusual: Unusual = _UNUSUAL) -> RowScan:
    """The tuples of an Insert, Update or Delete outside a stream block, scanned in place (see
    :data:`RowScan`), for readers that need no message object (applier.assembly.shortrows). Raises one
    of :data:`SCAN_ERRORS` for anything else: another kind, a tag out of place, a damaged tuple,
    trailing bytes. The decoder is the reference for those: it reads or reports them."""
    n = len(data)
    kind = data[0]
    tag = data[CHANGE_TAG_AT]
    if kind == INSERT:
        if tag != NEW_TUPLE:
            raise _unusual
        new_kinds, new, end = _scan(data, CHANGE_TUPLE_AT, n)
        if end != n:
            raise _unusual
        return kind, 0, None, None, new_kinds, new
    if kind == UPDATE:
        old_tag = 0
        old_kinds = old = None
        pos = CHANGE_TUPLE_AT
        if tag == OLD_KEY or tag == OLD_ROW:
            old_tag = tag
            old_kinds, old, pos = _scan(data, pos, n)
            tag = data[pos]
            pos += 1
        if tag != NEW_TUPLE:
            raise _unusual
        new_kinds, new, end = _scan(data, pos, n)
        if end != n:
            raise _unusual
        return kind, old_tag, old_kinds, old, new_kinds, new
    if kind == DELETE and (tag == OLD_KEY or tag == OLD_ROW):
        old_kinds, old, end = _scan(data, CHANGE_TUPLE_AT, n)
        if end != n:
            raise _unusual
        return kind, tag, old_kinds, old, None, None
    raise _unusual
