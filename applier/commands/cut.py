"""``applier cut``: the newest consistent cut of a target (or the newest at or before an LSN or a time) and
each table's Delta version there."""

from __future__ import annotations

import argparse
import json
from datetime import datetime

from applier.errors import ConfigError


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "cut",
        help="show the newest consistent cut: one Delta version per table, all as Postgres had them at one commit",
        description="A mirror (and a replay, and the streaming sink) records a consistent cut after every group "
        "it applies, in the Delta table TARGET/_applier/cuts: the group's end LSN, the source commit time of its "
        "last transaction and, for every mirrored table and its history and change feed tables, the Delta version "
        "that holds exactly the source transactions up to that LSN, with its Delta table id (metaData.id: a table "
        "written anew at the same path since has another). Each cut has an id of its own (a UUID). Reading each "
        "table at its version (Spark's versionAsOf, delta-rs's DeltaTable(path, version=v)) shows every table as "
        "Postgres had it at that commit, "
        "never half of a transaction that wrote several tables (docs/consistent-reads.md). Prints the newest cut, "
        "or with --at / --at-time the newest at or before that LSN or source commit time. Reads with delta-rs: no "
        "JVM. Exit 3 when the target has no such cut.",
    )
    p.add_argument("--config", help="a mirror config (configs/mirror.yaml): its target")
    p.add_argument("--target", help="directory (or URI) of the mirrored Delta tables (overrides target.path)")
    at = p.add_mutually_exclusive_group()
    at.add_argument("--at", metavar="LSN", help="the newest cut at or before this LSN (0/16B3748)")
    at.add_argument("--at-time", metavar="TIMESTAMP",
                    help="the newest cut whose source commit time is at or before this ISO 8601 time (naive: UTC)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from applier.checks.cuts import cut_status, find_cut, parse_at
    from applier.lsn import format_lsn

    target = args.target
    if args.config:
        from applier.config import MirrorConfig, load_config

        cfg: MirrorConfig = load_config(args.config, MirrorConfig, overrides={"target.path": (args.target, "--target")})
        target = cfg.target.path
    if not target:
        raise ConfigError("no target: pass --target or --config")
    at = None
    if args.at is not None:
        at = parse_at(args.at)
        if not isinstance(at, int):
            raise ConfigError(f"--at takes an LSN (0/16B3748), not a time: {args.at!r} (--at-time takes a time)")
    elif args.at_time is not None:
        at = parse_at(args.at_time)
        if not isinstance(at, datetime):
            raise ConfigError(f"--at-time takes an ISO 8601 time, not an LSN: {args.at_time!r}")
    cut = find_cut(str(target), at)
    if args.json:
        print(json.dumps({"target": str(target), **cut.as_dict()}))
        return 0
    age_seconds = cut_status(cut)["age_seconds"]
    age = f", {age_seconds:.1f}s ago" if age_seconds is not None else ""
    when = cut.commit_time.isoformat() if cut.commit_time is not None else "unknown"
    named = f"cut {cut.cut_id}" if cut.cut_id else "cut"
    print(f"{named} at LSN {format_lsn(cut.lsn)}: source commit {when}{age} (recorded "
          f"{cut.recorded_at.isoformat(timespec='seconds')}), {len(cut.tables)} tables")
    rows = [("table", "kind", "version", "path", "table id")] + [
        (t.name, t.kind, str(t.version), t.path, t.table_id or "-") for t in cut.tables]
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    for row in rows:
        print("  ".join(v.rjust(w) if i == 2 else v.ljust(w) for i, (v, w) in enumerate(zip(row, widths,
                                                                                             strict=True))).rstrip())
    return 0
