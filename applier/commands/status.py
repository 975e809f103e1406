"""``applier status``: per mirrored table the applied LSN, last commit, rows, files and size; the slot's lag
and WAL state; ``--watch`` refreshes it."""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from applier.errors import ConfigError

if TYPE_CHECKING:
    from applier.checks.status import SlotStatus, TableStatus


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "status",
        help="show each mirrored table's applied LSN, last commit and its lag, rows, files and size; the slot's lag "
        "and WAL",
        description="For every Delta table under TARGET/<schema>/<table>: the end LSN it has applied (the "
        "idempotent-write version in its Delta log), the time of its newest Delta commit, the source commit "
        "time of the last transaction it applied and that transaction's lag (its Delta commit time minus its "
        "source commit time), its row count, data files and their size, "
        "columns widened in place (Delta type widening, which delta-rs cannot read) and, with --config, "
        "the rule's table options an existing table lacks; the newest consistent cut (its LSN, source commit time "
        "and age: `applier cut`). Reads the Delta logs with delta-rs: no JVM. "
        "With a DSN (--dsn, the config's, $APPLIER_DSN, or libpq's PGHOST/PGSERVICE) also the slot: "
        "whether a mirror is attached, its confirmed LSN, the server's WAL position and the lag between them in bytes, "
        "its wal_status and safe_wal_size (with a WARNING when the slot may lose WAL: source.wal_warning_bytes), "
        "and, while a table sync creates its copy's slot, the prepared and open transactions it waits for.",
    )
    p.add_argument("--config", help="a mirror config (configs/mirror.yaml): target, DSN and slot")
    p.add_argument("--target", help="directory of the mirrored Delta tables")
    p.add_argument("--dsn", help="libpq connection string (default: the config's, or $APPLIER_DSN)")
    p.add_argument("--slot", help="slot to report (default: the config's, or 'applier')")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    p.add_argument("--watch", type=float, metavar="SECONDS", default=None,
                   help="refresh every SECONDS until Ctrl-C (with --json: one JSON object per line and refresh)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from applier.checks.status import gather_status, stops_line
    from applier.config import SourceSettings, libpq_env_given
    from applier.infra.stateformat import check_readable
    from applier.infra.stops import mends
    from applier.sink.naming import mirrored_table_dirs
    from applier.sources.dsn import check_connection
    from applier.spark.session import build_spark_session_for
    from applier.state import StateDir
    from applier.storage.paths import TablePath, location

    dsn, slot, target = args.dsn, args.slot, args.target
    if args.config:
        from applier.config import MirrorConfig, load_config

        cfg: MirrorConfig = load_config(args.config, MirrorConfig, overrides={
            "target.path": (args.target, "--target"), "source.slot": (args.slot, "--slot")})
        target, slot = cfg.target.path, cfg.source.slot
        if dsn is None and (cfg.source.dsn is not None or os.environ.get(cfg.source.dsn_env) or libpq_env_given()):
            dsn = cfg.source.resolved_dsn()
    if dsn is None:
        dsn = os.environ.get("APPLIER_DSN") or ("" if libpq_env_given() else None)
    if not target:
        raise ConfigError("no target: pass --target or --config")
    check_readable(StateDir.for_target(target, cfg.target.state_dir if args.config else None), "status")  # newer: 2
    if dsn is not None:
        check_connection(dsn)  # a bad DSN or an unreachable server exits 2 or 3, one line
    paths = mirrored_table_dirs(target)
    options: dict[TablePath, Any] = {}
    if args.config and dsn is not None:  # also the tables the config's rules put elsewhere, and their options
        import psycopg

        from applier.sink.idempotence import is_delta_table
        from applier.sink.schema import table_options
        from applier.sink.targets import TableTargets
        from applier.sources.publication import partial_publication_note, published_selection

        # A catalog name (a rule's `table:`) is resolved in Spark's catalog; everything else needs no JVM.
        needs_catalog = any(rule.table for rule in cfg.tables.rules)
        spark = build_spark_session_for(cfg.spark_config(), (target,)) if needs_catalog else None
        targets = TableTargets(spark, str(target), cfg.tables)
        with psycopg.connect(dsn, autocommit=True) as conn:
            selected = published_selection(conn, cfg.source.publication, cfg.tables)
            partial = partial_publication_note(conn, cfg.source.publication)
        located = {location(targets.path_for(t.namespace, t.name)): f"{t.namespace}.{t.name}" for t in selected}
        options = {p: table_options(cfg.tables.rule_for(name)) for p, name in located.items()}
        paths = sorted(set(paths) | {p for p in located if is_delta_table(str(p))})
    else:
        partial = None
    warn_below = cfg.source.wal_warning_bytes if args.config else SourceSettings().wal_warning_bytes
    slot_name = slot or "applier"

    def report() -> None:
        state = StateDir.for_target(target, cfg.target.state_dir if args.config else None)
        found = gather_status(str(target), state, dsn=dsn, slot=slot_name, warn_below=warn_below, paths=paths,
                              options=options)
        if args.json:
            print(found.as_json(), flush=True)
            return
        stops, parked, cut = found.stops, found.parked, found.cut
        print_status(found.tables, found.slot, target)
        if cut is not None:
            age = f" ({cut['age_seconds']:.1f}s ago)" if cut["age_seconds"] is not None else ""
            print(f"consistent cut: LSN {cut['lsn']}, source commit {cut['commit_time'] or 'unknown'}{age}, "
                  f"{cut['tables']} tables (`applier cut` lists their versions)")
        for name, entry in sorted(parked.items()):
            if "until" in entry:  # dropped in Postgres: nothing to bring back
                print(f"{name}: SET ASIDE since {entry.get('since')}: {entry.get('message')}")
                continue
            print(f"{name}: PARKED since {entry.get('since')} ({entry.get('error')}: {entry.get('message')}); its "
                  f"changes are left out: `applier resync --table {name}` copies it again and brings it back")
        mended = mends(state)
        if mended.get("count"):
            last = mended["recent"][0]
            print(f"MENDED BY ITSELF: {mended['count']} time(s) (apply.schema_changes); the last at {last['at']}: "
                  f"{last['tables']} {last['how']} ({last['error']})")
        line = stops_line(stops)
        if line is not None:
            print(line)
        if partial is not None:
            print(f"PUBLICATION: {partial}")

    if not args.watch:
        report()
        return 0
    try:
        while True:
            if not args.json and sys.stdout.isatty():
                print("\x1b[H\x1b[2J", end="")  # clear the terminal: the report replaces the last one
            if not args.json:
                print(f"{datetime.now(UTC).isoformat(timespec='seconds')} (every {args.watch:g} s; Ctrl-C stops)")
            report()
            time.sleep(args.watch)
    except KeyboardInterrupt:
        return 0


def print_status(tables: list[TableStatus], slot_info: SlotStatus | None, target: str) -> None:
    """The report as an aligned table, notes under it, then the slot."""
    from applier.infra.progress import byte_size
    from applier.lsn import format_lsn

    catalog = any(t.catalog_name for t in tables)  # (a column only when `catalog:` registers tables)
    header: tuple[str, ...] = ("table", "applied", "last commit", "source commit", "lag", "rows", "files", "size")
    header += ("catalog name",) if catalog else ()
    lines = [header]
    for t in tables:
        name = t.source_name if t.kind == "mirror" else f"{t.source_name} ({t.kind})"
        lines.append((name, format_lsn(t.applied_lsn) if t.applied_lsn is not None else "-",
                      (t.last_commit or "-")[:19], (t.source_commit_time or "-")[:19],
                      f"{t.lag_seconds:.1f}s" if t.lag_seconds is not None else "-",
                      str(t.rows) if t.rows is not None else "?",
                      str(t.files) if t.files is not None else "?",
                      byte_size(t.size_bytes) if t.size_bytes is not None else "?")
                     + ((t.catalog_name or "-",) if catalog else ()))
    if tables:
        widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
        for line in lines:
            print("  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(line, widths,
                                                                                             strict=True))).rstrip())
    for t in tables:
        if t.kind == "retired":
            print(f"{t.source_name}: dropped in Postgres, kept at {t.path}")
        if t.publication not in (None, "published"):
            print(f"{t.source_name}: NOT FOLLOWED: {t.publication} (taken out of the publication or dropped): its rows "
                  "are as of then, not current")
        if t.widened:
            print(f"{t.source_name}: widened in place: {', '.join(t.widened)} (Delta type widening is on; readers "
                  "without it, such as delta-rs, cannot read this table)")
        elif t.reader_features:
            print(f"{t.source_name}: Delta reader features: {', '.join(t.reader_features)}")
        for mismatch in t.option_mismatches:
            print(f"{t.source_name}: table option differs from its rule (options apply only at creation): {mismatch}")
    if not tables:
        print(f"no mirrored tables under {target}")
    if slot_info is not None:
        if not slot_info.exists:
            print(f"slot {slot_info.slot}: does not exist")
        else:
            print(f"slot {slot_info.slot}: {'active' if slot_info.active else 'idle'}, confirmed "
                  f"{format_lsn(slot_info.confirmed_lsn) if slot_info.confirmed_lsn else '-'}, server at "
                  f"{format_lsn(slot_info.server_lsn) if slot_info.server_lsn else '-'}"
                  f"{' (a standby: replayed)' if slot_info.standby else ''}, "
                  f"lag {slot_info.lag_bytes} bytes; wal_status {slot_info.wal_status or '-'}, safe_wal_size "
                  f"{_safe_wal_size(slot_info)}"
                  f"{', failover' if slot_info.failover else ''}")
            if slot_info.risk:
                print(f"  WARNING: the slot is at risk: {slot_info.risk}")
            if slot_info.held_back:
                print(f"  HELD BACK: {slot_info.held_back}")
        if slot_info.sync_waits:
            print(f"  table sync: creating its copy's slot waits for {'; '.join(slot_info.sync_waits)}")


def _safe_wal_size(slot: SlotStatus) -> str:
    """How much WAL may still be written before the slot is lost: unlimited without max_slot_wal_keep_size,
    none for a slot already lost (PostgreSQL reports NULL for both)."""
    if slot.wal_status == "lost":
        return "none (lost)"
    return "unlimited" if slot.safe_wal_size is None else str(slot.safe_wal_size)
