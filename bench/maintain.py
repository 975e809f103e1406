"""Benchmark: what `applier maintain` does for readers after a catch-up that left many small files.

    .venv/bin/python bench/maintain.py [--transactions 10000] [--rows-per-transaction 100] [--group-transactions 20]

Setup (not timed): a server started by the script, an append-mostly table (each transaction inserts 90
rows and corrects 10 of them: 1M changes by default), applied by
``applier mirror --once`` in groups of ``--group-transactions`` (small groups, as a mirror following a
live stream makes them: one commit and a few files each).

Measured on the mirrored table, before and after ``applier maintain`` (compaction, VACUUM at the
default 7-day retention, a checkpoint): its data files, their size, the Delta log's commit files, the
time to open the table (read its log) and a full scan with delta-rs (``to_pyarrow_table``), median of
5; and how long maintain took. The table is compared with Postgres (ids and the sum of ``v``) after
maintenance. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from catchup import child, mirror_config, setup_mirror  # noqa: E402  (bench/catchup.py)

#: An append-mostly table, as most large ones are (events, orders): each transaction inserts 90 rows and
#: corrects 10 of them. A group adds a file and rewrites none. (Changes to rows of earlier groups make
#: delta-rs rewrite the files holding them, merged with the group's new rows: few, large files.)
SCHEMA = """
CREATE TABLE cu_items (id bigint PRIMARY KEY, v int NOT NULL, note text);
CREATE PUBLICATION cu_pub FOR TABLE cu_items;
CREATE PROCEDURE mt_run(n int, per int) LANGUAGE plpgsql AS $$
DECLARE base bigint := 0; ins int := per * 9 / 10; upd int := per - per * 9 / 10;
BEGIN
  FOR i IN 1..n LOOP
    INSERT INTO cu_items SELECT base + g, g, 'event ' || (base + g) FROM generate_series(1, ins) g;
    UPDATE cu_items SET v = -v, note = note || ' corrected' WHERE id > base AND id <= base + upd;
    base := base + ins;
    COMMIT;
  END LOOP;
END $$;
"""


def log(msg: str) -> None:
    print(f"bench/maintain: {msg}", file=sys.stderr, flush=True)


def measure(table_path: Path) -> dict[str, float | int]:
    from deltalake import DeltaTable

    opens, scans = [], []
    rows = 0
    for _ in range(5):
        started = time.perf_counter()
        table = DeltaTable(str(table_path))
        opened = time.perf_counter()
        rows = table.to_pyarrow_table().num_rows
        opens.append(opened - started)
        scans.append(time.perf_counter() - opened)
    files = table.get_add_actions(flatten=True)
    sizes = [int(s) for s in files.column("size_bytes").to_pylist()]
    return {"data_files": len(sizes), "data_mb": round(sum(sizes) / 2**20, 1), "rows": rows,
            "log_json_files": len(list((table_path / "_delta_log").glob("*.json"))),
            "open_seconds": round(statistics.median(opens), 3), "scan_seconds": round(statistics.median(scans), 3)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--transactions", type=int, default=10_000)
    p.add_argument("--rows-per-transaction", type=int, default=100)
    p.add_argument("--group-transactions", type=int, default=20)
    args = p.parse_args()

    import psycopg

    from applier.devtools.pgcluster import start_cluster

    with tempfile.TemporaryDirectory(prefix="bench-maintain-") as tmp, start_cluster() as cluster, \
            psycopg.connect(cluster.dsn(), autocommit=True) as conn:
        work = Path(tmp)
        conn.execute(SCHEMA)
        config = mirror_config(work, str(work / "delta"), group_transactions=args.group_transactions, overlap=False,
                               distributed="off")
        setup_mirror(config, cluster.dsn())  # the slot and the snapshot of the empty table
        conn.execute("SET synchronous_commit = off")
        conn.execute("CALL mt_run(%s, %s)", (args.transactions, args.rows_per_transaction))
        started = time.monotonic()
        ours = child(config, cluster.dsn())
        log(f"catch-up in groups of {args.group_transactions} transactions: {time.monotonic() - started:.1f} s")
        table = work / "delta" / "public" / "cu_items"
        before = measure(table)
        log(f"before maintain: {json.dumps(before)}")
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "applier.cli", "maintain", "--target", str(work / "delta"),
                               "--json"], capture_output=True, text=True)
        maintain_seconds = time.monotonic() - started
        if done.returncode != 0:
            raise SystemExit(f"bench/maintain: maintain failed:\n{done.stderr[-3000:]}")
        log(f"maintain: {maintain_seconds:.1f} s: {done.stdout.strip()}")
        after = measure(table)
        log(f"after maintain: {json.dumps(after)}")

        from deltalake import DeltaTable

        delta = DeltaTable(str(table)).to_pyarrow_table(columns=["id", "v"])
        ids, v_sum = sorted(delta.column("id").to_pylist()), sum(delta.column("v").to_pylist())
        pg_ids = [r[0] for r in conn.execute("SELECT id FROM cu_items ORDER BY id")]
        (pg_sum,) = conn.execute("SELECT sum(v) FROM cu_items").fetchone()  # type: ignore[misc]
        if ids != pg_ids or v_sum != pg_sum:
            raise SystemExit("bench/maintain: the maintained table differs from Postgres")

    print(json.dumps({
        "changes_transactions": args.transactions, "rows_per_transaction": args.rows_per_transaction,
        "group_transactions": args.group_transactions, "delta_commits": ours["delta_commits"],
        "before": before, "after": after, "maintain_seconds": round(maintain_seconds, 1),
        "scan_speedup": round(float(before["scan_seconds"]) / max(float(after["scan_seconds"]), 1e-9), 1),
        "equal_to_postgres": True,
    }))


if __name__ == "__main__":
    main()
