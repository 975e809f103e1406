"""Capture a realistic raw log for bench/decode.py from a real PostgreSQL server.

Realistic means what a busy OLTP slot mostly carries: many small transactions, each one insert or
one update of a narrow row. A throw-away cluster (applier.devtools.pgcluster) runs ``--transactions`` of
them (half inserts, then half updates, each its own transaction, driven server-side by a DO block
with COMMIT so that the client is not the bottleneck), the slot is peeked with protocol 1 text
(the pinned session of applier.sources.sql_slot) and the rows are written as a Parquet raw log. The
last line printed is one JSON object (the transactions, the messages written, the file)::

    .venv/bin/python bench/make_decode_log.py bench/decode_log.parquet --transactions 50000
    .venv/bin/python bench/decode.py bench/decode_log.parquet

``--shape wide`` captures wide rows with TOAST values instead (issue 49, item 3): a table of 42
columns (ints, short texts, numerics, timestamps, booleans, a jsonb, NULLs, and two text columns of
about 3 kB (``--toast-kb``) that PostgreSQL stores out of line). Half the transactions insert a row (pgoutput sends
the TOAST values in full); the other half update its short columns, so that the TOAST values go
unchanged ('u' in the new image), and every tenth of those also rewrites one TOAST value::

    .venv/bin/python bench/make_decode_log.py /tmp/wide_log.parquet --shape wide --transactions 20000

``--shape typed`` captures narrow rows of common types in a realistic mix of transactions (issue 74,
item 5): a table of a bigint key, an int, a text (NULL in one row of seven), a timestamptz, a
numeric(12,2) and a bool. Of every ten transactions, three insert one row, two insert 2 to 5 rows in
one statement, two update one row, one updates three rows, one deletes one or two of the oldest rows,
and one inserts a row, updates another and deletes a third (a little order workflow)::

    .venv/bin/python bench/make_decode_log.py /tmp/typed_log.parquet --shape typed
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

#: 42 columns: id, 8 x (int, short text, numeric, timestamptz, bool), a jsonb, and two TOAST texts.
WIDE_COLUMNS = ", ".join(
    ["id int PRIMARY KEY"]
    + [f"i{k} int, s{k} text, n{k} numeric(12,2), t{k} timestamptz, b{k} bool" for k in range(8)]
    + ["doc jsonb", "big1 text", "big2 text"])

#: 32 hex characters per ``g``: ``--toast-kb 3`` gives about 3 kB per big value, which compresses to
#: under half, so the row still goes out of line.
_BIG = "(SELECT string_agg(md5(i::text || '{tag}' || g::text), '') FROM generate_series(1, {{pieces}}) g)"

WIDE_WORKLOAD = """
DO $$
BEGIN
  FOR i IN 1..{inserts} LOOP
    INSERT INTO wide VALUES (i, {values}, jsonb_build_object('k', i, 'tags', jsonb_build_array('a', 'b', i % 13)),
      """ + _BIG.format(tag="x") + """, """ + _BIG.format(tag="y") + """);
    COMMIT;
  END LOOP;
  FOR i IN 1..{updates} LOOP
    IF i % 10 = 0 THEN
      UPDATE wide SET i0 = i0 + 1, s1 = 'rewritten', big2 = """ + _BIG.format(tag="z") + """
      WHERE id = (i * 7919) % {inserts} + 1;
    ELSE
      UPDATE wide SET i0 = i0 + 1, s1 = 'touched ' || i, t2 = now(), b3 = NOT b3
      WHERE id = (i * 7919) % {inserts} + 1;
    END IF;
    COMMIT;
  END LOOP;
END $$
"""

#: Each block's values for one row: some NULL (every third short text of every fifth row).
WIDE_VALUES = ", ".join(
    f"i * {k + 3}, CASE WHEN i % 5 = 0 AND {k} % 3 = 0 THEN NULL ELSE 'value ' || {k} || ' of ' || i END, "
    f"(i % 100000) / 7.0 + {k}, now() - make_interval(secs => i + {k}), (i + {k}) % 2 = 0"
    for k in range(8))


TYPED_COLUMNS = ("id bigint PRIMARY KEY, account int NOT NULL, note text, created timestamptz NOT NULL, "
                 "amount numeric(12,2), paid bool NOT NULL")


def _typed_row(k: str) -> str:
    """The values of the row with key ``k`` (a plpgsql expression): one in seven has a NULL text."""
    return (f"{k}, ({k} * 31) % 5000, CASE WHEN {k} % 7 = 0 THEN NULL ELSE 'order ' || {k} || ' for customer ' "
            f"|| ({k} % 977) END, clock_timestamp(), (({k} * 7919) % 1000000) / 100.0, {k} % 3 = 0")


#: Keys ``lo`` .. ``next_id - 1`` exist; deletes take the oldest, updates pick one of the rest.
TYPED_WORKLOAD = """
DO $$
DECLARE
  next_id bigint := 1;
  lo bigint := 1;
  target bigint;
BEGIN
  FOR i IN 1..{transactions} LOOP
    target := lo + (i * 7919) % GREATEST(next_id - lo, 1);
    CASE
      WHEN i % 10 IN (0, 1, 2) OR next_id - lo < 8 THEN
        INSERT INTO typed VALUES (""" + _typed_row("next_id") + """);
        next_id := next_id + 1;
      WHEN i % 10 IN (3, 4) THEN
        INSERT INTO typed SELECT """ + _typed_row("g") + """
        FROM generate_series(next_id, next_id + i % 4 + 1) g;
        next_id := next_id + i % 4 + 2;
      WHEN i % 10 IN (5, 6) THEN
        UPDATE typed SET amount = amount + 1.25, created = clock_timestamp(), paid = NOT paid WHERE id = target;
      WHEN i % 10 = 7 THEN
        UPDATE typed SET note = 'changed ' || i, created = clock_timestamp()
        WHERE id IN (target, lo + (target * 13) % (next_id - lo), lo + (target * 17) % (next_id - lo));
      WHEN i % 10 = 8 THEN
        DELETE FROM typed WHERE id BETWEEN lo AND lo + (i / 10) % 2;
        lo := lo + (i / 10) % 2 + 1;
      ELSE
        INSERT INTO typed VALUES (""" + _typed_row("next_id") + """);
        next_id := next_id + 1;
        UPDATE typed SET paid = true, amount = amount * 2 WHERE id = target;
        DELETE FROM typed WHERE id = lo;
        lo := lo + 1;
    END CASE;
    COMMIT;
  END LOOP;
END $$
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--transactions", type=int, default=50_000)
    parser.add_argument("--major", type=int, default=15)
    parser.add_argument("--shape", choices=["narrow", "typed", "wide"], default="narrow",
                        help="narrow (default): a 6-column row, one insert or update per transaction; typed: "
                             "6 columns of common types, a mix of multi-row transactions; wide: 42 columns "
                             "with two TOAST values")
    parser.add_argument("--toast-kb", type=int, default=3, help="size of each TOAST value in --shape wide (kB)")
    args = parser.parse_args(argv)
    inserts = args.transactions // 2
    cluster = start_cluster(args.major)
    try:
        with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
            if args.shape == "wide":
                conn.execute(f"CREATE TABLE wide ({WIDE_COLUMNS})")
                conn.execute("CREATE PUBLICATION bench FOR TABLE wide")
            elif args.shape == "typed":
                conn.execute(f"CREATE TABLE typed ({TYPED_COLUMNS})")
                conn.execute("CREATE PUBLICATION bench FOR TABLE typed")
            else:
                conn.execute("CREATE TABLE orders (id int PRIMARY KEY, customer text NOT NULL, status text, "
                             "qty int, price numeric(10,2), updated timestamptz)")
                conn.execute("CREATE PUBLICATION bench FOR TABLE orders")
            conn.execute("SELECT pg_create_logical_replication_slot('bench', 'pgoutput')")
            t0 = time.perf_counter()
            if args.shape == "wide":
                conn.execute(WIDE_WORKLOAD.format(inserts=inserts, updates=args.transactions - inserts,
                                                  values=WIDE_VALUES, pieces=max(1, args.toast_kb * 32)))
                conn.execute("INSERT INTO wide (id) VALUES (-1)")
            elif args.shape == "typed":
                conn.execute(TYPED_WORKLOAD.format(transactions=args.transactions))
                conn.execute("INSERT INTO typed (id, account, created, paid) VALUES (-1, 0, now(), false)")
            else:
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
