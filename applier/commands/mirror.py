"""``applier mirror``: snapshot the published tables into Delta, then follow the slot."""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from types import FrameType

from applier.commands.logsetup import progress
from applier.commands.skip import add_skip_argument
from applier.config import MirrorConfig, load_config


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "mirror",
        help="mirror a publication's tables into Delta and keep them up to date",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="""\
Mirror the tables of a PostgreSQL publication into Delta tables at TARGET/<schema>/<table>.

First run: creates the pgoutput slot (two-phase if source.two_phase), copies every published table
under the snapshot the slot exports (exact: the copy sees precisely the transactions before the
slot's start), then streams changes with the replication protocol (source.read_mode: sql polls with
peek/advance instead). Later runs continue from the slot. A position is confirmed to the server only
after the Delta commits for it exist, so a crash or kill at any point loses nothing and duplicates
nothing: restart the same command.

Lag (bytes and seconds) is printed every 10 s. Ctrl-C finishes the transactions received so far,
confirms them and exits 0 (a second Ctrl-C exits at once; the next run re-applies safely).

The DSN comes from --dsn, source.dsn, the variable named by source.dsn_env (APPLIER_DSN by
default), or libpq's own PGHOST/PGSERVICE/... variables; it is never printed. It is parsed and one
connection is made before anything else: a DSN that does not parse or a bad sslmode exits 2, a server
that cannot be reached or a refused login exits 3, at once. Reconnects with backoff
(source.max_retries) are for outages after that. A publication the database does not have, a slot
name PostgreSQL refuses (lower-case letters, digits, underscores) and a target that is a file or
cannot be written exit 2, also at once.

Spark starts only when an operation needs it (a table delta-rs does not write, e.g. one without a
key; a schema change; executors; see docs/applying.md, "Spark only when needed"), with one log line saying
why: a mirror of keyed tables delta-rs writes copies and follows without a JVM.

Flags override the config file (and APPLIER_* variables) and may supply what it lacks.""",
    )
    p.add_argument("--config", help="YAML config (see configs/mirror.yaml and docs/config.md); relative paths "
                   "in it are resolved from its folder")
    p.add_argument("--dsn", help="libpq connection string (prefer APPLIER_DSN: command lines are visible)")
    p.add_argument("--publication", help="publication to mirror, or several comma-separated "
                   "(overrides source.publication)")
    p.add_argument("--slot", help="logical replication slot (overrides source.slot; created if absent)")
    p.add_argument("--target", help="directory of the Delta tables (overrides target.path)")
    p.add_argument("--once", action="store_true",
                   help="drain what is committed up to the server's current WAL position, then exit 0")
    p.add_argument("--sql", action="store_true", help="read with SQL peek/advance (source.read_mode: sql)")
    p.add_argument("--metrics-port", type=int, metavar="PORT",
                   help="serve Prometheus metrics at http://HOST:PORT/metrics and a health check at /healthz "
                   "(200 while the mirror makes progress or is caught up, 503 when stalled), and a status page "
                   "for a browser at http://HOST:PORT/ (metrics.port)")
    p.add_argument("--metrics-host", metavar="HOST",
                   help="the address the metrics server listens on (metrics.host; default 127.0.0.1, this "
                   "machine only: the endpoints have no authentication; 0.0.0.0 opens them to every interface)")
    add_skip_argument(p)
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace) -> MirrorConfig:
    """The config file (if any), APPLIER_* variables and the flags, validated together."""
    cfg: MirrorConfig = load_config(args.config, MirrorConfig, overrides={
        "source.dsn": (args.dsn, "--dsn"),
        "source.publication": (args.publication, "--publication"),
        "source.slot": (args.slot, "--slot"),
        "source.read_mode": ("sql" if args.sql else None, "--sql"),
        "target.path": (args.target, "--target"),
        "metrics.port": (args.metrics_port, "--metrics-port"),
        "metrics.host": (args.metrics_host, "--metrics-host"),
        "apply.skip_transactions+": (args.skip_transaction, "--skip-transaction"),
    })
    return cfg


def run(args: argparse.Namespace) -> int:
    from applier.drivers.mirror import mirror
    from applier.sources.dsn import check_connection
    from applier.sources.publication import check_publication
    from applier.spark.session import SparkProvider

    cfg = config_from_args(args)
    stop = threading.Event()

    def on_sigint(_signum: int, _frame: FrameType | None) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        logging.getLogger("applier.mirror").warning(
            "stopping after the transactions received so far (Ctrl-C again to quit now)")
        stop.set()

    from applier.drivers.writer import target_writer

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        # One writer per target first (a local check), then the server; Spark only when an operation
        # needs it (a table delta-rs does not write, executors...): the provider starts it then.
        with target_writer(cfg.target.path, cfg.target.state_dir, command="mirror", config_file=args.config):
            # Before Spark (and maybe a jar download) starts: a DSN that does not parse, a bad sslmode, a
            # wrong password or a server that is not there fails here, once, with exit 2 or 3.
            # Reconnecting with backoff is for outages after this first connection succeeded.
            check_connection(cfg.source.resolved_dsn())
            check_publication(cfg.source.resolved_dsn(), cfg.source.publication)  # a typo: exit 2
            spark = SparkProvider.for_config(cfg.spark_config(), (cfg.target.path,))
            summary = mirror(spark, cfg, once=args.once, stop=stop, progress=progress("mirror"))
    finally:
        signal.signal(signal.SIGINT, previous)
    if stop.is_set():
        summary.stopped_by = "Ctrl-C"
    for line in summary.lines():
        print(line)
    return 0
