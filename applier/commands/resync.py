"""``applier resync``: copy chosen tables of a mirror again from Postgres, at a new position."""

from __future__ import annotations

import argparse

from applier.commands.logsetup import progress
from applier.config import MirrorConfig, load_config


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "resync",
        help="copy one table of a mirror again from Postgres (after a type change Delta cannot widen)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="""\
Replace the Delta table of each --table with a fresh copy of the Postgres table, taken at a new
position, while the mirror's slot stays where it is. Run it with the mirror's own config while the
mirror is stopped (it takes the target's writer lock); then run `applier mirror` again: it goes on
from its slot and leaves out, for these tables, every transaction the copy already holds, and
applies the later ones on top (exactly once: the copy's position is recorded as the table's
applied version, as for a table that joined the publication).

When to use it: the mirror stopped with exit 4 because a column changed type in a way Delta cannot
widen (ALTER TABLE ... ALTER COLUMN c TYPE text, or DROP COLUMN c; ADD COLUMN c text), because a
Delta table diverged from Postgres (a row to delete or to read unchanged TOAST values from is not
there), or because a rename could not be proven; when it stopped with exit 2 because a table's Delta
history went backwards (its newest commit files deleted, or its directory restored from an older copy:
the transactions it lost are gone from the stream); or a table should be rebuilt from Postgres for any
other reason. The Delta table is emptied with the columns
Postgres has now (one commit; its history and table id stay: time travel still reaches the old
rows) and filled again. apply.schema_changes: resync makes the mirror do this by itself.

A table a stop named that Postgres no longer publishes (dropped, or taken out of the publication,
since) has nothing to copy: it is set aside for good instead. It is parked (applier status shows it),
so its changes still in the stream are left out and the mirror goes on; a dropped table's Delta table
is also retired under TARGET/_retired.

Creating the copy's temporary slot waits for transactions open on the server (prepared ones too,
which are named). A table with history or change feed tables is refused: they cannot take a copy.
A run cut short (Ctrl-C, a crash) is finished by the next `applier mirror`, which copies the table.
The DSN, slot and publication come from the config, flags or APPLIER_* variables, as for mirror.""",
    )
    p.add_argument("--config", help="the mirror's YAML config (see configs/mirror.yaml and docs/config.md)")
    p.add_argument("--table", action="append", required=True, metavar="SCHEMA.TABLE",
                   help="a published table to copy again, as Postgres names it now, as the mirror knew it (the "
                   "name a stop gave, if it was renamed since), or by relation OID (repeatable)")
    p.add_argument("--dsn", help="libpq connection string (prefer APPLIER_DSN: command lines are visible)")
    p.add_argument("--publication", help="the mirror's publication (overrides source.publication)")
    p.add_argument("--slot", help="the mirror's slot (overrides source.slot)")
    p.add_argument("--target", help="the mirror's target directory (overrides target.path)")
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace) -> MirrorConfig:
    cfg: MirrorConfig = load_config(args.config, MirrorConfig, overrides={
        "source.dsn": (args.dsn, "--dsn"),
        "source.publication": (args.publication, "--publication"),
        "source.slot": (args.slot, "--slot"),
        "target.path": (args.target, "--target"),
    })
    return cfg


def run(args: argparse.Namespace) -> int:
    import psycopg

    from applier.drivers.resync import choose_tables, require_mirror
    from applier.drivers.resync_mirror import resync
    from applier.drivers.writer import target_writer
    from applier.sources.dsn import check_connection
    from applier.sources.publication import check_publication
    from applier.spark.session import build_spark_session_for

    cfg = config_from_args(args)
    with target_writer(cfg.target.path, cfg.target.state_dir, command="resync",
                       mended=[t for t in args.table if not t.isdigit()]):
        dsn = cfg.source.resolved_dsn()
        check_connection(dsn)  # before Spark starts, as for mirror: a wrong DSN, publication or table is exit 2/3
        check_publication(dsn, cfg.source.publication)
        with psycopg.connect(dsn, autocommit=True) as conn:
            choose_tables(conn, cfg, list(args.table), gone={})  # (a relation dropped since is set aside)
        require_mirror(cfg)
        spark = build_spark_session_for(cfg.spark_config(), (cfg.target.path,))
        copied = resync(spark, cfg, list(args.table), progress=progress("resync"))
    for name, rows in copied.items():
        print(f"resync: {name}: {rows} rows copied; run `applier mirror` to follow it from the stream")
    return 0
