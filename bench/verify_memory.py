"""Benchmark: peak memory and time of ``applier verify`` on one large table (issue 77: 824 MB for 1M rows).

    .venv/bin/python bench/verify_memory.py [--rows 1000000] [--runs 3] [--code DIR ...] [--changed 3]

A server started by the script; a table ``v(id int PRIMARY KEY, name text, amount numeric(12,2),
at timestamptz)`` of ``--rows`` rows, and its equal Delta table under ``TARGET/public/v``, written with
delta-rs (``write_deltalake``) from the same rows as the mirror would hold them (int, string,
decimal(12,2), timestamp), which is faster than a mirror's copy and needs no JVM. Then, ``--runs``
times, each ``--code`` (a checkout of applier; default this one) in turn runs ``applier verify --target
TARGET`` in a fresh process (``PYTHONPATH`` and cwd the checkout, as ``bench/lazy.py``): its wall time
and peak RSS (``wait4``'s ru_maxrss) are measured, and it must exit 0. Last, ``--changed`` rows are
changed in Postgres and each checkout runs verify once more: it must exit 1 and every checkout must print
the same report (the rows only in Postgres / only in Delta), which shows that the old and the new code
agree. The last line is one JSON object, with the median of the runs per checkout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import psycopg
    import pyarrow as pa

HERE = Path(__file__).resolve().parent.parent


def log(msg: str) -> None:
    print(f"bench/verify_memory: {msg}", file=sys.stderr, flush=True)


def run_verify(code: str, dsn: str, target: Path) -> dict[str, object]:
    """``applier verify --target TARGET`` run from checkout ``code``: exit code, seconds, its own peak RSS
    (the child reaped with ``wait4``), output."""
    env = dict(os.environ, PYTHONPATH=code, APPLIER_DSN=dsn)
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        started = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "applier.cli", "verify", "--target", str(target)],
                                env=env, cwd=code, stdout=out, stderr=err, text=True)
        _pid, status, usage = os.wait4(proc.pid, 0)
        seconds = time.monotonic() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return {"exit": proc.returncode, "seconds": round(seconds, 1),
                "peak_rss_mb": round(usage.ru_maxrss / 1024, 1), "stdout": out.read(), "stderr": err.read()[-3000:]}


def write_delta(conn: psycopg.Connection, path: Path) -> None:
    """The Delta table the mirror would hold for ``v``, from Postgres' rows, batch by batch."""
    import pyarrow as pa
    from deltalake import write_deltalake

    schema = pa.schema([("id", pa.int32(), False), ("name", pa.string()), ("amount", pa.decimal128(12, 2)),
                        ("at", pa.timestamp("us", tz="UTC"))])

    def batches() -> Iterator[pa.RecordBatch]:
        with conn.cursor(name="bench_copy") as cur:
            cur.itersize = 50_000
            cur.execute("SELECT id, name, amount, at FROM v")
            while rows := cur.fetchmany(100_000):
                columns = zip(*rows, strict=True)
                yield pa.RecordBatch.from_arrays([pa.array(list(col), type=f.type)
                                                  for col, f in zip(columns, schema, strict=True)], schema=schema)

    with conn.transaction():
        write_deltalake(str(path), pa.RecordBatchReader.from_batches(schema, batches()))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--code", action="append", help="a checkout of applier (repeat; default: this one)")
    p.add_argument("--changed", type=int, default=3, help="rows changed in Postgres for the last, differing run")
    args = p.parse_args()
    codes = args.code or [str(HERE)]

    import psycopg

    from applier.devtools.pgcluster import start_cluster

    with tempfile.TemporaryDirectory(prefix="bench-verify-") as tmp, start_cluster() as cluster, \
            psycopg.connect(cluster.dsn(), autocommit=True) as conn:
        target = Path(tmp) / "delta"
        started = time.monotonic()
        conn.execute("CREATE TABLE v (id int PRIMARY KEY, name text, amount numeric(12,2), at timestamptz)")
        conn.execute("INSERT INTO v SELECT g, 'name ' || md5(g::text), (g % 1000000) / 100.0, "
                     "timestamptz '2020-01-01 00:00:00+00' + g * interval '1.5 second' "
                     f"FROM generate_series(1, {args.rows}) g")
        conn.execute("VACUUM ANALYZE v")
        write_delta(conn, target / "public" / "v")
        log(f"{args.rows:,} rows in Postgres and Delta in {time.monotonic() - started:.0f}s")
        runs: dict[str, list[dict[str, object]]] = {c: [] for c in codes}
        for i in range(args.runs):
            for n, code in enumerate(codes):
                result = run_verify(code, cluster.dsn(), target)
                if result["exit"] != 0:
                    raise SystemExit(f"bench/verify_memory: verify found differences or failed ({code}):\n"
                                     f"{result['stdout']}{result['stderr']}")
                log(f"run {i + 1}, code {n + 1}: {result['seconds']} s, peak RSS {result['peak_rss_mb']} MB")
                runs[code].append(result)
        differing: dict[str, dict[str, object]] = {}
        if args.changed:
            conn.execute(f"UPDATE v SET name = name || '!' WHERE id <= {args.changed}")
            for n, code in enumerate(codes):
                result = run_verify(code, cluster.dsn(), target)
                if result["exit"] != 1:
                    raise SystemExit(f"bench/verify_memory: verify did not exit 1 on a changed table ({code}):\n"
                                     f"{result['stdout']}{result['stderr']}")
                log(f"changed rows, code {n + 1}: {result['seconds']} s, peak RSS {result['peak_rss_mb']} MB")
                differing[code] = result
            reports = {str(r["stdout"]) for r in differing.values()}
            if len(reports) != 1:
                raise SystemExit(f"bench/verify_memory: the checkouts report differently: {sorted(reports)}")

    print(json.dumps({
        "rows": args.rows,
        "codes": {code: {
            "seconds": [r["seconds"] for r in rs], "peak_rss_mb": [r["peak_rss_mb"] for r in rs],
            "median_seconds": statistics.median(float(r["seconds"]) for r in rs),  # type: ignore[arg-type]
            "median_peak_rss_mb": statistics.median(float(r["peak_rss_mb"]) for r in rs),  # type: ignore[arg-type]
            "changed_seconds": differing[code]["seconds"] if code in differing else None,
            "changed_peak_rss_mb": differing[code]["peak_rss_mb"] if code in differing else None,
        } for code, rs in runs.items()},
        "changed_report": next(iter(differing.values()))["stdout"] if differing else None,
        "verified_equal": True,
    }))


if __name__ == "__main__":
    main()
