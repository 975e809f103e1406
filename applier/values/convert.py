"""TupleData -> Python values per column, with the special-value policy and error context.

``RowConverter`` is built once per schema version: the per-column parsers are resolved up front so
converting a row is one loop over precomputed callables.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from applier.errors import ValueConversionError
from applier.protocol.messages import COL_BINARY, COL_NULL, COL_TEXT, COL_UNCHANGED_TOAST, TupleData
from applier.values.registry import TypeHandler, handler_for
from applier.values.scalars import NotText
from applier.values.special import SpecialValuePolicy, Unrepresentable

if TYPE_CHECKING:
    from pyspark.sql.types import DataType, StructType

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
    """Converts TupleData of one schema version to tuples of Python values ('u' -> UNCHANGED_TOAST)."""

    __slots__ = ("_columns", "_handlers", "_text", "_policy", "relation")

    def __init__(self, schema: SchemaVersion, types: TypeCache | None, policy: SpecialValuePolicy = "error") -> None:
        self.relation = schema.qualified_name
        cols = schema.relation.columns
        self._columns = tuple(c.name for c in cols)
        self._handlers = tuple(handler_for(c.type_oid, c.type_modifier, types) for c in cols)
        self._text: tuple[Callable[[bytes], object], ...] = tuple(h.text for h in self._handlers)
        self._policy = policy

    def convert(self, tup: TupleData) -> tuple[object, ...]:
        kinds, values = tup.kinds, tup.values
        if len(kinds) != len(self._handlers):
            raise ValueConversionError("row has a different number of columns than its Relation",
                                       relation=self.relation, columns=len(kinds), expected=len(self._handlers))
        out: list[object] = []
        append = out.append
        text = self._text
        for i, kind in enumerate(kinds):
            if kind == COL_TEXT:
                try:
                    append(text[i](values[i]))  # type: ignore[arg-type]
                    continue
                except Exception:  # noqa: BLE001 - redo on the careful path for the precise error/policy
                    pass
            try:
                append(_convert(kind, values[i], self._handlers[i], self._policy, self._columns[i]))
            except ValueConversionError as e:
                e.context.setdefault("relation", self.relation)
                raise
        return tuple(out)


def spark_type_for(type_oid: int, typmod: int, types: TypeCache | None) -> DataType:
    return handler_for(type_oid, typmod, types).spark_type()


def spark_schema_for(schema: SchemaVersion, types: TypeCache | None) -> StructType:
    from pyspark.sql.types import StructField, StructType

    return StructType([StructField(c.name, spark_type_for(c.type_oid, c.type_modifier, types), True)
                       for c in schema.relation.columns])
