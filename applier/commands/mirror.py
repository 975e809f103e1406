"""``applier mirror``: snapshot the published tables into Delta, then follow the slot."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from types import FrameType

from applier.commands.skip import add_skip_argument, with_skips
from applier.config import MirrorConfig, TargetSettings, load_config


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
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

The DSN comes from --dsn, source.dsn, or the variable named by source.dsn_env (APPLIER_DSN by
default); it is never printed. The publication must exist.""",
    )
    p.add_argument("--config", help="YAML config (see configs/mirror.yaml)")
    p.add_argument("--dsn", help="libpq connection string (prefer APPLIER_DSN: command lines are visible)")
    p.add_argument("--publication", help="publication to mirror (overrides source.publication)")
    p.add_argument("--slot", help="logical replication slot (overrides source.slot; created if absent)")
    p.add_argument("--target", help="directory of the Delta tables (overrides target.path)")
    p.add_argument("--once", action="store_true",
                   help="drain what is committed up to the server's current WAL position, then exit 0")
    p.add_argument("--sql", action="store_true", help="read with SQL peek/advance (source.read_mode: sql)")
    add_skip_argument(p)
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace) -> MirrorConfig:
    """The config file (if any) with the command line's overrides applied."""
    if args.config:
        cfg: MirrorConfig = load_config(args.config, MirrorConfig)
    else:
        if not args.target:
            raise SystemExit("applier mirror: give --config, or --target (with --dsn or APPLIER_DSN)")
        cfg = MirrorConfig(target=TargetSettings(path=args.target))
    updates: dict[str, object] = {"source": cfg.source.with_overrides(
        dsn=args.dsn, publication=args.publication, slot=args.slot, read_mode="sql" if args.sql else None)}
    if args.target:
        updates["target"] = cfg.target.model_copy(update={"path": args.target})
    updates["apply"] = with_skips(cfg.apply, args)
    return cfg.model_copy(update=updates)


def run(args: argparse.Namespace) -> int:
    from applier.drivers.mirror import mirror
    from applier.spark.session import build_spark_session_for

    cfg = config_from_args(args)
    stop = threading.Event()

    def on_sigint(_signum: int, _frame: FrameType | None) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        print("applier mirror: stopping after the transactions received so far (Ctrl-C again to quit now)",
              file=sys.stderr, flush=True)
        stop.set()

    from applier.infra.lock import target_writer

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        with target_writer(cfg.target.path, cfg.target.state_dir, command='mirror'):
            spark = build_spark_session_for(cfg.spark)
            summary = mirror(spark, cfg, once=args.once, stop=stop,
                             progress=lambda m: print(f"mirror: {m}", file=sys.stderr, flush=True))
    finally:
        signal.signal(signal.SIGINT, previous)
    if stop.is_set():
        summary.stopped_by = "Ctrl-C"
    for line in summary.lines():
        print(line)
    return 0
