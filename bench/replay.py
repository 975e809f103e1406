"""Benchmark: replay of a large stored raw log, on the driver vs on Spark's executors (issue 22).

    .venv/bin/python bench/replay.py [--transactions 50000] [--rows-per-transaction 100] [--runs 3] [--cluster]
                                     [--smoke]

Setup (not timed): a server started by the script; bench/catchup.py's table and workload (each
transaction inserts 50 rows, updates 40 and deletes 10); the slot peeked with protocol 1 and
stored as a Parquet raw log (50,000 transactions: ~5.1 million messages).

Timed, one run after the other so that they do not share the 2 cores, ``--runs`` rounds of:
- ``applier replay`` on executors (``distributed.mode: on``) with Spark ``local[1]``, the process
  (driver, JVM, Python workers) pinned to one CPU: the same program with one core;
- the same with ``local[1]`` unpinned: one executor task at a time, but the driver's own work (the
  survey, combining, commits) runs beside it on the second CPU;
- the same with ``local[2]``;
- the driver path (``distributed.mode: off``) with ``local[2]``, what a replay did before;
- with ``--cluster``, also on executors of a standalone Spark cluster the script starts (a Master and
  one Worker with 2 cores from pyspark's distribution, applier.devtools.sparkcluster), the driver a
  client of it, as ``spark-submit --master spark://...`` would run it. On this machine the cluster
  shares the same two CPUs, so it shows the cost of a real cluster's scheduling and shipping, not
  more capacity.
``--smoke`` (the test suite's quick run, tests/scenario/test_bench_smoke.py) runs only ``local[2]``
on executors and on the driver path: both code paths, without the other modes' JVMs to start.
Each run is a fresh process replaying into an empty target with its Spark session already started
(the start-up is reported apart), and is verified against Postgres row by row afterwards (not
timed). The last line is one JSON object with every run and the medians.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from catchup import SCHEMA  # noqa: E402  (bench/catchup.py: the same table and workload)
from memory import jvm_peak_heap_mb, python_peak_rss_mb, spark_settings  # noqa: E402  (bench/memory.py)

from applier.devtools.sparkcluster import StandaloneCluster  # noqa: E402

#: (Spark master, distributed.mode, CPUs the whole process may use: None = both)
MODES = (("local[1]", "on", 1), ("local[1]", "on", None), ("local[2]", "on", None), ("local[2]", "off", None))
#: ``--smoke``: the two code paths (executors, driver) once each; the other modes run the same code on
#: fewer CPUs, and each mode is a JVM of its own to start
SMOKE_MODES = MODES[2:]


def name(master: str, mode: str, cpus: int | None) -> str:
    return f"{master} distributed-{mode}" + (f" pinned-to-{cpus}-cpu" if cpus else "")


def log(msg: str) -> None:
    print(f"bench/replay: {msg}", file=sys.stderr, flush=True)


#: The cluster run's mode (``--cluster``): its master is the URL of the cluster the script started.
CLUSTER = ("cluster", "on", None)


def run_child(args: argparse.Namespace) -> None:
    """(child process) one replay with the session already up, then its verification."""
    import psycopg

    from applier.checks.verify import verify_against_postgres
    from applier.config import ReplayConfig
    from applier.drivers.replay import replay_log
    from applier.spark.session import build_spark_session

    if args.cpus:
        os.sched_setaffinity(0, set(range(int(args.cpus))))  # the JVM and the Python workers inherit it
    started = time.monotonic()
    extra = {"spark.cores.max": "2", "spark.executor.memory": "2g"} if args.master.startswith("spark://") else {}
    spark = build_spark_session(spark_settings(master=args.master, extra=extra))
    startup = time.monotonic() - started
    config = ReplayConfig.model_validate({
        "source_log": args.log, "target": {"path": args.target},
        "distributed": {"mode": args.mode},
    })
    started = time.monotonic()
    summary = replay_log(spark, config)
    seconds = time.monotonic() - started
    with psycopg.connect(args.dsn) as conn:
        results = verify_against_postgres(spark, conn, args.target, [("public", "cu_items")])
    print(json.dumps({"seconds": seconds, "spark_startup_seconds": startup, "ranges": summary.ranges,
                      "transactions": summary.transactions, "equal": all(r.equal for r in results),
                      "python_peak_rss_mb": python_peak_rss_mb(), "jvm_peak_heap_mb": jvm_peak_heap_mb(spark)}))


def child(raw: Path, target: Path, dsn: str, master: str, mode: str, cpus: int | None,
          env: dict[str, str] | None = None) -> dict[str, object]:
    out = subprocess.run([sys.executable, __file__, "--child", "--log", str(raw), "--target", str(target),
                          "--dsn", dsn, "--master", master, "--mode", mode, "--cpus", str(cpus or "")],
                         capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise SystemExit(f"bench/replay: replay failed:\n{out.stderr[-3000:]}")
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    if not result["equal"]:
        raise SystemExit(f"bench/replay: {master} {mode}: the Delta table differs from Postgres")
    return result


@contextlib.contextmanager
def spark_cluster(work: Path, wanted: bool) -> Iterator[StandaloneCluster | None]:
    if not wanted:
        yield None
        return
    (work / "spark-cluster").mkdir()
    running = StandaloneCluster(work / "spark-cluster", memory="6g")
    running.start()
    log(f"standalone Spark cluster up at {running.url}")
    try:
        yield running
    finally:
        running.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--transactions", type=int, default=50_000)
    p.add_argument("--rows-per-transaction", type=int, default=100)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--smoke", action="store_true",
                   help="only local[2] on executors and on the driver path (the test suite's quick run; the "
                   "ratios to the local[1] modes are left out)")
    p.add_argument("--cluster", action="store_true",
                   help="also replay on the executors of a standalone Spark cluster started by the script")
    for hidden in ("--log", "--target", "--dsn", "--master", "--mode", "--cpus"):
        p.add_argument(hidden, help=argparse.SUPPRESS)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        run_child(args)
        return

    import psycopg

    from applier.devtools.pgcluster import start_cluster
    from applier.sources.rawlog_writer import write_raw_log
    from applier.sources.sql_slot import create_slot, peek, pgoutput_options

    with tempfile.TemporaryDirectory(prefix="bench-replay-") as tmp, start_cluster() as cluster, \
            psycopg.connect(cluster.dsn(), autocommit=True) as conn, spark_cluster(Path(tmp), args.cluster) as spark:
        work = Path(tmp)
        modes = (SMOKE_MODES if args.smoke else MODES) + ((CLUSTER,) if spark is not None else ())
        conn.execute(SCHEMA)
        create_slot(conn, "bench")
        started = time.monotonic()
        conn.execute("SET synchronous_commit = off")
        conn.execute("CALL cu_run(%s, %s)", (args.transactions, args.rows_per_transaction))
        conn.execute("SET synchronous_commit = on")
        conn.execute("INSERT INTO cu_items VALUES (-1, 0, 'marker')")  # flushed: the peek sees everything before
        log(f"workload written in {time.monotonic() - started:.1f} s")
        started = time.monotonic()
        raw = work / "raw.parquet"
        messages = write_raw_log(raw, ((m.lsn, m.xid, m.data) for m in peek(conn, "bench", pgoutput_options("cu_pub"))))
        log(f"raw log: {messages} messages, {raw.stat().st_size >> 20} MB, "
            f"captured in {time.monotonic() - started:.1f} s")
        runs: dict[str, list[dict[str, object]]] = {name(*m): [] for m in modes}
        for n in range(args.runs):
            for master, mode, cpus in modes:
                target = work / f"delta-{n}-{master.replace('[', '').replace(']', '')}-{mode}-{cpus or 2}"
                if master == CLUSTER[0] and spark is not None:
                    result = child(raw, target, cluster.dsn(), spark.url, mode, cpus, spark.env)
                else:
                    result = child(raw, target, cluster.dsn(), master, mode, cpus)
                runs[name(master, mode, cpus)].append(result)
                log(f"run {n + 1}, {name(master, mode, cpus)}: {float(result['seconds']):.1f} s "  # type: ignore[arg-type]
                    f"({result['ranges']} ranges on executors), verified equal")
                shutil.rmtree(target)

    medians = {k: statistics.median(float(r["seconds"]) for r in v) for k, v in runs.items()}  # type: ignore[arg-type]
    two, driver = (medians[name(*m)] for m in SMOKE_MODES)
    by_cpus: dict[str, float] = {}
    if not args.smoke:
        one_cpu, one = (medians[name(*m)] for m in MODES[:2])
        by_cpus = {"speedup_two_cpus_vs_one_cpu": round(one_cpu / two, 2),
                   "speedup_local2_vs_local1": round(one / two, 2)}
        if args.cluster:
            by_cpus["speedup_cluster_vs_one_cpu"] = round(one_cpu / medians[name(*CLUSTER)], 2)
    print(json.dumps({
        "messages": messages, "transactions": args.transactions,
        "median_seconds": {k: round(v, 1) for k, v in medians.items()},
        **by_cpus,
        "speedup_executors_vs_driver_path": round(driver / two, 2),
        "messages_per_s_local2": round(messages / two),
        "verified_equal": all(r["equal"] for rs in runs.values() for r in rs),  # child() stops the run if not
        "runs": runs,
    }))


if __name__ == "__main__":
    main()
