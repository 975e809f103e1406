"""The readers people open applier's tables with, each giving a table's rows as dicts, and the comparison
of such rows with Postgres: shared by the tests that read every kind of table applier writes
(tests/integration/test_every_reader.py, test_safe_column_names.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from applier.checks.verify import compare, postgres_table_rows

Rows = list[dict[str, Any]]


def spark_rows(spark) -> Callable[[Path], Rows]:
    return lambda path: [r.asDict() for r in spark.read.format("delta").load(str(path)).collect()]


def query_builder_rows(path: Path) -> Rows:
    import deltalake
    import pyarrow as pa

    table = deltalake.DeltaTable(str(path))
    return pa.table(deltalake.QueryBuilder().register("t", table).execute("SELECT * FROM t").read_all()).to_pylist()


def pyarrow_rows(path: Path) -> Rows:
    import deltalake

    return deltalake.DeltaTable(str(path)).to_pyarrow_table().to_pylist()


def pandas_rows(path: Path) -> Rows:
    """``to_pandas()`` as a pandas user gets it; NaN/NaT back to None, an int column that pandas made
    float (it has NULLs) back to int, numpy and pandas scalars to Python's, to compare."""
    import deltalake
    import pandas as pd
    import pyarrow as pa

    table = deltalake.DeltaTable(str(path))
    frame = table.to_pandas()
    ints = {f.name for f in pa.schema(table.schema().to_arrow()) if pa.types.is_integer(f.type)}

    def plain(name: str, value: Any) -> Any:
        if value is None or (not isinstance(value, (list, dict)) and pd.isna(value)):
            return None
        if isinstance(value, pd.Timestamp):
            return value.to_pydatetime()
        if hasattr(value, "item"):
            value = value.item()
        return int(value) if name in ints else value

    return [{k: plain(k, v) for k, v in row.items()} for row in frame.to_dict("records")]


def polars_rows(path: Path) -> Rows:
    import polars as pl

    return pl.read_delta(str(path)).to_dicts()


def readers(spark) -> dict[str, Callable[[Path], Rows]]:
    """Every reader by name: Spark, delta-rs's DataFusion engine, its pyarrow path, pandas and Polars."""
    return {"spark": spark_rows(spark), "QueryBuilder": query_builder_rows, "to_pyarrow_table": pyarrow_rows,
            "to_pandas": pandas_rows, "polars": polars_rows}


def assert_equals_postgres(conn, namespace: str, table: str, rows: Rows, what: str, *,
                           delta_name: Callable[[str], str] = str) -> int:
    """``rows`` (keyed by Delta column names) equal to the Postgres table's; ``delta_name``: a Postgres
    column's name in Delta (column_names: safe). Returns the number of rows."""
    names, pg_rows = postgres_table_rows(conn, namespace, table)
    result = compare(f"{namespace}.{table}", pg_rows, iter([tuple(r[delta_name(c)] for c in names) for r in rows]))
    assert result.equal, (what, result.source_rows, result.target_rows, result.only_in_source[:3],
                          result.only_in_target[:3])
    return result.source_rows
