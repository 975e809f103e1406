"""Arrow column types as Delta's JSON schema writes them, to compare a spec with a table's log and to
add columns, without Spark. The same strings Spark's ``DataType.jsonValue()`` gives for the Arrow
types the registry maps (tests/unit/values/test_arrow_types.py checks this for every one)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from applier.errors import SinkError

if TYPE_CHECKING:
    import pyarrow as pa

_PRIMITIVE = {"bool": "boolean", "int8": "byte", "int16": "short", "int32": "integer", "int64": "long",
              "float": "float", "double": "double", "string": "string", "large_string": "string",
              "binary": "binary", "large_binary": "binary", "date32[day]": "date"}


def delta_type(arrow: pa.DataType) -> str | dict[str, Any]:
    import pyarrow as pa

    name = _PRIMITIVE.get(str(arrow))
    if name is not None:
        return name
    if pa.types.is_timestamp(arrow):
        return "timestamp" if arrow.tz is not None else "timestamp_ntz"
    if pa.types.is_decimal(arrow):
        return f"decimal({arrow.precision},{arrow.scale})"
    if pa.types.is_list(arrow) or pa.types.is_large_list(arrow):
        return {"type": "array", "elementType": delta_type(arrow.value_type),
                "containsNull": arrow.value_field.nullable}
    if pa.types.is_struct(arrow):
        return {"type": "struct", "fields": delta_fields(list(arrow))}
    raise SinkError("no Delta type for this Arrow type", arrow_type=str(arrow))


def delta_field(field: pa.Field) -> dict[str, Any]:
    return {"name": field.name, "type": delta_type(field.type), "nullable": field.nullable, "metadata": {}}


def delta_fields(schema: pa.Schema | list[pa.Field]) -> list[dict[str, Any]]:
    return [delta_field(f) for f in schema]
