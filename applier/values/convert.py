"""TupleData -> Python values per column, with the special-value policy and error context.

``RowConverter`` is built once per schema version: the per-column parsers are resolved up front so
converting a row is one loop over precomputed callables.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from operator import call as _call
from typing import TYPE_CHECKING, Any

from applier.errors import ValueConversionError
from applier.protocol.messages import COL_BINARY, COL_NULL, COL_TEXT, COL_UNCHANGED_TOAST, TupleData, ValuesWithViews
from applier.values.registry import TypeHandler, handler_for
from applier.values.scalars import NotText, text_str
from applier.values.special import SpecialValuePolicy, Unrepresentable

if TYPE_CHECKING:
    import pyarrow as pa

    from applier.catalog import SchemaVersion, TypeCache


class _UnchangedToast:
    """The value of a column sent as 'u': unchanged TOAST, value not sent. Not NULL, not a string."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"

    def __reduce__(self) -> str:
        return "UNCHANGED_TOAST"


UNCHANGED_TOAST: Any = _UnchangedToast()


def _apply_policy(e: Unrepresentable, policy: SpecialValuePolicy, column: str, handler: TypeHandler) -> object:
    if policy == "null":
        return None
    if policy == "clamp" and e.can_clamp:
        return e.clamped
    raise ValueConversionError(
        f"{e.what}: the mapped Spark type cannot hold it; set apply.special_values to 'clamp' or 'null' "
        "to accept a changed value, or change the column in Postgres",
        column=column, pg_type=handler.pg_name) from None


def _convert(kind: int, raw: bytes | None, handler: TypeHandler, policy: SpecialValuePolicy, column: str) -> object:
    if kind == COL_NULL:
        return None
    if kind == COL_UNCHANGED_TOAST:
        return UNCHANGED_TOAST
    assert raw is not None
    try:
        if kind == COL_TEXT:
            return handler.text(raw)
        if kind == COL_BINARY:
            if handler.binary is None:
                raise ValueConversionError(
                    "binary value of a type applier cannot read; use binary=false (text format) for this "
                    "publication", column=column, pg_type=handler.pg_name)
            return handler.binary(raw)
    except Unrepresentable as e:
        return _apply_policy(e, policy, column, handler)
    except NotText:
        raise ValueConversionError(
            "binary value of a user type that is not text (composite, range, extension type); applier "
            "cannot read its send format: use binary=false (text format) for this publication",
            column=column, pg_type=handler.pg_name) from None
    except (ValueError, UnicodeDecodeError, IndexError, OverflowError, ArithmeticError) as e:
        raise ValueConversionError(f"cannot read {'text' if kind == COL_TEXT else 'binary'} value: "
                                   f"{type(e).__name__}", column=column, pg_type=handler.pg_name) from e
    except struct.error as e:
        raise ValueConversionError("cannot read binary value: wrong length", column=column,
                                   pg_type=handler.pg_name) from e
    raise ValueConversionError(f"unknown column kind {kind!r}", column=column)


def convert_value(kind: int, raw: bytes | None, type_oid: int, typmod: int, types: TypeCache | None,
                  policy: SpecialValuePolicy = "error", column: str = "?") -> object:
    return _convert(kind, raw, handler_for(type_oid, typmod, types), policy, column)


class RowConverter:
    """Converts TupleData of one schema version to tuples of Python values ('u' -> UNCHANGED_TOAST).

    The parsers are resolved once per schema version. The fast path (every column 't', or every
    column 'b') is one C-level map of the precomputed per-column parsers over the values, and the
    text parsers of int and text columns are the builtins int and bytes.decode themselves; other rows
    take one zip loop. Neither handles errors per column: any exception (a bad value, a special
    value, a binary value of a type without a binary parser) redoes the row on the careful path,
    which applies the policy and names the column.
    """

    __slots__ = ("_columns", "_handlers", "_text", "_binary", "_policy", "_n", "relation")

    def __init__(self, schema: SchemaVersion, types: TypeCache | None, policy: SpecialValuePolicy = "error") -> None:
        self.relation = schema.qualified_name
        cols = schema.relation.columns
        self._columns = tuple(c.name for c in cols)
        self._handlers = tuple(handler_for(c.type_oid, c.type_modifier, types) for c in cols)
        self._text: tuple[Callable[[bytes], object], ...] = tuple(h.text for h in self._handlers)
        self._binary: tuple[Callable[[bytes], object] | None, ...] = tuple(h.binary for h in self._handlers)
        self._policy = policy
        self._n = len(cols)

    @property
    def text_parsers(self) -> tuple[Callable[[bytes], object], ...]:
        """The text parser of each column, in order (applier.assembly.shortrows reads with them)."""
        return self._text

    def convert(self, tup: TupleData) -> tuple[object, ...]:
        kinds, values = tup.kinds, tup.values
        if type(values) is ValuesWithViews:
            return self._convert_views(kinds, values)
        n = self._n
        if len(kinds) == n and len(values) == n:
            try:
                if kinds.count(COL_TEXT) == n:  # the common rows: every column present, one format
                    return tuple(map(_call, self._text, values))  # type: ignore[arg-type]  # all 't': no None
                if kinds.count(COL_BINARY) == n:
                    return tuple(map(_call, self._binary, values))  # type: ignore[arg-type]  # all 'b': no None
            except Exception:  # noqa: BLE001 - the careful path gives the precise error or applies the policy
                return self._after_failure(kinds, values)
        return self._convert_mixed(kinds, values)

    def _convert_mixed(self, kinds: bytes, values: tuple[bytes | memoryview | None, ...]) -> tuple[object, ...]:
        """Rows with NULLs, unchanged TOAST or both formats: one loop, no error handling per column."""
        if len(kinds) != self._n or len(values) != len(kinds):
            raise ValueConversionError("row has a different number of columns than its Relation",
                                       relation=self.relation, columns=len(kinds), expected=self._n)
        out: list[object] = []
        append = out.append
        try:
            for kind, raw, text, binary in zip(kinds, values, self._text, self._binary, strict=True):
                if kind == COL_TEXT:
                    append(text(raw))  # type: ignore[arg-type]  # 't' always has bytes
                elif kind == COL_NULL:
                    append(None)
                elif kind == COL_BINARY:
                    append(binary(raw))  # type: ignore[arg-type,misc]  # 'b' has bytes; None handler raised above
                elif kind == COL_UNCHANGED_TOAST:
                    append(UNCHANGED_TOAST)
                else:
                    raise ValueError("unknown column kind")
            return tuple(out)
        except Exception:  # noqa: BLE001 - see convert
            return self._after_failure(kinds, values)

    def _after_failure(self, kinds: bytes, values: tuple[bytes | memoryview | None, ...]) -> tuple[object, ...]:
        """A row the paths above could not convert: the careful path names the column (or applies the
        special-value policy). A view in a plain tuple (the decoder marks its own, see convert) is
        read here too."""
        if memoryview in map(type, values):
            return self._convert_views(kinds, values)
        return self._convert_carefully(kinds, values)  # type: ignore[arg-type]  # no view: bytes or None

    def _convert_views(self, kinds: bytes, values: tuple[bytes | memoryview | None, ...]) -> tuple[object, ...]:
        """A row holding a TOAST-sized value that is a view of its message (protocol.tupledata.
        scan_tuple_views), which the parsers refuse (``bytes.decode`` takes only bytes). Text, the usual
        such value, is decoded from the view (no copy), any other value copied, and the row converted the
        quick way."""
        if len(kinds) != self._n or len(values) != self._n:
            return self._convert_mixed(kinds, values)  # which says so
        plain = list(values)
        read: list[tuple[int, str]] = []
        for i in [i for i, t in enumerate(map(type, values)) if t is memoryview]:  # the few long values
            raw: memoryview = values[i]  # type: ignore[assignment]
            if (self._text[i] if kinds[i] == COL_TEXT else self._binary[i]) is text_str:
                try:
                    read.append((i, str(raw, "utf-8")))
                    plain[i] = b""  # read above; the parser reads the empty text
                    continue
                except UnicodeDecodeError:  # the careful path says which column
                    pass
            plain[i] = bytes(raw)
        row = self.convert(TupleData(kinds, tuple(plain)))  # no view left
        if not read:
            return row
        out = list(row)
        for i, text in read:
            out[i] = text
        return tuple(out)

    def _convert_carefully(self, kinds: bytes, values: tuple[bytes | None, ...]) -> tuple[object, ...]:
        out: list[object] = []
        for i, kind in enumerate(kinds):
            try:
                out.append(_convert(kind, values[i], self._handlers[i], self._policy, self._columns[i]))
            except ValueConversionError as e:
                e.add_context(relation=self.relation)
                raise
        return tuple(out)


def arrow_type_for(type_oid: int, typmod: int, types: TypeCache | None) -> pa.DataType:
    return handler_for(type_oid, typmod, types).arrow_type()


def arrow_schema_for(schema: SchemaVersion, types: TypeCache | None) -> pa.Schema:
    """The columns of ``schema`` as the registry maps them, every one nullable (the sink's contract:
    a NOT NULL dropped or added in the source never makes a write fail)."""
    import pyarrow

    return pyarrow.schema([pyarrow.field(c.name, arrow_type_for(c.type_oid, c.type_modifier, types), nullable=True)
                           for c in schema.relation.columns])
