"""Benchmark: a column rename as a table rewrite vs with column mapping, by table size (issue 50 item 4).

    .venv/bin/python bench/rename_rewrite.py [--rows 100000 1000000] [--dir DIR] [--no-warmup]

For each size a Delta table ``(id int, a string, n bigint, t timestamp)`` of that many rows is written
by Spark, then copied twice: one copy gets ``rewrite_renamed`` (``apply.column_renames: rewrite``: one
overwrite commit under the new name), the other column mapping and ``ALTER TABLE ... RENAME COLUMN``
(``map``). A table of 1,000 rows goes through both first, untimed (Spark's first jobs compile its
code). Prints the data files' size and both times; the last line is one JSON object (``sizes``: one
entry per size, by its rows). What docs/schema-changes.md's threshold (``apply.rename_rewrite_max_mb``) is
argued from.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from applier.sink.naming import delta_path_sql
from applier.sink.spec import TableSpec
from applier.sink.store.sparkbase import SparkTables
from applier.sink.store.sparkddl import enable_column_mapping, rewrite_renamed
from applier.spark.session import SparkSettings, build_spark_session


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--dir", default=None)
    parser.add_argument("--no-warmup", action="store_true",
                        help="leave out the untimed warm-up (the test suite's smoke run: its figures mean nothing)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rename-bench-") as tmp:
        results = measure(Path(args.dir or tmp), args.rows, warmup=not args.no_warmup)
    print(json.dumps({"sizes": {str(r["rows"]): r for r in results}}))


def measure(root: Path, sizes: list[int], *, warmup: bool = True) -> list[dict[str, float]]:
    spark = build_spark_session(SparkSettings(app_name="rename-bench"))
    spec = TableSpec("bench.t", pa.schema([("id", pa.int32()), ("b", pa.string()), ("n", pa.int64()),
                                           ("t", pa.timestamp("us"))]), ("id",), "d")
    if warmup:
        one(spark, root, 1000, spec)  # not reported
    results = []
    for rows in sizes:
        result = one(spark, root, rows, spec)
        print(result, file=sys.stderr, flush=True)
        results.append(result)
    return results


def one(spark: Any, root: Path, rows: int, spec: TableSpec) -> dict[str, float]:
    """One size: the table written, copied twice, one copy rewritten, the other column-mapped."""
    base = root / f"base-{rows}"
    spark.range(rows).selectExpr("cast(id as int) id", "concat('value ', id) a", "id * 7 n",
                                 "timestamp_seconds(id) t").write.format("delta").mode("overwrite").save(str(base))
    size = int(SparkTables(spark)._snapshot(str(base)).sizeInBytes())
    rewrite, mapped = root / f"rewrite-{rows}", root / f"map-{rows}"
    for copy in (rewrite, mapped):
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(base, copy)
    start = time.perf_counter()
    rewrite_renamed(spark, str(rewrite), spec, {"a": "b"})
    rewrite_s = time.perf_counter() - start
    start = time.perf_counter()
    enable_column_mapping(spark, str(mapped), table="bench.t")
    spark.sql(f"ALTER TABLE {delta_path_sql(str(mapped))} RENAME COLUMN a TO b")
    map_s = time.perf_counter() - start
    return {"rows": rows, "size_mb": round(size / 2**20, 1), "rewrite_s": round(rewrite_s, 2),
            "map_s": round(map_s, 2)}


if __name__ == "__main__":
    main()
