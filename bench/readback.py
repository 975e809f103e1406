"""Benchmark: catching up the commits that must read the target before they write (updates that leave a
TOAST value unchanged, and changes to a key-less table), as a user runs it, for two checkouts of the code.

    .venv/bin/python bench/readback.py --code OLD_DIR --code NEW_DIR [--scale 1] [--runs 3]

(``--scale`` may be a fraction, for a quick run: 0.01 is 100 ``docs`` and 1,000 ``bag`` rows.)

Why: such a commit takes values from the Delta table (the unchanged TOAST value of the row as
committed, or the number of copies a key-less table holds of a row). Spark alone made them until
delta-rs learnt to (applier.sink.store.rsmerge); this measures what that changes for a mirror whose
tables need it: a fresh ``applier mirror --once`` process, JVM start-up included when it starts one.

Setup (not timed): a throw-away server; ``docs`` (SCALE x 10,000 rows with a 3.2 kB ``body`` stored
out of line, uncompressed) and ``bag`` (SCALE x 100,000 rows, REPLICA IDENTITY FULL, many duplicates),
published. Each run: every ``--code`` copies both tables into a target of its own with a slot of its
own (``mirror --once``); then one workload, seen by every slot: half of ``docs`` updated without
touching ``body`` (pgoutput sends it as unchanged TOAST), and in ``bag`` copies deleted, inserted and
updated. Timed: each checkout's ``mirror --once`` catching up that workload (a fresh process). Each
catch-up is verified against Postgres with delta-rs (every row of both tables, as multisets). The last
line is one JSON object with every time, the medians, and whether a catch-up logged ``starting Spark``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from lazy import mirror_once  # noqa: E402  (bench/lazy.py)

SETUP = """
CREATE TABLE docs (id int PRIMARY KEY, body text, n int);
ALTER TABLE docs ALTER body SET STORAGE EXTERNAL;
INSERT INTO docs SELECT g, (SELECT string_agg(md5(g::text || '-' || i), '') FROM generate_series(1, 100) i), 0
  FROM generate_series(1, {docs}) g;
CREATE TABLE bag (a int, b text);
ALTER TABLE bag REPLICA IDENTITY FULL;
INSERT INTO bag SELECT g % 1000, 'v' || (g % 7) FROM generate_series(1, {bag}) g;
CREATE PUBLICATION bench_pub FOR TABLE docs, bag;
"""

WORKLOAD = """
UPDATE docs SET n = n + 1 WHERE id % 2 = 0;
DELETE FROM bag WHERE ctid IN (SELECT ctid FROM bag WHERE a < 20 LIMIT 2000);
INSERT INTO bag SELECT g % 1000, 'w' FROM generate_series(1, 2000) g;
UPDATE bag SET b = 'u' WHERE a BETWEEN 500 AND 509;
"""


def log(msg: str) -> None:
    print(f"bench/readback: {msg}", file=sys.stderr, flush=True)


def verify(conn: object, target: Path) -> None:
    import deltalake

    from applier.checks.verify import compare, postgres_table_rows

    for table in ("docs", "bag"):
        names, pg_rows = postgres_table_rows(conn, "public", table)  # type: ignore[arg-type]
        arrow = deltalake.DeltaTable(str(target / "public" / table)).to_pyarrow_table()
        result = compare(f"public.{table}", pg_rows, (tuple(r[c] for c in names) for r in arrow.to_pylist()),
                         detail=False)
        if not result.equal:
            raise SystemExit(f"bench/readback: {target} {table} differs from Postgres "
                             f"({result.source_rows} / {result.target_rows})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--code", action="append", required=True, help="a checkout of applier (repeat)")
    p.add_argument("--scale", type=float, default=1, help="x 10,000 docs and x 100,000 bag rows (a fraction for "
                   "a quick run)")
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()

    import psycopg

    from applier.devtools.pgcluster import start_cluster

    times: dict[str, list[float]] = {c: [] for c in args.code}
    spark_started: dict[str, list[bool]] = {c: [] for c in args.code}
    changes = 0
    docs, bag = round(args.scale * 10_000), round(args.scale * 100_000)
    with tempfile.TemporaryDirectory(prefix="bench-readback-") as tmp, start_cluster() as cluster, \
            psycopg.connect(cluster.dsn(), autocommit=True) as conn:
        conn.execute(SETUP.format(docs=docs, bag=bag))
        conn.execute("VACUUM ANALYZE")
        conn.execute("CHECKPOINT")
        n = 0
        for run in range(args.runs):
            mirrors = []
            for code in args.code:
                n += 1
                target, slot = Path(tmp) / f"delta-{n}", f"bench_readback_{n}"
                mirror_once(code, cluster.dsn(), target, slot)  # the copy, not timed
                mirrors.append((code, target, slot))
            before = conn.execute("SELECT pg_current_wal_lsn()").fetchone()
            conn.execute(WORKLOAD)
            counted = conn.execute("SELECT count(*) FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, "
                                   "'proto_version', '1', 'publication_names', 'bench_pub')",
                                   (mirrors[0][2],)).fetchone()
            changes = int(counted[0]) if counted else 0
            for i, (code, target, slot) in enumerate(mirrors):
                seconds, err = mirror_once(code, cluster.dsn(), target, slot)
                times[code].append(seconds)
                spark_started[code].append("starting Spark" in err)
                verify(conn, target)
                log(f"run {run + 1}, code {i + 1}: catch-up {seconds:.1f} s (from {before[0] if before else '?'})")
                conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    print(json.dumps({
        "docs": docs, "bag": bag, "messages_per_catch_up": changes,
        "cores": os.cpu_count(),
        "codes": {c: {"catch_up": [round(t, 1) for t in v], "catch_up_median": round(statistics.median(v), 1),
                      "starting_spark_logged": spark_started[c]} for c, v in times.items()},
        "verified_equal": True,
    }))


if __name__ == "__main__":
    main()
