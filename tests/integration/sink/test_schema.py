"""Delta table creation and schema evolution on a real local Delta."""

from __future__ import annotations

import json

import pytest
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import DecimalType, IntegerType, LongType, StringType, StructField, StructType

from applier.errors import SinkError
from applier.sink.schema import ensure_table
from applier.sink.spec import PROP_DROPPED, PROP_KEYS, TableSpec
from applier.sink.store import StorePicker
from applier.spark.types import spark_schema

pytestmark = pytest.mark.spark


def spec(*fields: StructField, keys: tuple[str, ...] = ("id",)) -> TableSpec:
    """A spec of these Spark types, as the registry's Arrow types (Spark's own mapping of them)."""
    return TableSpec("public.weird", to_arrow_schema(StructType(list(fields)), timezone="UTC"), keys, "d")


def props(spark, path: str) -> dict[str, str]:
    from delta.tables import DeltaTable

    return DeltaTable.forPath(spark, path).detail().collect()[0]["properties"]


def test_create_add_widen_drop_and_refuse_narrowing(spark, tmp_path):
    path = str(tmp_path / "public" / "weird")
    v1 = spec(StructField("id", IntegerType()), StructField("a b`c", StringType()),
              StructField("amount", DecimalType(10, 2)))
    evo = ensure_table(spark, path, v1)
    assert evo.added == ("id", "a b`c", "amount")
    p = props(spark, path)
    assert json.loads(p[PROP_KEYS]) == ["id"]
    assert p["delta.columnMapping.mode"] == "name"  # the column name has a space

    spark.createDataFrame([(1, "x", None)], spark_schema(v1.schema)).write.format("delta").mode("append").save(path)

    v2 = spec(StructField("id", LongType()), StructField("amount", DecimalType(12, 2)),
              StructField("new 'col\\", StringType()))
    evo = ensure_table(spark, path, v2)
    assert evo.added == ("new 'col\\",)
    assert set(evo.widened) == {"id", "amount"}
    assert evo.dropped == ("a b`c",)
    schema = {f.name: f.dataType for f in spark.read.format("delta").load(path).schema.fields}
    assert schema == {"id": LongType(), "a b`c": StringType(), "amount": DecimalType(12, 2),
                      "new 'col\\": StringType()}
    assert json.loads(props(spark, path)[PROP_DROPPED]) == ["a b`c"]
    assert spark.read.format("delta").load(path).collect()[0]["a b`c"] == "x"  # kept, not lost

    v3 = spec(StructField("id", StringType()), StructField("amount", DecimalType(12, 2)),
              StructField("new 'col\\", StringType()))
    with pytest.raises(SinkError, match="cannot widen"):
        ensure_table(spark, path, v3)


def test_columns_added_and_dropped_on_a_table_delta_rs_writes_need_no_spark(spark, tmp_path):
    """An ADD COLUMN or a DROP COLUMN evolves a plain table through delta-rs: a Spark provider is never
    started, and Spark reads the table and its properties as if it had made the change itself."""
    from applier.spark.session import SparkProvider

    def refuse() -> None:
        raise AssertionError("Spark was started for a change delta-rs makes")

    never = SparkProvider(refuse)  # type: ignore[arg-type]
    path = str(tmp_path / "public" / "plain")
    v1 = spec(StructField("id", IntegerType()), StructField("a", StringType()))
    assert ensure_table(never, path, v1, stores=StorePicker(never)).added == ("id", "a")
    spark.createDataFrame([(1, "x")], spark_schema(v1.schema)).write.format("delta").mode("append").save(path)

    v2 = spec(StructField("id", IntegerType()), StructField("b", StringType()),
              StructField("c", StructType([StructField("d", LongType())])), keys=("id", "b"))
    evo = ensure_table(never, path, v2)
    assert (evo.added, evo.widened, evo.dropped) == (("b", "c"), (), ("a",))
    table = spark.read.format("delta").load(path)
    assert [f.name for f in table.schema.fields] == ["id", "a", "b", "c"]
    assert table.schema["c"].dataType == StructType([StructField("d", LongType())])
    assert [tuple(r) for r in table.collect()] == [(1, "x", None, None)]
    p = props(spark, path)
    assert json.loads(p[PROP_DROPPED]) == ["a"] and json.loads(p[PROP_KEYS]) == ["id", "b"]
    again = ensure_table(never, path, v2)  # nothing left to change
    assert (again.added, again.widened, again.dropped) == ((), (), ("a",))

    # a retype is not delta-rs's: it needs Spark (here: the refusing provider says so)
    v3 = spec(StructField("id", LongType()), StructField("b", StringType()),
              StructField("c", StructType([StructField("d", LongType())])), keys=("id", "b"))
    with pytest.raises(AssertionError, match="Spark was started"):
        ensure_table(never, path, v3)
