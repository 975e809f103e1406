"""Capture a realistic raw log for bench/decode.py from a real PostgreSQL server.

Realistic means what a busy OLTP slot mostly carries: many small transactions, each one insert or
one update of a narrow row. A throw-away cluster (applier.devtools.pgcluster) runs ``--transactions`` of
them (half inserts, then half updates, each its own transaction, driven server-side by a DO block
with COMMIT so that the client is not the bottleneck), the slot is peeked with protocol 1 text
(the pinned session of applier.sources.sql_slot) and the rows are written as a Parquet raw log. The
last line printed is one JSON object (the transactions, the messages written, the file)::

    .venv/bin/python bench/make_decode_log.py bench/decode_log.parquet --transactions 50000
    .venv/bin/python bench/decode.py bench/decode_log.parquet
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ["APPLIER_CACHE_DIR"] = str(Path(os.environ.get("APPLIER_CACHE_DIR", REPO / ".cache")).resolve())

import psycopg  # noqa: E402

from applier.devtools.pgcluster import start_cluster  # noqa: E402
from applier.sources.rawlog_writer import write_raw_log  # noqa: E402
from applier.sources.sql_slot import peek, pgoutput_options  # noqa: E402

WORKLOAD = """
DO $$
BEGIN
  FOR i IN 1..{inserts} LOOP
    INSERT INTO orders (id, customer, status, qty, price, updated)
    VALUES (i, 'customer ' || (i % 977), 'new', i % 7 + 1, (i % 1000) / 10.0, now());
    COMMIT;
  END LOOP;
  FOR i IN 1..{updates} LOOP
    UPDATE orders SET status = 'shipped', qty = qty + 1, updated = now() WHERE id = (i * 7919) % {inserts} + 1;
    COMMIT;
  END LOOP;
END $$
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--transactions", type=int, default=50_000)
    parser.add_argument("--major", type=int, default=15)
    args = parser.parse_args(argv)
    inserts = args.transactions // 2
    cluster = start_cluster(args.major)
    try:
        with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
            conn.execute("CREATE TABLE orders (id int PRIMARY KEY, customer text NOT NULL, status text, "
                         "qty int, price numeric(10,2), updated timestamptz)")
            conn.execute("CREATE PUBLICATION bench FOR TABLE orders")
            conn.execute("SELECT pg_create_logical_replication_slot('bench', 'pgoutput')")
            t0 = time.perf_counter()
            conn.execute(WORKLOAD.format(inserts=inserts, updates=args.transactions - inserts))
            conn.execute("INSERT INTO orders (id, customer) VALUES (-1, 'flush')")
            print(f"workload: {args.transactions} transactions in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
            t0 = time.perf_counter()
            rows = ((m.lsn, m.xid, m.data) for m in peek(conn, "bench", pgoutput_options("bench")))
            count = write_raw_log(args.out, rows)
            print(f"peeked {count} messages in {time.perf_counter() - t0:.1f}s -> {args.out}", file=sys.stderr)
    finally:
        cluster.stop()
    print(json.dumps({"transactions": args.transactions, "messages": count, "out": str(args.out)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
