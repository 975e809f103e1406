"""Benchmark: commit-to-visible latency of the live mirror under a steady load.

    .venv/bin/python bench/lag.py [--rate 500] [--seconds 60] [--warmup 10] [--group-seconds 1]

A server started by the script; ``applier mirror`` (START_REPLICATION, grouped, with
``apply.max_group_seconds: --group-seconds``) runs in its own process. One client commits small
transactions (one insert each, ``synchronous_commit = off`` so that one connection can hold the
rate) at ``--rate`` per second, and records for each the wall-clock time its COMMIT returned and
``pg_current_wal_insert_lsn()`` just after (at or past the commit's end LSN).

Every Delta commit the applier writes records, as its idempotent txn version, the end LSN of the
last transaction it contains, and its commit timestamp. A transaction is visible from the first
Delta commit whose version reaches its LSN; latency = that commit's timestamp - the COMMIT time.
Transactions of the warm-up are left out. The table is then verified against Postgres.

Memory: the peak RSS (VmHWM) of the mirror's Python process and of its JVM (a JVM's RSS bounds its
heap from above). The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from memory import children, peak_rss_mb, spark_settings  # noqa: E402  (bench/memory.py)


def log(msg: str) -> None:
    print(f"bench/lag: {msg}", file=sys.stderr, flush=True)


def delta_commits(table: Path) -> list[tuple[int, float]]:
    """(txn version = end LSN applied, commit timestamp in seconds) of each Delta commit that has one."""
    out = []
    for f in sorted((table / "_delta_log").glob("*.json")):
        version, stamp = None, None
        for line in f.read_text().splitlines():
            action = json.loads(line)
            if "txn" in action:
                version = action["txn"]["version"]
            if "commitInfo" in action:
                stamp = action["commitInfo"]["timestamp"] / 1000
        if version is not None and stamp is not None:
            out.append((version, stamp))
    return out


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", type=int, default=500, help="transactions per second")
    p.add_argument("--seconds", type=float, default=60, help="measured load duration")
    p.add_argument("--warmup", type=float, default=10, help="load before measuring")
    p.add_argument("--group-seconds", type=float, default=1.0, help="apply.max_group_seconds of the mirror")
    args = p.parse_args()

    import psycopg
    import yaml

    from applier.checks.verify import verify_against_postgres
    from applier.devtools.pgcluster import start_cluster
    from applier.lsn import format_lsn, parse_lsn
    from applier.spark.session import build_spark_session

    with tempfile.TemporaryDirectory(prefix="bench-lag-") as tmp, start_cluster() as cluster, \
            psycopg.connect(cluster.dsn(), autocommit=True) as conn:
        work = Path(tmp)
        conn.execute("CREATE TABLE lag_events (id bigserial PRIMARY KEY, payload text NOT NULL)")
        conn.execute("CREATE PUBLICATION lag_pub FOR TABLE lag_events")
        config = work / "mirror.yaml"
        config.write_text(yaml.safe_dump({
            "source": {"slot": "applier", "publication": "lag_pub"},
            "target": {"path": str(work / "delta")},
            "apply": {"max_group_seconds": args.group_seconds},
        }))
        env = {**os.environ, "APPLIER_DSN": cluster.dsn()}
        mirror = subprocess.Popen([sys.executable, "-m", "applier.cli", "mirror", "--config", str(config)],
                                  env=env, stdout=subprocess.DEVNULL, stderr=open(work / "mirror.log", "w"))
        deadline = time.monotonic() + 180
        while not conn.execute("SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = 'applier' "
                               "AND active)").fetchone()[0]:  # type: ignore[index]
            if mirror.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"bench/lag: mirror did not start:\n{(work / 'mirror.log').read_text()[-3000:]}")
            time.sleep(0.2)
        log("mirror is streaming; load starts")

        conn.execute("SET synchronous_commit = off")
        commits: list[tuple[float, int]] = []  # (COMMIT returned, LSN at or past its end), measured part only
        start = time.monotonic()
        total = int(args.rate * (args.warmup + args.seconds))
        for i in range(total):
            due = start + i / args.rate
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            conn.execute("INSERT INTO lag_events (payload) VALUES ('event')")
            committed = time.time()
            (lsn,) = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()  # type: ignore[misc]
            if i >= args.rate * args.warmup:
                commits.append((committed, parse_lsn(lsn)))
        achieved = total / (time.monotonic() - start)
        conn.execute("SET synchronous_commit = on")
        conn.execute("INSERT INTO lag_events (payload) VALUES ('last')")
        log(f"load done: {total} transactions at {achieved:.0f}/s; waiting for the mirror")

        table = work / "delta" / "public" / "lag_events"
        last = commits[-1][1]
        deadline = time.monotonic() + float(os.environ.get('BENCH_LAG_WAIT', '300'))
        while not any(v >= last for v, _ in delta_commits(table)):
            if time.monotonic() > deadline:
                raise SystemExit(f"bench/lag: the mirror did not reach {format_lsn(last)} within 300 s; Delta "
                                 f"commits (version, time): {delta_commits(table)[-3:]}\n"
                                 f"{(work / 'mirror.log').read_text()[-3000:]}")
            time.sleep(0.5)
        python_rss = peak_rss_mb(mirror.pid)
        jvm_rss = max((peak_rss_mb(c) or 0 for c in children(mirror.pid)), default=None)
        mirror.send_signal(signal.SIGINT)
        mirror.wait(timeout=120)

        applied = sorted(delta_commits(table))
        latencies = []
        for committed, lsn in commits:
            visible = min(stamp for version, stamp in applied if version >= lsn)
            latencies.append(visible - committed)
        spark = build_spark_session(spark_settings())
        equal = all(r.equal for r in verify_against_postgres(spark, conn, str(work / "delta"),
                                                             [("public", "lag_events")]))
        if not equal:
            raise SystemExit("bench/lag: the Delta table differs from Postgres")

    print(json.dumps({
        "rate_target": args.rate, "rate_achieved": round(achieved), "measured_transactions": len(commits),
        "group_seconds": args.group_seconds, "delta_commits": len(applied),
        "p50_s": round(percentile(latencies, 50), 2), "p95_s": round(percentile(latencies, 95), 2),
        "p99_s": round(percentile(latencies, 99), 2), "max_s": round(max(latencies), 2),
        "mean_s": round(statistics.mean(latencies), 2), "verified_equal": True,
        "memory": {"mirror_python_peak_rss_mb": python_rss, "mirror_jvm_peak_rss_mb": jvm_rss},
    }))


if __name__ == "__main__":
    main()
