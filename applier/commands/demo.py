"""``applier demo``: the whole product on an embedded default, in one command.

Starts a throw-away PostgreSQL (or uses ``--dsn``), creates the sample ``shop`` schema with a
publication and a pgoutput slot, runs a workload, stores the slot's messages as a raw log, replays
that log into Delta tables, confirms the slot, and verifies every table against Postgres.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import time
from pathlib import Path

from applier.commands.exitcodes import ExitCode
from applier.errors import ConfigError

PUBLICATION = "applier_demo"
SLOT = "applier_demo"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "demo",
        help="mirror a sample Postgres workload into local Delta tables and verify them",
        description="Start a throw-away PostgreSQL (or use --dsn), create a sample 'shop' schema with "
        "a publication and slot, run a workload (inserts, updates, key changes, unchanged TOAST "
        "values, deletes, a truncate), store the slot's messages as a raw log, replay it into Delta "
        "tables under OUTPUT/delta, and check every table against Postgres row by row.",
    )
    p.add_argument("--dsn", help="use this PostgreSQL (wal_level=logical) instead of starting one; "
                   "the demo creates schema 'shop', publication and slot 'applier_demo' there")
    p.add_argument("--output", default="demo-output", help="directory for the raw log and Delta tables "
                   "(default: ./demo-output; replaced on each run)")
    p.add_argument("--transactions", type=int, default=200, help="workload size (default 200)")
    p.add_argument("--pg-major", type=int, default=None,
                   help="PostgreSQL major to start when no --dsn (default: the oldest installed)")
    p.set_defaults(func=run)


def say(msg: str) -> None:
    logging.getLogger("applier.demo").info("%s", msg)


def run(args: argparse.Namespace) -> int:
    from applier.devtools.pgcluster import start_cluster

    out = Path(args.output).resolve()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    cluster = None
    try:
        if args.dsn:
            from applier.sources.dsn import check_connection

            dsn = args.dsn
            check_connection(dsn)
        else:
            say("starting a throw-away PostgreSQL with wal_level=logical")
            cluster = start_cluster(args.pg_major)
            dsn = cluster.dsn("postgres")
            say(f"PostgreSQL {cluster.major} is up on 127.0.0.1:{cluster.port} (data in {cluster.base_dir})")
        return _demo(dsn, out, args.transactions)
    finally:
        if cluster is not None:
            cluster.stop()


def _demo(dsn: str, out: Path, transactions: int) -> int:
    import psycopg  # here, not when `applier` builds its parser

    from applier.checks.verify import verify_against_postgres
    from applier.config import ReplayConfig, TargetSettings
    from applier.devtools.sample import create_schema, run_workload
    from applier.drivers.replay import replay_log
    from applier.sources.rawlog_writer import write_raw_log
    from applier.sources.sql_slot import advance, create_slot, peek, pgoutput_options
    from applier.spark.session import build_spark_session

    with psycopg.connect(dsn, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = 'shop'").fetchone():
            raise ConfigError("schema 'shop' already exists in that database; the demo creates it fresh "
                               "(drop it, its publication and slot 'applier_demo', or use another database)")
        say("creating schema shop, publication and slot")
        create_schema(conn, PUBLICATION)
        create_slot(conn, SLOT)
        say(f"running the workload ({transactions} transactions)")
        run_workload(conn, transactions=transactions)
        raw_log = out / "raw-log.parquet"
        options = pgoutput_options(PUBLICATION, proto_version=1)
        rows = write_raw_log(raw_log, ((m.lsn, m.xid, m.data) for m in peek(conn, SLOT, options)))
        say(f"stored {rows} pgoutput messages as a raw log: {raw_log}")

        spark = build_spark_session()
        target = out / "delta"
        started = time.monotonic()
        summary = replay_log(spark, ReplayConfig(source_log=str(raw_log), target=TargetSettings(path=str(target))),
                             progress=say)
        say(f"replayed {summary.transactions} transactions in {time.monotonic() - started:.1f}s")
        if summary.last_end_lsn is not None:
            advance(conn, SLOT, summary.last_end_lsn)  # only now is the server told it may forget them
        results = verify_against_postgres(spark, conn, str(target), summary.tables)
    bad = [r for r in results if not r.equal]
    print()
    print(f"Delta tables under {target}:")
    for r in results:
        print(f"  {r.source_name:<16} {r.target_rows:>6} rows  {'equal to Postgres' if r.equal else 'DIFFERENT'}")
    print()
    print("Query them with Spark, for example:")
    print("  .venv/bin/python -c \"from applier.spark.session import build_spark_session as b; "
          f"b().read.format('delta').load('{target}/shop/orders').show()\"")
    print(f"Inspect the raw log:  .venv/bin/applier inspect --source {out / 'raw-log.parquet'}")
    if bad:
        logging.getLogger("applier.demo").warning("%d table(s) differ from Postgres", len(bad))
        return ExitCode.DIFFERENCES
    return ExitCode.OK
