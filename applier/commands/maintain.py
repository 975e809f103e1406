"""``applier maintain``: compact, VACUUM and checkpoint the Delta tables of a target, beside a running mirror."""

from __future__ import annotations

import argparse
import json

from applier.commands.exitcodes import ExitCode
from applier.commands.logsetup import progress
from applier.errors import ConfigError


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "maintain",
        help="compact small files, VACUUM and checkpoint the mirrored tables (safe while mirror runs)",
        description="For every Delta table under TARGET (mirrored tables, their history and change feed tables, "
        "retired tables): first, data files an older applier let Spark write with INT96 timestamps (which "
        "delta-rs and other readers misread outside 1677-2262) are rewritten by Spark as microseconds, once (the "
        "table is then marked applier.parquetTimestamps); then, when it holds at least "
        "maintenance.min_small_files data files smaller than maintenance.small_file_bytes, compact them "
        "(OPTIMIZE; Z-ordered by maintenance.z_order's columns where a glob matches); then VACUUM with "
        "maintenance.retention_hours (default: the table's own delta.deletedFileRetentionDuration, 7 days) and "
        "write a checkpoint. Safe while `applier mirror` writes the same tables: the mirror's exactly-once "
        "record (the txn actions) is untouched, and a compaction that races a MERGE is a Delta commit conflict "
        "that the loser retries (docs/operations.md, \"Table maintenance\"). delta-rs does the work on every "
        "table it can write (no JVM); the others go through Spark's OPTIMIZE and VACUUM. Then the consistent cuts "
        "(TARGET/_applier/cuts, `applier cut`) recorded longer ago than the retention are dropped (the versions "
        "they name are what VACUUM may delete; the newest cut is always kept) and that table is maintained too. "
        "One line per table, or one JSON object with --json.",
    )
    p.add_argument("--config", help="a mirror config (configs/mirror.yaml): its target and maintenance section")
    p.add_argument("--target", help="directory of the mirrored Delta tables (overrides target.path)")
    p.add_argument("--table", action="append", help="only this schema.table (repeatable)")
    p.add_argument("--retention-hours", type=int, metavar="N",
                   help="VACUUM keeps files a version of the last N hours needs (maintenance.retention_hours)")
    p.add_argument("--min-small-files", type=int, metavar="N",
                   help="compact a table with at least N small files (maintenance.min_small_files)")
    p.add_argument("--dry-run", action="store_true",
                   help="say what would be compacted and how many files VACUUM would delete; change nothing")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from applier.config import MaintenanceSettings, MirrorConfig, SparkConfig, load_config
    from applier.sink.cuts import DEFAULT_RETENTION_HOURS, CutLog
    from applier.sink.maintenance import TableMaintainer, tables_under
    from applier.spark.session import SparkProvider

    target, settings, spark_config = args.target, MaintenanceSettings(), SparkConfig()
    if args.config:
        cfg: MirrorConfig = load_config(args.config, MirrorConfig, overrides={
            "target.path": (args.target, "--target")})
        target, settings, spark_config = cfg.target.path, cfg.maintenance, cfg.spark_config()
    if not target:
        raise ConfigError("no target: pass --target or --config")
    from applier.storage.paths import location

    if not location(target).is_dir():
        raise ConfigError(f"target {target} is not a directory", target=target)
    changes: dict[str, object] = {}
    if args.retention_hours is not None:
        changes["retention_hours"] = args.retention_hours
    if args.min_small_files is not None:
        changes["min_small_files"] = args.min_small_files
    if changes:
        settings = MaintenanceSettings.model_validate({**settings.model_dump(), **changes})

    tables = tables_under(target)
    if args.table:
        wanted = set(args.table)
        unknown = wanted - {t.source_name for t in tables}
        if unknown:
            raise ConfigError(f"no such mirrored table under {target}: {', '.join(sorted(unknown))}")
        tables = [t for t in tables if t.source_name in wanted]

    # Spark starts only for a table delta-rs cannot write (applier.sink.maintenance)
    maintainer = TableMaintainer(settings, SparkProvider.for_config(spark_config, (str(target),)), dry_run=args.dry_run,
                                 progress=progress("maintain"))
    results = []
    for table in tables:
        result = maintainer.maintain(table.path, table.label, z_order=table.kind == "mirror")
        results.append(result)
        if not args.json:
            print(result.line(), flush=True)
    pruned = None
    cuts_result = None
    cuts = CutLog(str(target))
    if not args.table and cuts.exists():
        pruned = cuts.prune(settings.retention_hours or DEFAULT_RETENTION_HOURS, dry_run=args.dry_run)
        result = cuts_result = maintainer.maintain(cuts.path, "_applier/cuts", z_order=False)
        if not args.json:
            print(f"consistent cuts: {pruned} older than the retention {'would be ' if args.dry_run else ''}dropped",
                  flush=True)
            print(result.line(), flush=True)
    if args.json:
        print(json.dumps({"target": str(target), "dry_run": args.dry_run,
                          "tables": [r.as_dict() for r in results], "cuts_pruned": pruned,
                          "cuts": cuts_result.as_dict() if cuts_result is not None else None}))
    elif not tables:
        print(f"no Delta tables under {target}")
    return ExitCode.OK
