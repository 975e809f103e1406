"""``applier replay``: apply a stored raw log to Delta tables, exactly once, in commit order."""

from __future__ import annotations

import argparse
import sys

from applier.commands.skip import add_skip_argument, with_skips
from applier.config import ReplayConfig, TargetSettings, load_config


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "replay",
        help="apply a stored raw log (lsn, xid, data) to Delta tables",
        description="Read a stored raw log (Parquet file or directory, or a Delta table, with columns "
        "lsn, xid, data in log order: what pg_logical_slot_peek_binary_changes returns) and maintain "
        "one Delta table per source table at TARGET/<schema>/<table>. Consecutive source transactions "
        "are folded into one Delta commit per table (exact; apply.grouping: transaction in a config "
        "gives one commit per source transaction), tagged with the end LSN of the last transaction "
        "in it, so a second replay of the same log writes nothing. State (catalog, staged prepared "
        "transactions) lives in TARGET/_applier/.",
    )
    p.add_argument("--source", help="raw log path (overrides source_log of --config)")
    p.add_argument("--target", help="directory of the Delta tables (overrides target.path of --config)")
    p.add_argument("--config", help="YAML config (see configs/replay.yaml)")
    p.add_argument("--dry-run", action="store_true",
                   help="print, per group of transactions and table, what would be merged; write nothing")
    add_skip_argument(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from applier.drivers.replay import replay_log
    from applier.spark.session import build_spark_session_for

    if args.config:
        cfg: ReplayConfig = load_config(args.config, ReplayConfig)
        updates: dict[str, object] = {}
        if args.source:
            updates["source_log"] = args.source
        if args.target:
            updates["target"] = cfg.target.model_copy(update={"path": args.target})
        cfg = cfg.model_copy(update=updates)
    else:
        if not (args.source and args.target):
            print("applier replay: give --source and --target, or --config", file=sys.stderr)
            return 2
        cfg = ReplayConfig(source_log=args.source, target=TargetSettings(path=args.target))
    cfg = cfg.model_copy(update={"apply": with_skips(cfg.apply, args)})
    from applier.infra.lock import target_writer

    with target_writer(cfg.target.path, cfg.target.state_dir, command='replay', dry_run=args.dry_run):
        from applier.checks.position import check_log_continues_target

        for warning in check_log_continues_target(cfg.target.path, cfg.source_log):
            print(f"applier replay: warning: {warning}", file=sys.stderr)
        spark = build_spark_session_for(cfg.spark)
        summary = replay_log(spark, cfg, progress=lambda m: print(f"replay: {m}", file=sys.stderr, flush=True),
                             dry_run=(lambda line: print(f"would commit {line}")) if args.dry_run else None)
    for line in summary.lines():
        print(line)
    return 0
