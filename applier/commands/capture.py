"""``applier capture``: drain a slot into a raw-log Delta table that ``replay`` can rebuild from."""

from __future__ import annotations

import argparse

from applier.commands.logsetup import progress
from applier.config import CaptureConfig, load_config


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "capture",
        help="drain a slot into a stored raw log (a Delta table) for replay",
        description="Peek the slot (creating it if absent), append the messages of every complete "
        "transaction to the Delta table LOG (columns lsn, xid, data, seq, session, captured_at, and catalog: "
        "what the live catalog said of each Relation, which replay follows through DDL; the "
        "format `applier replay --source LOG` reads), and only then advance the slot. Each Delta "
        "commit records the end LSN it stored up to, so a crash at any point neither loses nor "
        "duplicates a message: run the same command again. Without --follow it drains what is "
        "committed now and exits 0. A drained slot is advanced to the server's position, so a quiet "
        "publication does not hold the WAL other tables and databases write. The DSN comes from --dsn, "
        "source.dsn, $APPLIER_DSN or libpq's "
        "PGHOST/PGSERVICE variables and is never printed; it is parsed and one connection made before "
        "Spark starts (exit 2 for a bad DSN, 3 when the server cannot be reached or refuses the login).",
    )
    p.add_argument("--config", help="YAML config (see configs/capture.yaml and docs/config.md); relative paths "
                   "in it are resolved from its folder")
    p.add_argument("--dsn", help="libpq connection string (prefer APPLIER_DSN)")
    p.add_argument("--publication", help="publication (overrides source.publication)")
    p.add_argument("--slot", help="slot (overrides source.slot; created if absent)")
    p.add_argument("--log", help="Delta table path of the raw log (overrides log_path)")
    p.add_argument("--follow", action="store_true", help="keep polling for new transactions until Ctrl-C")
    p.add_argument("--metrics-port", type=int, metavar="PORT",
                   help="serve Prometheus metrics at http://HOST:PORT/metrics (messages stored, lag, the slot's WAL "
                   "state) and a health check at /healthz while capture runs (metrics.port)")
    p.add_argument("--metrics-host", metavar="HOST",
                   help="the address the metrics server listens on (metrics.host; default 127.0.0.1, this "
                   "machine only: the endpoints have no authentication; 0.0.0.0 opens them to every interface)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from applier.checks.writable import check_writable_directory
    from applier.drivers.capture import capture
    from applier.drivers.writer import location_lock
    from applier.sources.dsn import check_connection
    from applier.sources.publication import check_publication
    from applier.spark.session import build_spark_session_for

    cfg: CaptureConfig = load_config(args.config, CaptureConfig, overrides={
        "source.dsn": (args.dsn, "--dsn"),
        "source.publication": (args.publication, "--publication"),
        "source.slot": (args.slot, "--slot"),
        "log_path": (args.log, "--log"),
        "metrics.port": (args.metrics_port, "--metrics-port"),
        "metrics.host": (args.metrics_host, "--metrics-host"),
    })
    check_writable_directory(cfg.log_path, "log_path (--log)")  # exit 2 before the server and Spark
    # The raw log's own lock file (a name starting with '_': Delta readers and the raw-log reader skip it)
    with location_lock(cfg.log_path, "raw log", lock_name="_applier_writer.lock"):
        check_connection(cfg.source.resolved_dsn())  # before Spark starts: see `applier mirror --help`
        check_publication(cfg.source.resolved_dsn(), cfg.source.publication)  # a typo: exit 2
        spark = build_spark_session_for(cfg.spark, (cfg.log_path,))
        summary = capture(spark, cfg, once=not args.follow, progress=progress("capture"))
    for line in summary.lines():
        print(line)
    return 0
