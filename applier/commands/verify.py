"""``applier verify``: compare mirrored Delta tables with their PostgreSQL tables."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import cast

import psycopg

from applier.errors import ConfigError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "verify",
        help="compare each mirrored Delta table with Postgres; exit 1 when any differs",
        description="For every Delta table under TARGET/<schema>/<table> (with --config: every table "
        "of the config's publication that it selects, where its rules put it, on the columns it "
        "mirrors), compare its rows with the Postgres table of the same name: row counts and an "
        "order-independent checksum of canonical "
        "values (Postgres values go through the same conversion as replicated ones). On a mismatch, "
        "rows found on one side only are listed. The DSN comes from --dsn or $APPLIER_DSN and is "
        "never printed.",
    )
    p.add_argument("--config", help="a mirror config (configs/mirror.yaml): its DSN, target and table selection")
    p.add_argument("--dsn", help="libpq connection string (default: $APPLIER_DSN)")
    p.add_argument("--target", help="directory of the mirrored Delta tables")
    p.add_argument("--table", action="append", help="only this schema.table (repeatable)")
    p.add_argument("--special-values", choices=["error", "clamp", "null"],
                   help="the special-value policy the mirror was written with (default: the config's "
                   "apply.special_values, else error); Postgres values are converted under it before comparing")
    p.set_defaults(func=run)


def mirrored_tables(target: Path) -> list[tuple[str, str]]:
    """(schema, table) of each Delta table in the TARGET/<schema>/<table> layout."""
    from applier.sink.naming import mirrored_table_dirs, source_name_of

    return [source_name_of(d) for d in mirrored_table_dirs(target)]


def run(args: argparse.Namespace) -> int:
    from applier.checks.verify import verify_against_postgres
    from applier.spark.session import build_spark_session
    from applier.values import SpecialValuePolicy

    settings, publication = None, None
    policy: SpecialValuePolicy = "error"
    if args.config:
        from applier.config import MirrorConfig, load_config

        cfg: MirrorConfig = load_config(args.config, MirrorConfig)
        dsn = args.dsn or cfg.source.resolved_dsn()
        target = Path(args.target or cfg.target.path)
        settings, publication, policy = cfg.tables, cfg.source.publication, cfg.apply.special_values
    else:
        dsn = args.dsn or os.environ.get("APPLIER_DSN")
        if not dsn:
            raise ConfigError("no DSN: pass --dsn, set APPLIER_DSN, or give --config")
        if not args.target:
            raise ConfigError("no target: pass --target or --config")
        target = Path(args.target)
    with psycopg.connect(dsn, autocommit=True) as conn:
        if publication is not None:  # the config's tables, wherever its rules put them
            from applier.sources.publication import published_selection

            tables = [(t.namespace, t.name) for t in published_selection(conn, publication, settings)]
        else:
            tables = mirrored_tables(target)
        if args.table:
            tables = [t for t in tables if f"{t[0]}.{t[1]}" in set(args.table)]
        if not tables:
            raise ConfigError("no mirrored Delta tables found", target=str(target))
        spark = build_spark_session()
        results = verify_against_postgres(spark, conn, str(target), tables, settings, publication,
                                          policy=cast("SpecialValuePolicy", args.special_values or policy))
    bad = 0
    for r in results:
        state = "equal" if r.equal else "DIFFERENT"
        print(f"{r.source_name}: postgres {r.source_rows} rows, delta {r.target_rows} rows: {state}")
        if not r.equal:
            bad += 1
            for row in r.only_in_source:
                print(f"  only in postgres: {row.replace(chr(31), ' | ')}")
            for row in r.only_in_target:
                print(f"  only in delta:    {row.replace(chr(31), ' | ')}")
    if bad:
        print(f"verify: {bad} of {len(results)} tables differ", file=sys.stderr)
        return 1
    return 0
