"""Benchmark: the initial copy of a pgbench database, applier vs PostgreSQL's own table sync vs a
plain delta-rs copy.

    .venv/bin/python bench/snapshot.py [--scale 20] [--parallelism 1,2] [--typed]

``--typed``: instead of pgbench's tables (integers and char(n) only), one table of SCALE x 100,000 rows
of the types real schemas have: (bigint key, timestamptz, date, numeric(12,2), float8, uuid, text, bool,
jsonb), the same in ``replica``.

Setup (not timed): a throw-away server started by the script, ``pgbench -i -s SCALE`` (SCALE x 100,000
``pgbench_accounts`` rows, plus branches, tellers and the empty history), the four tables published;
a database ``replica`` with the same (empty) tables.

Timed, one after the other so they do not share the cores:
- PostgreSQL: from enabling a subscription (``copy_data = true``, created disabled over a slot made
  beforehand: one to the same server cannot create its slot itself) in ``replica`` until every table
  of the subscription is ready (``pg_subscription_rel.srsubstate = 'r'``);
- applier: the whole command as a user runs it, ``python -m applier.cli mirror --once`` in a process of
  its own, into a fresh target for each ``--parallelism`` (the ``snapshot.parallelism`` setting); Spark
  starts only if the command needs it (a keyed table delta-rs writes does not); the run's own time
  (its ``time:`` line) is reported too; the result is verified against Postgres row by row (count and
  checksum per table);
- delta-rs: ``COPY ... TO STDOUT (FORMAT csv)`` -> ``pyarrow.csv`` -> ``deltalake.write_deltalake``,
  one table after another, in this process.

The applier's peak RSS is the largest of the command's process and its children (a JVM, if it
started one), from ``getrusage(RUSAGE_CHILDREN)``. The last line is one JSON object with
each time and the ratios (PostgreSQL's seconds / applier's: >= 1.0 means applier is no slower).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from memory import spark_settings  # noqa: E402  (bench/memory.py)

TABLES = ("pgbench_accounts", "pgbench_branches", "pgbench_history", "pgbench_tellers")
TYPED_TABLES = ("typed",)
TYPED_DDL = ("CREATE TABLE typed (id bigint PRIMARY KEY, ts timestamptz, d date, n numeric(12,2), f float8, "
             "u uuid, t text, b bool, j jsonb)")
TYPED_ROWS = """INSERT INTO typed SELECT i, timestamptz '2020-01-01 00:00:00+00' + i * interval '1.000123 second',
    date '1990-01-01' + (i % 20000), (i % 10000000) / 100.0 - 5000, i / 7.0, md5(i::text)::uuid,
    'customer ' || i || ' note', i % 3 = 0, jsonb_build_object('id', i, 'tags', jsonb_build_array('a', i % 10))
FROM generate_series(1, {rows}) i"""


def log(msg: str) -> None:
    print(f"bench/snapshot: {msg}", file=sys.stderr, flush=True)


def drop_slot(conn: object, slot: str) -> None:
    """Drop ``slot`` once its walsender has gone (a dropped subscription's lingers for a moment)."""
    for _ in range(200):
        row = conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s",  # type: ignore[attr-defined]
                           (slot,)).fetchone()
        if row is None:
            return
        if not row[0]:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))  # type: ignore[attr-defined]
            return
        time.sleep(0.05)
    raise SystemExit(f"bench/snapshot: slot {slot} stayed active")


def applier_copy(work: Path, root: str, dsn: str, run: str) -> dict[str, object]:
    """One copy by the command; ``run``: the parallelism, then ``-executors`` for a copy on Spark's
    executors (``snapshot.on_executors: true``; the default master, local[2] unless spark.master says)."""
    import yaml

    parallelism, _, where = run.partition("-")
    config = work / f"mirror-{run}.yaml"
    config.write_text(yaml.safe_dump({
        "source": {"slot": f"bench_{run.replace('-', '_')}", "publication": "bench_pub"},
        "target": {"path": f"{root}/delta-{run}"},
        "snapshot": {"parallelism": int(parallelism), "on_executors": where == "executors"},
    }))
    import resource

    repo = Path(__file__).resolve().parent.parent
    env = {**os.environ, "APPLIER_DSN": dsn, "PYTHONPATH": str(repo)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "applier.cli", "mirror", "--config", str(config), "--once"],
                         capture_output=True, text=True, env=env)
    process_seconds = time.monotonic() - started
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if out.returncode != 0:
        raise SystemExit(f"bench/snapshot: mirror failed:\n{out.stderr[-3000:]}")
    spark = False
    for line in out.stderr.splitlines():
        if "snapshot:" in line or "starting Spark" in line:
            log(line)
        spark = spark or "starting Spark" in line
    run_seconds = next(float(line.split()[1].rstrip("s")) for line in out.stdout.splitlines()
                       if line.startswith("time: "))
    return {"seconds": run_seconds, "process_seconds": process_seconds, "spark_started": spark,
            "peak_rss_mb": round(peak_kb / 1024) if peak_kb > before else None}


def deltars_copy(conn: object, target: Path, tables: tuple[str, ...]) -> float:
    """The plain copy a user could write: COPY csv -> pyarrow -> write_deltalake, table by table."""
    import pyarrow as pa
    from deltalake import write_deltalake
    from pyarrow import csv

    started = time.monotonic()
    for table in tables:
        data = bytearray()
        with conn.cursor().copy(f"COPY {table} TO STDOUT (FORMAT csv, HEADER)") as copy:  # type: ignore[attr-defined]
            for block in copy:
                data += block
        frame = csv.read_csv(pa.py_buffer(data), convert_options=csv.ConvertOptions(
            strings_can_be_null=True, quoted_strings_can_be_null=False))
        write_deltalake(str(target / table), frame, mode="overwrite")
    return time.monotonic() - started


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", type=int, default=20)
    p.add_argument("--parallelism", default=f"1,{os.cpu_count() or 1}",
                   help="snapshot.parallelism values to run applier with (comma list)")
    p.add_argument("--where", default="driver",
                   help="where applier copies (comma list): driver (its own connections), executors (Spark's "
                   "executors: snapshot.on_executors)")
    p.add_argument("--typed", action="store_true",
                   help="one table of the common types (timestamptz, date, numeric, float8, uuid, jsonb, ...)")
    p.add_argument("--store", choices=["local", "s3"], default="local",
                   help="where applier's copies go: a local directory, or a bucket on a local S3-protocol server "
                   "(moto's, started here on loopback)")
    args = p.parse_args()

    import psycopg

    from applier.checks.verify import verify_against_postgres
    from applier.devtools.pgcluster import start_cluster

    levels = [f"{n}{'' if where == 'driver' else '-' + where}"
              for where in dict.fromkeys(w.strip() for w in args.where.split(",") if w.strip())
              for n in sorted({int(x) for x in args.parallelism.split(",") if x})]
    if any(w not in ("driver", "executors") for w in args.where.split(",")):
        p.error("--where takes driver and executors")
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory(prefix="bench-snapshot-") as tmp, \
            start_cluster() as cluster, \
            psycopg.connect(cluster.dsn(), autocommit=True) as conn:
        work = Path(tmp)
        root = str(work)
        if args.store == "s3":
            from applier.devtools.s3server import serve_this_process

            root = serve_this_process(stack, work)
        tables = TYPED_TABLES if args.typed else TABLES
        main_table = tables[0]
        started = time.monotonic()
        if args.typed:
            conn.execute(TYPED_DDL)
            conn.execute(TYPED_ROWS.replace("{rows}", str(args.scale * 100_000)))
            conn.execute("VACUUM ANALYZE typed")
        else:
            pgbench = cluster.installation.binary("pgbench")
            if not Path(pgbench).exists():
                pgbench = shutil.which("pgbench") or "pgbench"
            subprocess.run([pgbench, "-i", "-q", "-s", str(args.scale), cluster.dsn()], check=True,
                           capture_output=True)
        (rows,) = conn.execute(f"SELECT count(*) FROM {main_table}").fetchone()  # type: ignore[misc]
        log(f"{'typed' if args.typed else f'pgbench -i -s {args.scale}'}: {rows} rows in {main_table} in "
            f"{time.monotonic() - started:.1f} s")
        conn.execute(f"CREATE PUBLICATION bench_pub FOR TABLE {', '.join(tables)}")
        conn.execute("CREATE DATABASE replica")
        if args.typed:
            with psycopg.connect(cluster.dsn("replica"), autocommit=True) as rep:
                rep.execute(TYPED_DDL)
        else:
            subprocess.run([pgbench, "-i", "-q", "-I", "dtp", "-s", str(args.scale), cluster.dsn("replica")],
                           check=True, capture_output=True)
        conn.execute("CHECKPOINT")

        with psycopg.connect(cluster.dsn("replica"), autocommit=True) as rep:
            # a subscription to the same server cannot create its slot in the same command (it would wait
            # for itself): the slot first, then enabling the subscription starts the copy
            conn.execute("SELECT pg_create_logical_replication_slot('pgsub', 'pgoutput')")
            rep.execute(f"CREATE SUBSCRIPTION pgsub CONNECTION '{cluster.dsn()}' PUBLICATION bench_pub "
                        "WITH (create_slot = false, slot_name = 'pgsub', copy_data = true, enabled = false)")
            started = time.monotonic()
            rep.execute("ALTER SUBSCRIPTION pgsub ENABLE")
            while True:
                (ready, total) = rep.execute(  # type: ignore[misc]
                    "SELECT count(*) FILTER (WHERE srsubstate = 'r'), count(*) FROM pg_subscription_rel r "
                    "JOIN pg_subscription s ON s.oid = r.srsubid WHERE s.subname = 'pgsub'").fetchone()
                if total == len(tables) and ready == total:
                    break
                time.sleep(0.05)
            postgres_seconds = time.monotonic() - started
            (rep_rows,) = rep.execute(f"SELECT count(*) FROM {main_table}").fetchone()  # type: ignore[misc]
            rep.execute("ALTER SUBSCRIPTION pgsub DISABLE")
            rep.execute("ALTER SUBSCRIPTION pgsub SET (slot_name = NONE)")
            rep.execute("DROP SUBSCRIPTION pgsub")
        drop_slot(conn, "pgsub")
        log(f"PostgreSQL's subscription copied every table in {postgres_seconds:.1f} s "
            f"({rep_rows} rows in {main_table})")
        if rep_rows != rows:
            raise SystemExit(f"bench/snapshot: the subscription copied {rep_rows} rows of {rows}")

        runs: dict[str, dict[str, object]] = {}
        for level in levels:
            runs[level] = applier_copy(work, root, cluster.dsn(), level)
            drop_slot(conn, f"bench_{level.replace('-', '_')}")
            log(f"applier (parallelism {level}): {float(runs[level]['seconds']):.1f} s "  # type: ignore[arg-type]
                f"({json.dumps(runs[level])})")

        deltars_seconds = deltars_copy(conn, work / "deltars", tables)
        log(f"delta-rs plain copy: {deltars_seconds:.1f} s")

        from applier.spark.session import build_spark_session

        # verify reads each table through Spark's toLocalIterator, one partition at a time: 10M rows
        # that delta-rs wrote in few files make partitions a 2g driver cannot hold (OOM at --scale 100)
        spark = build_spark_session(spark_settings(driver_memory="8g", locations=(root,)))
        for level in levels:
            results = verify_against_postgres(spark, conn, f"{root}/delta-{level}",
                                              [("public", t) for t in tables])
            bad = [r.source_name for r in results if not r.equal]
            if bad:
                raise SystemExit(f"bench/snapshot: applier (parallelism {level}) differs from Postgres: {bad}")
        deltars_rows = spark.read.format("delta").load(str(work / "deltars" / main_table)).count()
        if deltars_rows != rows:
            raise SystemExit(f"bench/snapshot: the delta-rs copy has {deltars_rows} rows of {rows}")
        spark.stop()

    best = min(levels, key=lambda lv: float(runs[lv]["seconds"]))  # type: ignore[arg-type]
    best_seconds = float(runs[best]["seconds"])  # type: ignore[arg-type]
    print(json.dumps({
        "scale": args.scale, "typed": args.typed, "store": args.store, "rows": rows, "cores": os.cpu_count(),
        "postgres_subscription_seconds": round(postgres_seconds, 1),
        "deltars_seconds": round(deltars_seconds, 1),
        "applier": {lv: {
            "seconds": round(float(r["seconds"]), 1),  # type: ignore[arg-type]
            "rows_per_s": round(rows / float(r["seconds"])),  # type: ignore[arg-type]
            "process_seconds": round(float(r["process_seconds"]), 1),  # type: ignore[arg-type]
            "spark_started": r["spark_started"], "peak_rss_mb": r["peak_rss_mb"]}
            for lv, r in runs.items()},
        "applier_vs_postgres": round(postgres_seconds / best_seconds, 2),
        "applier_process_vs_postgres": round(postgres_seconds / float(runs[best]["process_seconds"]), 2),  # type: ignore[arg-type]
        "applier_vs_deltars": round(deltars_seconds / best_seconds, 2),
        "best_parallelism": best,
        # the executors' copy against the driver's at the same parallelism (>= 1.0: executors no slower)
        "executors_vs_driver": {lv: round(float(runs[lv.removesuffix("-executors")]["seconds"])  # type: ignore[arg-type]
                                          / float(r["seconds"]), 2)  # type: ignore[arg-type]
                                for lv, r in runs.items()
                                if lv.endswith("-executors") and lv.removesuffix("-executors") in runs},
        "verified_equal": True,
    }))


if __name__ == "__main__":
    main()
