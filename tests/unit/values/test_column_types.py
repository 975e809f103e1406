"""The registry's column types are Arrow's, and each is exactly what the Spark store and the Delta log
make of it: Spark's type per docs/types.md, the same Arrow type back from Spark's own mapping (so both
engines write the same Parquet), and the same Delta JSON type delta-rs and Spark write in the log."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_type

from applier.sink.changefeed import feed_spec
from applier.sink.extras import ExtraColumns
from applier.sink.history import history_spec
from applier.sink.spec import TableSpec
from applier.sink.store.deltatypes import delta_type
from applier.spark.types import spark_type
from applier.values import arrow_type_for, oids

#: PostgreSQL type (OID, typmod) -> the Spark type docs/types.md documents
DOCUMENTED = {
    (oids.BOOL, -1): "boolean", (oids.INT2, -1): "smallint", (oids.INT4, -1): "int", (oids.INT8, -1): "bigint",
    (oids.OID, -1): "bigint", (oids.FLOAT4, -1): "float", (oids.FLOAT8, -1): "double", (oids.TEXT, -1): "string",
    (oids.VARCHAR, -1): "string", (oids.BPCHAR, -1): "string", (oids.NAME, -1): "string", (oids.CHAR, -1): "string",
    (oids.BYTEA, -1): "binary", (oids.UUID, -1): "string", (oids.JSON, -1): "string", (oids.JSONB, -1): "string",
    (oids.DATE, -1): "date", (oids.TIMESTAMP, -1): "timestamp_ntz", (oids.TIMESTAMPTZ, -1): "timestamp",
    (oids.TIME, -1): "string", (oids.TIMETZ, -1): "string", (oids.INTERVAL, -1): "string",
    (oids.NUMERIC, -1): "string", (oids.NUMERIC, (12 << 16 | 3) + 4): "decimal(12,3)",
    (oids.NUMERIC, (38 << 16 | 0) + 4): "decimal(38,0)", (oids.NUMERIC, (39 << 16 | 2) + 4): "string",
    (1007, -1): "array<int>", (1185, -1): "array<timestamp>", (1115, -1): "array<timestamp_ntz>",
    (1231, (10 << 16 | 2) + 4): "array<decimal(10,2)>", (1009, -1): "array<string>",
    (12345, -1): "string",  # a type the registry does not know: its text
}


@pytest.mark.parametrize(("oid", "typmod"), list(DOCUMENTED), ids=[f"{o}:{t}" for o, t in DOCUMENTED])
def test_each_type_is_the_documented_spark_type_and_the_same_arrow_and_delta_type_back(oid: int, typmod: int) -> None:
    arrow = arrow_type_for(oid, typmod, None)
    spark = spark_type(arrow)
    assert spark.simpleString() == DOCUMENTED[(oid, typmod)]
    assert to_arrow_type(spark, timezone="UTC") == arrow  # what the Spark store hands to Arrow, and back
    assert delta_type(arrow) == spark.jsonValue()


def test_every_registered_type_converts_both_ways() -> None:
    for oid in [*oids.BUILTIN_BY_NAME.values(), *oids.ARRAY_ELEMENT]:
        arrow = arrow_type_for(oid, -1, None)
        assert to_arrow_type(spark_type(arrow), timezone="UTC") == arrow, oid
        assert delta_type(arrow) == spark_type(arrow).jsonValue(), oid


def test_the_columns_applier_adds_convert_both_ways() -> None:
    own = TableSpec("public.t", pa.schema([pa.field("id", pa.int64())]), ("id",), "d")
    added = [*ExtraColumns("lsn", "at", "op", "deleted").fields(), *list(history_spec(own).schema)[1:],
             *list(feed_spec(own).schema)[1:]]
    for field in added:
        assert field.nullable
        assert to_arrow_type(spark_type(field.type), timezone="UTC") == field.type, field
        assert delta_type(field.type) == spark_type(field.type).jsonValue(), field
