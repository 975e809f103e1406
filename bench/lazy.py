"""Benchmark: the whole ``applier mirror --once`` command as a user runs it (a fresh process: imports,
Spark start-up if any, the copy), for two checkouts of the code, and ``--once`` on the mirror it left
(up to date: nothing to apply).

    .venv/bin/python bench/lazy.py --code OLD_DIR --code NEW_DIR [--scale 10] [--runs 3]

(``--scale`` may be a fraction, for a quick run: 0.01 is 1,000 rows.)

Setup (not timed): a throw-away server, one table of SCALE x 100,000 rows of the common types
(``bench/snapshot.py --typed``'s), published. Then, ``--runs`` times, each ``--code`` in turn (so they
share the machine's load alike): ``python -m applier.cli mirror --once`` with that checkout on the
``PYTHONPATH`` into a fresh target with a fresh slot, then the same command again (up to date). The
first copy of each checkout is verified against Postgres with delta-rs (count and checksum per row).
The last line is one JSON object with every time and the medians.
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
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from snapshot import TYPED_DDL, TYPED_ROWS  # noqa: E402  (bench/snapshot.py)


def log(msg: str) -> None:
    print(f"bench/lazy: {msg}", file=sys.stderr, flush=True)


def mirror_once(code: str, dsn: str, target: Path, slot: str) -> tuple[float, str]:
    env = dict(os.environ, PYTHONPATH=code, APPLIER_DSN=dsn)
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "applier.cli", "mirror", "--once", "--publication", "bench_pub",
                          "--slot", slot, "--target", str(target)], env=env, cwd=code, capture_output=True,
                         text=True)  # cwd: ``-m`` puts it first on sys.path
    seconds = time.monotonic() - started
    if out.returncode != 0:
        raise SystemExit(f"bench/lazy: mirror failed ({code}):\n{out.stderr[-3000:]}")
    return seconds, out.stderr


def verify(conn: object, target: Path) -> None:
    import deltalake

    from applier.checks.verify import compare, postgres_table_rows

    names, pg_rows = postgres_table_rows(conn, "public", "typed")  # type: ignore[arg-type]
    table = deltalake.DeltaTable(str(target / "public" / "typed")).to_pyarrow_table()
    rows = (tuple(r[c] for c in names) for r in table.to_pylist())
    result = compare("public.typed", pg_rows, rows, detail=False)
    if not result.equal:
        raise SystemExit(f"bench/lazy: {target} differs from Postgres ({result.source_rows} / {result.target_rows})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--code", action="append", required=True, help="a checkout of applier (repeat)")
    p.add_argument("--scale", type=float, default=10, help="x 100,000 rows (a fraction for a quick run)")
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()

    import psycopg

    from applier.devtools.pgcluster import start_cluster

    rows = round(args.scale * 100_000)
    times: dict[str, dict[str, list[float]]] = {c: {"copy": [], "up_to_date": []} for c in args.code}
    spark_started: dict[str, list[bool]] = {c: [] for c in args.code}
    with tempfile.TemporaryDirectory(prefix="bench-lazy-") as tmp, start_cluster() as cluster, \
            psycopg.connect(cluster.dsn(), autocommit=True) as conn:
        conn.execute(TYPED_DDL)
        conn.execute(TYPED_ROWS.replace("{rows}", str(rows)))
        conn.execute("VACUUM ANALYZE typed")
        conn.execute("CREATE PUBLICATION bench_pub FOR TABLE typed")
        conn.execute("CHECKPOINT")
        n = 0
        for run in range(args.runs):
            for i, code in enumerate(args.code):
                n += 1
                target, slot = Path(tmp) / f"delta-{n}", f"bench_lazy_{n}"
                copy, err = mirror_once(code, cluster.dsn(), target, slot)
                again, err2 = mirror_once(code, cluster.dsn(), target, slot)
                times[code]["copy"].append(copy)
                times[code]["up_to_date"].append(again)
                spark_started[code].append("starting Spark" in err + err2)
                log(f"run {run + 1}, code {i + 1}: copy {copy:.1f} s, up to date {again:.1f} s")
                if run == 0:
                    verify(conn, target)
                conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    print(json.dumps({
        "rows": rows, "cores": os.cpu_count(),
        "codes": {c: {"copy": [round(t, 1) for t in v["copy"]], "up_to_date": [round(t, 1) for t in v["up_to_date"]],
                      "copy_median": round(statistics.median(v["copy"]), 1),
                      "up_to_date_median": round(statistics.median(v["up_to_date"]), 1),
                      "starting_spark_logged": spark_started[c]}
                  for c, v in times.items()},
        "verified_equal": True,
    }))


if __name__ == "__main__":
    main()
