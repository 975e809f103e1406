"""Benchmark: applying a pgbench-like history to Delta, grouped vs one MERGE per transaction vs append.

    .venv/bin/python bench/apply.py [--transactions 100000] [--accounts 100000] [--sample 30]
                                    [--group-transactions N] [--runs 1]

A PostgreSQL server (started by the script) runs the history: one transaction loads 3 tables
(``pgb_branches`` 1 row, ``pgb_tellers`` 10, ``pgb_accounts`` N), then ``--transactions`` small
transactions each update one account, one teller and the branch (pgbench's TPC-B shape without its
history table: updates dominate). A slot captures it all to a raw log, which is then applied:

(a) grouped: ``replay_log`` with ``apply.grouping: grouped``, the default limits, and
    ``--group-transactions`` per Delta commit (default: ``apply.max_group_transactions``'s
    default); the result is verified against Postgres row by row (outside the timing);
(b) per transaction: the load is applied first (not timed), then ``--sample`` transactions with
    ``grouping: transaction`` (3 MERGEs each); the time per transaction, net of re-reading the
    prefix, is EXTRAPOLATED to the whole history and labelled so;
(c) append: the final rows of the 3 tables (read from Postgres, converted by the same values
    layer) written once as a plain Delta append: the floor cost of writing the result.

Each mode runs in a fresh process (its own Spark), which reports the time, its peak RSS and the
JVM's peak heap (sum of the heap pools' peaks). Ratios: ``grouped_vs_per_transaction`` = the
extrapolated per-transaction time / the grouped time (target >= 100); ``grouped_vs_append`` =
the append time / the grouped time (1.0 would be as fast as writing the final rows; target >= 0.3).
The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from memory import jvm_peak_heap_mb, python_peak_rss_mb, spark_settings  # noqa: E402  (bench/memory.py)

TABLES = [("public", "pgb_branches"), ("public", "pgb_tellers"), ("public", "pgb_accounts")]
SCHEMA = """
CREATE TABLE pgb_branches (bid int PRIMARY KEY, bbalance int NOT NULL, filler char(88));
CREATE TABLE pgb_tellers (tid int PRIMARY KEY, bid int NOT NULL, tbalance int NOT NULL, filler char(84));
CREATE TABLE pgb_accounts (aid int PRIMARY KEY, bid int NOT NULL, abalance int NOT NULL, filler char(84));
CREATE PUBLICATION pgb FOR TABLE pgb_branches, pgb_tellers, pgb_accounts;
CREATE PROCEDURE pgb_run(n int, accounts int) LANGUAGE plpgsql AS $$
DECLARE a int; t int; d int;
BEGIN
  PERFORM setseed(0.42);
  FOR i IN 1..n LOOP
    a := 1 + floor(random() * accounts)::int;
    t := 1 + floor(random() * 10)::int;
    d := floor(random() * 10001)::int - 5000;
    UPDATE pgb_accounts SET abalance = abalance + d WHERE aid = a;
    UPDATE pgb_tellers SET tbalance = tbalance + d WHERE tid = t;
    UPDATE pgb_branches SET bbalance = bbalance + d WHERE bid = 1;
    COMMIT;
  END LOOP;
END $$;
"""


def log(msg: str) -> None:
    print(f"bench/apply: {msg}", file=sys.stderr, flush=True)


def capture(dsn: str, workdir: Path, transactions: int, accounts: int, sample: int) -> dict[str, object]:
    """Run the history on Postgres and write raw logs: all, the load only, the load + ``sample`` txns."""
    import psycopg
    import pyarrow.parquet as pq

    from applier.sources.rawlog_writer import write_raw_log
    from applier.sources.sql_slot import create_slot, peek, pgoutput_options

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)
        create_slot(conn, "bench")
        with conn.transaction():
            conn.execute("INSERT INTO pgb_branches VALUES (1, 0, '')")
            conn.execute("INSERT INTO pgb_tellers SELECT g, 1, 0, '' FROM generate_series(1, 10) g")
            conn.execute("INSERT INTO pgb_accounts SELECT g, 1, 0, '' FROM generate_series(1, %s) g", (accounts,))
        started = time.monotonic()
        conn.execute("SET synchronous_commit = off")
        conn.execute("CALL pgb_run(%s, %s)", (transactions, accounts))
        conn.execute("SET synchronous_commit = on")
        conn.execute("UPDATE pgb_branches SET filler = 'end' WHERE bid = 1")  # flushed: peek sees everything
        log(f"Postgres ran {transactions} transactions in {time.monotonic() - started:.1f} s")
        raw = workdir / "raw.parquet"
        n = write_raw_log(raw, ((m.lsn, m.xid, m.data) for m in peek(conn, "bench", pgoutput_options("pgb"))))
    table = pq.read_table(raw)
    data = table.column("data").to_pylist()
    commits = [i for i, d in enumerate(data) if d[:1] == b"C"]
    pq.write_table(table.slice(0, commits[0] + 1), workdir / "load.parquet")
    pq.write_table(table.slice(0, commits[sample] + 1), workdir / "sample.parquet")
    changes = sum(1 for d in data if d[:1] in (b"I", b"U", b"D"))
    log(f"captured {n} messages, {len(commits)} transactions, {changes} row changes")
    return {"messages": n, "transactions": len(commits), "row_changes": changes}


# --- the modes, each in its own process ---------------------------------------------------------

def _memory(spark) -> dict[str, float]:
    return {"python_peak_rss_mb": python_peak_rss_mb(), "jvm_peak_heap_mb": jvm_peak_heap_mb(spark)}


def _replay(spark, log_path: Path, target: Path, **apply: object) -> float:
    from applier.config import ApplySettings, ReplayConfig, TargetSettings
    from applier.drivers.replay import replay_log

    started = time.monotonic()
    replay_log(spark, ReplayConfig(source_log=str(log_path), target=TargetSettings(path=str(target)),
                                   apply=ApplySettings(**apply)))
    return time.monotonic() - started


def mode_grouped(spark, args: argparse.Namespace) -> dict[str, object]:
    import psycopg

    from applier.checks.verify import verify_against_postgres

    target = Path(args.workdir) / "grouped"
    seconds = _replay(spark, Path(args.workdir) / "raw.parquet", target,
                      max_group_transactions=args.group_transactions)
    memory = _memory(spark)
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        results = verify_against_postgres(spark, conn, str(target), TABLES)
    bad = [r.source_name for r in results if not r.equal]
    if bad:
        raise SystemExit(f"bench/apply: grouped result differs from Postgres in {bad}")
    return {"seconds": seconds, "verified_equal": True, **memory}


def mode_per_transaction(spark, args: argparse.Namespace) -> dict[str, object]:
    work = Path(args.workdir)
    target = work / "per-transaction"
    _replay(spark, work / "load.parquet", target)  # the load: not timed
    prefix = _replay(spark, work / "load.parquet", target)  # re-reading the load, everything skipped
    seconds = _replay(spark, work / "sample.parquet", target, grouping="transaction")
    return {"sample_seconds": seconds, "prefix_seconds": prefix,
            "seconds_per_transaction": (seconds - prefix) / args.sample, **_memory(spark)}


def mode_append(spark, args: argparse.Namespace) -> dict[str, object]:
    import psycopg
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    from applier.checks.verify import postgres_table_rows

    work = Path(args.workdir)
    frames = []
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        for ns, name in TABLES:  # the same final rows, through the same values layer (not timed)
            _names, rows = postgres_table_rows(conn, ns, name)
            schema = spark.read.format("delta").load(str(work / "grouped" / ns / name)).schema
            frames.append((name, list(rows), schema))
    started = time.monotonic()
    written = 0
    for name, final_rows, schema in frames:
        # the rows as Arrow columns of the table's own types (Spark's mapping, as the Spark store does),
        # the form Spark's createDataFrame takes without a row-by-row path
        arrow = to_arrow_schema(schema, timezone="UTC")
        columns = list(zip(*final_rows, strict=True)) if final_rows else [() for _ in arrow]
        arrays = [pa.array(col, type=field.type) for col, field in zip(columns, arrow, strict=True)]
        table = pa.Table.from_arrays(arrays, schema=arrow)
        spark.createDataFrame(table, schema).write.format("delta").mode("append").save(str(work / "append" / name))
        written += len(final_rows)
    return {"seconds": time.monotonic() - started, "rows": written, **_memory(spark)}


MODES = {"grouped": mode_grouped, "per-transaction": mode_per_transaction, "append": mode_append}


def run_mode(args: argparse.Namespace) -> None:
    from applier.spark.session import build_spark_session

    spark = build_spark_session(spark_settings())
    print(json.dumps(MODES[args.mode](spark, args)))


def in_process(mode: str, args: argparse.Namespace, dsn: str) -> dict[str, object]:
    command = [sys.executable, __file__, "--mode", mode, "--workdir", args.workdir, "--dsn", dsn,
               "--sample", str(args.sample), "--group-transactions", str(args.group_transactions)]
    out = subprocess.run(command, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"bench/apply: mode {mode} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    from applier.config import ApplySettings

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--transactions", type=int, default=100_000)
    p.add_argument("--accounts", type=int, default=100_000)
    p.add_argument("--sample", type=int, default=30, help="transactions applied one MERGE each, then extrapolated")
    p.add_argument("--group-transactions", type=int, default=ApplySettings().max_group_transactions,
                   help="apply.max_group_transactions for (a) (default: the setting's default)")
    p.add_argument("--runs", type=int, default=1, help="repeat each mode; medians are reported")
    p.add_argument("--same-process", action="store_true",
                   help="run the modes in this process, in one Spark session (quicker, for a smoke run; the "
                   "memory figures are then the whole process's, not each mode's)")
    p.add_argument("--mode", choices=sorted(MODES), help=argparse.SUPPRESS)
    p.add_argument("--workdir", help=argparse.SUPPRESS)
    p.add_argument("--dsn", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.mode:
        run_mode(args)
        return

    from applier.devtools.pgcluster import start_cluster

    with tempfile.TemporaryDirectory(prefix="bench-apply-") as tmp, start_cluster() as cluster:
        args.workdir, args.dsn = tmp, cluster.dsn()
        shape = capture(cluster.dsn(), Path(tmp), args.transactions, args.accounts, args.sample)
        runs: dict[str, list[dict[str, object]]] = {m: [] for m in MODES}
        session = None
        if args.same_process:
            from applier.spark.session import build_spark_session

            session = build_spark_session(spark_settings())
        for run in range(args.runs):
            for mode in ("grouped", "per-transaction", "append"):  # append reads grouped's schema
                if run:
                    shutil.rmtree(Path(tmp) / mode, ignore_errors=True)  # state lives under the target
                result = MODES[mode](session, args) if session is not None else in_process(mode, args, cluster.dsn())
                log(f"run {run + 1} {mode}: {json.dumps(result)}")
                runs[mode].append(result)

    def med(mode: str, key: str) -> float:
        return statistics.median(float(r[key]) for r in runs[mode])  # type: ignore[arg-type]

    txns, changes = int(shape["transactions"]), int(shape["row_changes"])  # type: ignore[call-overload]
    grouped = med("grouped", "seconds")
    per_txn_total = med("per-transaction", "seconds_per_transaction") * txns
    append = med("append", "seconds")
    print(json.dumps({
        **shape, "runs": args.runs, "group_transactions": args.group_transactions,
        "grouped_seconds": round(grouped, 1), "grouped_rows_per_s": round(changes / grouped),
        "grouped_transactions_per_s": round(txns / grouped),
        "per_transaction_sample": args.sample,
        "per_transaction_seconds_each": round(med("per-transaction", "seconds_per_transaction"), 3),
        "per_transaction_seconds_extrapolated": round(per_txn_total),
        "per_transaction_rows_per_s_extrapolated": round(changes / per_txn_total, 1),
        "append_seconds": round(append, 1), "append_rows": runs["append"][0]["rows"],
        "append_rows_per_s": round(float(runs["append"][0]["rows"]) / append),  # type: ignore[arg-type]
        "grouped_vs_per_transaction": round(per_txn_total / grouped, 1),
        "grouped_vs_append": round(append / grouped, 3),
        "memory": {m: {k: v for k, v in runs[m][-1].items() if "mb" in k} for m in MODES},
        "verified_equal": all(r["verified_equal"] for r in runs["grouped"]),  # (a) stops the run if not
    }))


if __name__ == "__main__":
    main()
