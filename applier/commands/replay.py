"""``applier replay``: apply a stored raw log to Delta tables, exactly once, in commit order."""

from __future__ import annotations

import argparse
import logging

from applier.commands.logsetup import progress
from applier.commands.skip import add_skip_argument
from applier.config import ReplayConfig, load_config


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "replay",
        help="apply a stored raw log (lsn, xid, data) to Delta tables",
        description="Read a stored raw log (Parquet file or directory, or a Delta table, with columns "
        "lsn, xid, data in log order: what pg_logical_slot_peek_binary_changes returns) and maintain "
        "one Delta table per source table at TARGET/<schema>/<table>. Consecutive source transactions "
        "are folded into one Delta commit per table (exact; apply.grouping: transaction in a config "
        "gives one commit per source transaction), tagged with the end LSN of the last transaction "
        "in it, so a second replay of the same log writes nothing. State (catalog, staged prepared "
        "transactions) lives in TARGET/_applier/. Flags override the config (and APPLIER_* variables) "
        "and may supply what it lacks.",
    )
    p.add_argument("--source", help="raw log path (overrides source_log of --config)")
    p.add_argument("--target", help="directory of the Delta tables (overrides target.path of --config)")
    p.add_argument("--config", help="YAML config (see configs/replay.yaml and docs/config.md); relative paths "
                   "in it are resolved from its folder")
    p.add_argument("--dry-run", action="store_true",
                   help="print, per group of transactions and table, what would be merged; write nothing")
    p.add_argument("--distributed", choices=["auto", "on", "off"],
                   help="decode and fold the log on Spark's executors (the driver surveys it, then combines "
                   "and commits the folds; exact, same result as the driver path): auto (default) for logs of "
                   "distributed.min_messages or more when Spark has several cores, on, or off "
                   "(overrides distributed.mode)")
    add_skip_argument(p)
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace) -> ReplayConfig:
    """The config file (if any), APPLIER_* variables and the flags, validated together."""
    cfg: ReplayConfig = load_config(args.config, ReplayConfig, overrides={
        "source_log": (args.source, "--source"),
        "target.path": (args.target, "--target"),
        "distributed.mode": (args.distributed, "--distributed"),
        "apply.skip_transactions+": (args.skip_transaction, "--skip-transaction"),
    })
    return cfg


def run(args: argparse.Namespace) -> int:
    from applier.checks.position import check_log_continues_target
    from applier.drivers.replay import replay_log
    from applier.drivers.writer import target_writer
    from applier.spark.session import SparkProvider

    cfg = config_from_args(args)
    with target_writer(cfg.target.path, cfg.target.state_dir, command="replay", dry_run=args.dry_run):
        for warning in check_log_continues_target(cfg.target.path, cfg.source_log):
            logging.getLogger("applier.replay").warning("%s", warning)
        # started by the first operation that needs it
        spark = SparkProvider.for_config(cfg.spark_config(), (cfg.target.path, cfg.source_log))
        summary = replay_log(spark, cfg, progress=progress("replay"),
                             dry_run=(lambda line: print(f"would commit {line}")) if args.dry_run else None)
    for line in summary.lines():
        print(line)
    return 0
