"""Benchmark: catching up a backlog of ~1 million changes from a slot, applier vs PostgreSQL's own
logical replication (CREATE SUBSCRIPTION in a second server on the same machine).

    .venv/bin/python bench/catchup.py [--transactions 10000] [--rows-per-transaction 100]

Setup (not timed): two servers started by the script; table ``cu_items`` published on the first; a
subscription in database ``replica`` of the second, over its own slot, created disabled (so that the
subscriber's writes go to a WAL of their own: in a database of the same server, ``applier mirror
--once``, which reads up to the server's WAL end, decoded them too); ``applier mirror --once`` run
once so that its slot exists and its snapshot (of the still-empty table) is taken. Then the backlog: each
transaction inserts 50 rows, updates 40 and deletes 10 (100 changes), and a final transaction
writes a marker row.

Timed, one after the other so they do not share the 2 cores:
- PostgreSQL: from ``ALTER SUBSCRIPTION ... ENABLE`` until the marker row is visible in ``replica``;
- applier: ``applier mirror --once`` in a process whose Spark session is already up (its start-up
  time is reported separately), until it returns, i.e. everything is committed to Delta and
  confirmed to the slot. The result is verified against Postgres row by row.

The applier's process reports its peak RSS and the JVM's peak heap. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from memory import mirror_once_measured, spark_settings  # noqa: E402  (bench/memory.py)

SCHEMA = """
CREATE TABLE cu_items (id bigint PRIMARY KEY, v int NOT NULL, note text);
CREATE PUBLICATION cu_pub FOR TABLE cu_items;
CREATE PROCEDURE cu_run(n int, per int) LANGUAGE plpgsql AS $$
DECLARE base bigint := 0; ins int := per / 2; upd int := per * 2 / 5; del int := per - ins - upd;
BEGIN
  FOR i IN 1..n LOOP
    INSERT INTO cu_items SELECT base + g, g, 'row ' || (base + g) FROM generate_series(1, ins) g;
    UPDATE cu_items SET v = v + 1, note = note || '+' WHERE id > base - ins AND id <= base - ins + upd;
    DELETE FROM cu_items WHERE id > base - 2 * ins AND id <= base - 2 * ins + del;
    base := base + ins;
    COMMIT;
  END LOOP;
END $$;
"""


def log(msg: str) -> None:
    print(f"bench/catchup: {msg}", file=sys.stderr, flush=True)


def mirror_config(workdir: Path, target: str, *, group_transactions: int, overlap: bool, distributed: str) -> Path:
    import yaml

    path = workdir / "mirror.yaml"
    path.write_text(yaml.safe_dump({
        "source": {"slot": "applier", "publication": "cu_pub", "proto_version": 2, "streaming": "on"},
        "target": {"path": target},
        "apply": {"max_group_transactions": group_transactions, "max_group_rows": 2_000_000,
                  "overlap_groups": overlap},
        "distributed": {"mode": distributed},
    }))
    return path


def run_mirror(args: argparse.Namespace) -> None:
    """(child process) mirror --once with the Spark session already started."""
    import yaml
    from deltalake import DeltaTable

    target = yaml.safe_load(Path(args.config).read_text())["target"]["path"]
    result = mirror_once_measured(args.config, args.dsn, locations=(target,))
    table = DeltaTable(f"{target}/public/cu_items")
    print(json.dumps({**result, "delta_commits": table.version() + 1}))


def child(config: Path, dsn: str) -> dict[str, object]:
    out = subprocess.run([sys.executable, __file__, "--child", "--config", str(config), "--dsn", dsn],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"bench/catchup: mirror failed:\n{out.stderr[-3000:]}")
    lines = [line for line in out.stderr.splitlines() if "applier.drivers" in line or "catch-up" in line]
    if lines:  # where the time went (the run's own timing lines)
        log("mirror: " + "\n    ".join(lines[-6:]))
    return json.loads(out.stdout.strip().splitlines()[-1])


def setup_mirror(config: Path, dsn: str) -> None:
    """(not timed) ``applier mirror --once`` as a plain command, to create its slot and snapshot the
    still-empty table: nothing is measured, so no Spark session is started ahead of it (``child`` starts
    one), and the command starts none for an empty copy."""
    out = subprocess.run([sys.executable, "-m", "applier.cli", "mirror", "--config", str(config), "--once"],
                         env={**os.environ, "APPLIER_DSN": dsn}, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"bench: setting up the mirror failed:\n{out.stderr[-3000:]}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--transactions", type=int, default=10_000)
    p.add_argument("--rows-per-transaction", type=int, default=100)
    p.add_argument("--group-transactions", type=int, default=10_000,
                   help="apply.max_group_transactions of the mirror (default 10,000)")
    p.add_argument("--overlap", action="store_true",
                   help="apply.overlap_groups: decode the next group while the previous one commits")
    p.add_argument("--distributed", choices=["auto", "on", "off"], default="auto",
                   help="distributed.mode of the mirror: catch the backlog up on Spark's executors (auto: when it "
                   "is at least distributed.min_backlog_mb; off: the driver path)")
    p.add_argument("--store", choices=["local", "s3"], default="local",
                   help="where the Delta tables go: a local directory, or a bucket on a local S3-protocol server "
                   "(moto's, started here on loopback; every commit is HTTP requests)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--config", help=argparse.SUPPRESS)
    p.add_argument("--dsn", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        run_mirror(args)
        return

    import psycopg

    from applier.checks.verify import verify_against_postgres
    from applier.devtools.pgcluster import start_cluster

    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory(prefix="bench-catchup-") as tmp, \
            start_cluster() as cluster, start_cluster() as subscriber, \
            psycopg.connect(cluster.dsn(), autocommit=True) as conn:
        work = Path(tmp)
        target = str(work / "delta")
        if args.store == "s3":
            from applier.devtools.s3server import serve_this_process

            target = f"{serve_this_process(stack, work)}/delta"
        conn.execute(SCHEMA)
        with psycopg.connect(subscriber.dsn(), autocommit=True) as admin:
            admin.execute("CREATE DATABASE replica")
        with psycopg.connect(subscriber.dsn("replica"), autocommit=True) as rep:
            rep.execute("CREATE TABLE cu_items (id bigint PRIMARY KEY, v int NOT NULL, note text)")
            conn.execute("SELECT pg_create_logical_replication_slot('pgsub', 'pgoutput')")
            rep.execute(f"CREATE SUBSCRIPTION pgsub CONNECTION '{cluster.dsn()}' PUBLICATION cu_pub "
                        "WITH (create_slot = false, slot_name = 'pgsub', copy_data = false, enabled = false)")
        config = mirror_config(work, target, group_transactions=args.group_transactions, overlap=args.overlap,
                               distributed=args.distributed)
        setup_mirror(config, cluster.dsn())  # creates the applier's slot and snapshots the empty table
        started = time.monotonic()
        conn.execute("SET synchronous_commit = off")
        conn.execute("CALL cu_run(%s, %s)", (args.transactions, args.rows_per_transaction))
        conn.execute("SET synchronous_commit = on")
        conn.execute("INSERT INTO cu_items VALUES (-1, 0, 'marker')")
        n, per = args.transactions, args.rows_per_transaction  # the first two have nothing to update/delete
        changes = n * (per // 2) + (n - 1) * (per * 2 // 5) + (n - 2) * (per - per // 2 - per * 2 // 5) + 1
        (rows,) = conn.execute("SELECT count(*) FROM cu_items").fetchone()  # type: ignore[misc]
        (backlog,) = conn.execute(  # type: ignore[misc]
            "SELECT pg_current_wal_flush_lsn() - confirmed_flush_lsn FROM pg_replication_slots "
            "WHERE slot_name = 'applier'").fetchone()
        log(f"backlog: {changes} changes in {args.transactions + 1} transactions, {int(backlog) >> 20} MiB of WAL, "
            f"written in {time.monotonic() - started:.1f} s; {rows} rows remain")

        with psycopg.connect(subscriber.dsn("replica"), autocommit=True) as rep:
            started = time.monotonic()
            rep.execute("ALTER SUBSCRIPTION pgsub ENABLE")
            while not rep.execute("SELECT EXISTS (SELECT 1 FROM cu_items WHERE id = -1)").fetchone()[0]:  # type: ignore[index]
                time.sleep(0.05)
            postgres_seconds = time.monotonic() - started
            rep.execute("ALTER SUBSCRIPTION pgsub DISABLE")
            (rep_rows,) = rep.execute("SELECT count(*) FROM cu_items").fetchone()  # type: ignore[misc]
        log(f"PostgreSQL's subscription caught up in {postgres_seconds:.1f} s ({rep_rows} rows)")

        ours = child(config, cluster.dsn())
        log(f"applier mirror caught up in {ours['seconds']:.1f} s: {json.dumps(ours)}")
        from applier.spark.session import build_spark_session

        spark = build_spark_session(spark_settings(locations=(target,)))
        results = verify_against_postgres(spark, conn, target, [("public", "cu_items")])
        equal = all(r.equal for r in results)
        if not equal or rep_rows != rows:
            raise SystemExit(f"bench/catchup: results differ (delta equal: {equal}, replica rows {rep_rows} vs {rows})")

    print(json.dumps({
        "changes": changes, "transactions": args.transactions + 1, "final_rows": rows,
        "group_transactions": args.group_transactions, "overlap_groups": args.overlap, "store": args.store,
        "distributed": args.distributed, "backlog_wal_mb": int(backlog) >> 20,
        "postgres_subscription_seconds": round(postgres_seconds, 1),
        "postgres_changes_per_s": round(changes / postgres_seconds),
        "applier_seconds": round(float(ours["seconds"]), 1),  # type: ignore[arg-type]
        "applier_changes_per_s": round(changes / float(ours["seconds"])),  # type: ignore[arg-type]
        "applier_spark_startup_seconds": round(float(ours["spark_startup_seconds"]), 1),  # type: ignore[arg-type]
        "applier_delta_commits_in_all": ours["delta_commits"],
        "applier_vs_postgres": round(postgres_seconds / float(ours["seconds"]), 2),  # type: ignore[arg-type]
        "verified_equal": True,
        "memory": {"python_peak_rss_mb": ours["python_peak_rss_mb"], "jvm_peak_heap_mb": ours["jvm_peak_heap_mb"]},
    }))


if __name__ == "__main__":
    main()
