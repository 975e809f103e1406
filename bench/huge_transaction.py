"""Benchmark: peak memory and time of one huge transaction (issue 47: a 3M-row UPDATE took 3.1 GB).

    .venv/bin/python bench/huge_transaction.py [--rows 3000000] [--runs 3] [--distributed off|auto]

A server started by the script; a table ``h(id int PRIMARY KEY, v int, pad text)`` of ``--rows`` rows
(``pad`` 60 characters) is copied by ``applier mirror --once``; then, each run, one transaction
``UPDATE h SET v = v + 1, pad = pad || 'x'`` changes every row, and ``applier mirror --once`` (a fresh
process, ``apply.memory_budget_mb`` at its default of 256 MB, distributed catch-up ``--distributed``)
applies it. Measured per run: wall time of that process, its peak RSS (``wait4``'s ru_maxrss of the
Python process; with ``--distributed auto`` a JVM starts as its child and is counted apart), and the
log lines it printed meanwhile (the longest silence). The table is verified against Postgres after the
last run. The last line is one JSON object, with the median of the runs.
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from memory import spark_settings  # noqa: E402  (bench/memory.py)


def log(msg: str) -> None:
    print(f"bench/huge_transaction: {msg}", file=sys.stderr, flush=True)


def run_measured(cmd: list[str], env: dict[str, str], log_path: Path) -> dict[str, float]:
    """Run ``cmd``; its seconds, peak RSS (MB, the process itself) and longest gap between its log lines."""
    started = time.monotonic()
    stamps: list[float] = []
    with open(log_path, "w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            stamps.append(time.monotonic())
            out.write(line)
        _pid, status, usage = os.wait4(proc.pid, 0)
    seconds = time.monotonic() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"bench/huge_transaction: mirror failed:\n{log_path.read_text()[-3000:]}")
    gaps = [b - a for a, b in zip([started, *stamps], [*stamps, started + seconds], strict=True)]
    return {"seconds": round(seconds, 1), "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
            "longest_silence_s": round(max(gaps), 1), "log_lines": len(stamps)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=3_000_000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--distributed", choices=("off", "auto"), default="off",
                   help="distributed.mode of the mirror (off: the driver path, no JVM)")
    args = p.parse_args()

    import psycopg
    import yaml

    from applier.checks.verify import verify_against_postgres
    from applier.devtools.pgcluster import start_cluster

    with tempfile.TemporaryDirectory(prefix="bench-huge-") as tmp, start_cluster() as cluster, \
            psycopg.connect(cluster.dsn(), autocommit=True) as conn:
        work = Path(tmp)
        conn.execute("CREATE TABLE h (id int PRIMARY KEY, v int, pad text)")
        conn.execute(f"INSERT INTO h SELECT g, g, repeat('p', 60) FROM generate_series(1, {args.rows}) g")
        conn.execute("CREATE PUBLICATION huge_pub FOR TABLE h")
        config = work / "mirror.yaml"
        config.write_text(yaml.safe_dump({
            "source": {"slot": "huge", "publication": "huge_pub"},
            "target": {"path": str(work / "delta")},
            "distributed": {"mode": args.distributed},
        }))
        env = {**os.environ, "APPLIER_DSN": cluster.dsn()}
        cmd = [sys.executable, "-m", "applier.cli", "mirror", "--config", str(config), "--once"]
        log(f"copying {args.rows:,} rows")
        run_measured(cmd, env, work / "copy.log")
        runs = []
        for i in range(args.runs):
            started = time.monotonic()
            conn.execute("UPDATE h SET v = v + 1, pad = pad || 'x'")
            log(f"run {i + 1}: UPDATE of {args.rows:,} rows in {time.monotonic() - started:.0f}s; applying it")
            result = run_measured(cmd, env, work / f"run{i}.log")
            log(f"run {i + 1}: {result}")
            runs.append(result)
        from applier.spark.session import build_spark_session

        spark = build_spark_session(spark_settings())
        equal = all(r.equal for r in verify_against_postgres(spark, conn, str(work / "delta"), [("public", "h")]))
        if not equal:
            raise SystemExit("bench/huge_transaction: the Delta table differs from Postgres")

    print(json.dumps({
        "rows": args.rows, "distributed": args.distributed, "runs": runs,
        "median_seconds": statistics.median(r["seconds"] for r in runs),
        "median_peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in runs),
        "median_longest_silence_s": statistics.median(r["longest_silence_s"] for r in runs),
        "bytes_per_row": round(statistics.median(r["peak_rss_mb"] for r in runs) * 2**20 / args.rows),
        "verified_equal": True,
    }))


if __name__ == "__main__":
    main()
