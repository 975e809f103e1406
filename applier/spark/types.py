"""Arrow column types (the neutral form a ``TableSpec`` holds) as Spark's, for the Spark store.

Spark's own Arrow mapping, read backwards: a naive timestamp is ``TimestampNTZType``, an instant
``TimestampType``, so ``spark_schema(to_arrow_schema(s, timezone="UTC")) == s`` for every type the
registry maps (tests/unit/values/test_arrow_types.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import DataType, StructField, StructType


def spark_type(arrow: pa.DataType) -> DataType:
    from pyspark.sql.pandas.types import from_arrow_type

    return from_arrow_type(arrow, prefer_timestamp_ntz=True)


def spark_field(field: pa.Field) -> StructField:
    from pyspark.sql.types import StructField

    return StructField(field.name, spark_type(field.type), field.nullable)


def spark_schema(schema: pa.Schema | list[pa.Field]) -> StructType:
    from pyspark.sql.types import StructType

    return StructType([spark_field(f) for f in schema])


def spark_ddl_type(arrow: pa.DataType) -> str:
    """The type as Spark SQL's DDL writes it (``ALTER TABLE ... ADD COLUMNS``)."""
    return spark_type(arrow).simpleString()
