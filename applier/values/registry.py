"""The one place that maps a PostgreSQL type (OID + typmod) to its column type and its text and binary
parsers. docs/types.md documents exactly this registry.

Column types are Arrow's: the neutral form every store takes (delta-rs writes Arrow as it is, the
Spark store converts it with ``applier.spark.types``), so decoding, folding and the delta-rs path
never need pyspark. Each type is the one Spark's Arrow mapping gives for the documented Delta type
(lists' element field named ``element``, instants in UTC), so both engines write the same files.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from applier.values import arrays, numeric, oids, scalars
from applier.values import datetime as dt

if TYPE_CHECKING:
    import pyarrow as pa

    from applier.catalog import TypeCache

Parser = Callable[[bytes], object]


@dataclass(frozen=True, slots=True)
class TypeHandler:
    """How one column type is mirrored."""

    arrow_type: Callable[[], pa.DataType]  # built lazily: importing pyarrow is not needed to decode
    text: Parser
    binary: Parser | None  # None: no binary parser (unknown type) -> a clear error if 'b' arrives
    pg_name: str


def _t(name: str, *args: object) -> Callable[[], pa.DataType]:
    """The Arrow type ``pyarrow.<name>(*args)``."""
    def make() -> pa.DataType:
        import pyarrow

        made: pa.DataType = getattr(pyarrow, name)(*args)
        return made
    return make


def _decimal(p: int, s: int) -> Callable[[], pa.DataType]:
    return _t("decimal128", p, s)


def _array_of(elem: Callable[[], pa.DataType]) -> Callable[[], pa.DataType]:
    def make() -> pa.DataType:
        import pyarrow

        return pyarrow.list_(pyarrow.field("element", elem(), nullable=True))
    return make


_S = _t("string")
_INSTANT = _t("timestamp", "us", "UTC")  # Delta's timestamp: an instant, kept in UTC
_SCALARS: dict[int, TypeHandler] = {
    oids.BOOL: TypeHandler(_t("bool_"), scalars.bool_text, scalars.bool_binary, "boolean"),
    oids.INT2: TypeHandler(_t("int16"), scalars.int_text, scalars.int2_binary, "smallint"),
    oids.INT4: TypeHandler(_t("int32"), scalars.int_text, scalars.int4_binary, "integer"),
    oids.INT8: TypeHandler(_t("int64"), scalars.int_text, scalars.int8_binary, "bigint"),
    oids.OID: TypeHandler(_t("int64"), scalars.int_text, scalars.oid_binary, "oid"),
    oids.FLOAT4: TypeHandler(_t("float32"), scalars.float4_text, scalars.float4_binary, "real"),
    oids.FLOAT8: TypeHandler(_t("float64"), scalars.float_text, scalars.float8_binary, "double precision"),
    oids.TEXT: TypeHandler(_S, scalars.text_str, scalars.text_str, "text"),
    oids.VARCHAR: TypeHandler(_S, scalars.text_str, scalars.text_str, "varchar"),
    oids.BPCHAR: TypeHandler(_S, scalars.text_str, scalars.text_str, "char(n)"),
    oids.NAME: TypeHandler(_S, scalars.text_str, scalars.text_str, "name"),
    oids.CHAR: TypeHandler(_S, scalars.text_str, scalars.char_binary, '"char"'),
    oids.BYTEA: TypeHandler(_t("binary"), scalars.bytea_text, scalars.bytea_binary, "bytea"),
    oids.UUID: TypeHandler(_S, scalars.text_str, scalars.uuid_binary, "uuid"),
    oids.JSON: TypeHandler(_S, scalars.text_str, scalars.text_str, "json"),
    oids.JSONB: TypeHandler(_S, scalars.text_str, scalars.jsonb_binary, "jsonb"),
    oids.DATE: TypeHandler(_t("date32"), dt.date_text, dt.date_binary, "date"),
    oids.TIMESTAMP: TypeHandler(_t("timestamp", "us"), dt.timestamp_text, dt.timestamp_binary, "timestamp"),
    oids.TIMESTAMPTZ: TypeHandler(_INSTANT, dt.timestamptz_text, dt.timestamptz_binary, "timestamptz"),
    oids.TIME: TypeHandler(_S, scalars.text_str, dt.time_binary, "time"),
    oids.TIMETZ: TypeHandler(_S, scalars.text_str, dt.timetz_binary, "timetz"),
    oids.INTERVAL: TypeHandler(_S, scalars.text_str, dt.interval_binary, "interval"),
}
_UNKNOWN = TypeHandler(_S, scalars.text_str, None, "unknown")
_USER = TypeHandler(_S, scalars.text_str, scalars.user_type_binary, "user type")


def _numeric(typmod: int) -> TypeHandler:
    ps = numeric.fits_decimal(typmod)
    if ps is not None:
        return TypeHandler(_decimal(*ps), numeric.numeric_text_to_decimal, numeric.numeric_binary_to_decimal,
                           f"numeric({ps[0]},{ps[1]})")
    return TypeHandler(_S, numeric.numeric_text_to_str, numeric.numeric_binary_to_str, "numeric")


def _scalar(oid: int, typmod: int, types: TypeCache | None) -> TypeHandler:
    if oid == oids.NUMERIC:
        return _numeric(typmod)
    handler = _SCALARS.get(oid)
    if handler is not None:
        return handler
    info = types.get(oid) if types is not None else None
    if info is not None:
        if info.namespace == "pg_catalog":  # a domain: 'Y' carries its base type's name
            base = oids.BUILTIN_BY_NAME.get(info.name) or oids.BUILTIN_ARRAY_BY_NAME.get(info.name)
            if base is not None:
                return handler_for(base, typmod, None)
        # Enums and other user types (composites, ranges, arrays of user types, extension types, domains
        # over those): their text output. Binary is accepted only when it is text (enum labels).
        return _USER
    return _UNKNOWN


def handler_for(oid: int, typmod: int, types: TypeCache | None) -> TypeHandler:
    """The handler for a column of type ``oid`` with ``typmod`` (a domain's typmod is -1: the base
    type's modifier is not sent, so a domain over numeric(p,s) maps like unconstrained numeric)."""
    elem = oids.ARRAY_ELEMENT.get(oid)
    if elem is not None:
        inner = _scalar(elem, typmod, types)
        binary = partial(arrays.parse_binary_array, element=inner.binary) if inner.binary else None
        return TypeHandler(_array_of(inner.arrow_type), partial(arrays.parse_text_array, element=inner.text),
                           binary, inner.pg_name + "[]")
    return _scalar(oid, typmod, types)
