"""Arrays: PostgreSQL's text array syntax and binary array format, to Python lists.

Spark's ArrayType has no lower bounds and a fixed nesting depth, while a PostgreSQL array column
may hold values of any dimension with any lower bound. One-dimensional arrays with the default
lower bound 1 (nearly all real data) map exactly; anything else is Unrepresentable, which the
policy turns into an error (default), NULL, or (clamp) the flat element list.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable

from applier.values.special import Unrepresentable

_HEAD = struct.Struct("!iiI")
_DIM = struct.Struct("!ii")
_LEN = struct.Struct("!i")


def _flatten(value: object) -> list[object]:
    if isinstance(value, list):
        out: list[object] = []
        for v in value:
            out.extend(_flatten(v) if isinstance(v, list) else [v])
        return out
    return [value]


class _Elements:
    """An element parser that lets the array finish when an element is Unrepresentable: the element's
    clamped value stands in for it, and ``raise_if_any`` then raises for the whole array, with the
    array of clamped elements as the array's clamp (none if one element cannot clamp). Without it, the
    element's own clamp (a datetime) became the whole column's value under ``clamp``."""

    def __init__(self, element: Callable[[bytes], object]) -> None:
        self.element = element
        self.special: list[Unrepresentable] = []

    def __call__(self, raw: bytes) -> object:
        try:
            return self.element(raw)
        except Unrepresentable as e:
            self.special.append(e)
            return e.clamped if e.can_clamp else None

    def raise_if_any(self, value: list[object]) -> None:
        if self.special:
            first = self.special[0]
            clamped = value if all(e.can_clamp for e in self.special) else None
            raise Unrepresentable(f"array element: {first.what}", clamped) if clamped is not None else \
                Unrepresentable(f"array element: {first.what}")


def parse_text_array(raw: bytes, element: Callable[[bytes], object], delimiter: int = ord(",")) -> list[object]:
    """Parse '{a,"b c",NULL,{...}}' (optionally prefixed by bounds '[0:2]=')."""
    elements = _Elements(element)
    element = elements
    text = raw
    bounded = False
    if text.startswith(b"["):
        eq = text.index(b"=")
        bounds = text[:eq]
        text = text[eq + 1:]
        bounded = bounds.count(b"[") != 1 or not bounds.startswith(b"[1:")
    value, pos = _parse_level(text, 0, element, delimiter)
    if pos != len(text):
        raise ValueError("trailing characters after array value")
    nested = any(isinstance(v, list) for v in value)
    if nested or bounded:
        elements.raise_if_any(_flatten(value))
        raise Unrepresentable("array with several dimensions or a lower bound other than 1", _flatten(value))
    elements.raise_if_any(value)
    return value


def _parse_level(text: bytes, pos: int, element: Callable[[bytes], object], delim: int) -> tuple[list[object], int]:
    if text[pos:pos + 1] != b"{":
        raise ValueError("array value must start with '{'")
    pos += 1
    out: list[object] = []
    n = len(text)
    if text[pos:pos + 1] == b"}":
        return out, pos + 1
    while True:
        ch = text[pos]
        if ch == 0x7B:  # '{'
            sub, pos = _parse_level(text, pos, element, delim)
            out.append(sub)
        elif ch == 0x22:  # '"'
            buf = bytearray()
            pos += 1
            while True:
                c = text[pos]
                if c == 0x5C:  # backslash escapes the next byte
                    buf.append(text[pos + 1])
                    pos += 2
                elif c == 0x22:
                    pos += 1
                    break
                else:
                    buf.append(c)
                    pos += 1
            out.append(element(bytes(buf)))
        else:
            start = pos
            while pos < n and text[pos] not in (delim, 0x7D):
                pos += 1
            token = text[start:pos].strip()
            out.append(None if token.upper() == b"NULL" else element(token))
        if pos >= n:
            raise ValueError("unterminated array value")
        if text[pos] == delim:
            pos += 1
            continue
        if text[pos] == 0x7D:  # '}'
            return out, pos + 1
        raise ValueError("unexpected character in array value")


def parse_binary_array(raw: bytes, element: Callable[[bytes], object]) -> list[object]:
    elements = _Elements(element)
    element = elements
    ndim, _flags, _elem_oid = _HEAD.unpack_from(raw, 0)
    pos = _HEAD.size
    if ndim == 0:
        if pos != len(raw):
            raise ValueError("trailing bytes after empty array")
        return []
    dims: list[tuple[int, int]] = []
    for _ in range(ndim):
        dims.append(_DIM.unpack_from(raw, pos))
        pos += _DIM.size
    total = 1
    for size, _lb in dims:
        total *= size
    items: list[object] = []
    for _ in range(total):
        (length,) = _LEN.unpack_from(raw, pos)
        pos += 4
        if length == -1:
            items.append(None)
        else:
            if length < 0 or pos + length > len(raw):
                raise ValueError("array element length out of range")
            items.append(element(raw[pos:pos + length]))
            pos += length
    if pos != len(raw):
        raise ValueError("trailing bytes after array elements")
    elements.raise_if_any(items)
    if ndim != 1 or dims[0][1] != 1:
        raise Unrepresentable("array with several dimensions or a lower bound other than 1", items)
    return items


_NEEDS_QUOTE = frozenset(b'"\\{},') | frozenset(b" \t\n\r\v\f")


def _quote(element: str) -> str:
    """array_out's quoting: empty, 'NULL' (any case), or holding a special character or whitespace."""
    raw = element.encode("utf-8")
    if raw and raw.upper() != b"NULL" and not any(b in _NEEDS_QUOTE for b in raw):
        return element
    return '"' + element.replace("\\", "\\\\").replace('"', '\\"') + '"'


def binary_array_as_text(raw: bytes, element: Callable[[bytes], str]) -> str:
    """A binary array re-spelled exactly as array_out prints it (bounds prefix when a lower bound is
    not 1), so a column kept as text reads the same in binary and text replication."""
    ndim, flags, _elem_oid = _HEAD.unpack_from(raw, 0)
    if not 0 <= ndim <= 6 or flags not in (0, 1):
        raise ValueError("not a binary array")
    pos = _HEAD.size
    dims: list[tuple[int, int]] = []
    for _ in range(ndim):
        dims.append(_DIM.unpack_from(raw, pos))
        pos += _DIM.size
    items: list[str] = []
    for _ in range(math.prod(size for size, _lb in dims) if ndim else 0):
        (length,) = _LEN.unpack_from(raw, pos)
        pos += 4
        if length == -1:
            items.append("NULL")
            continue
        if length < 0 or pos + length > len(raw):
            raise ValueError("array element length out of range")
        items.append(_quote(element(raw[pos:pos + length])))
        pos += length
    if pos != len(raw):
        raise ValueError("trailing bytes after array elements")
    if ndim == 0:
        return "{}"
    prefix = ""
    if any(lb != 1 for _size, lb in dims):
        prefix = "".join(f"[{lb}:{lb + size - 1}]" for size, lb in dims) + "="
    return prefix + _nest(items, [size for size, _lb in dims])


def _nest(items: list[str], sizes: list[int]) -> str:
    if len(sizes) == 1:
        return "{" + ",".join(items) + "}"
    step = len(items) // sizes[0]
    return "{" + ",".join(_nest(items[i * step:(i + 1) * step], sizes[1:]) for i in range(sizes[0])) + "}"
