"""``applier verify``: compare mirrored Delta tables with their PostgreSQL tables."""

from __future__ import annotations

import argparse
import logging

from applier.commands.exitcodes import ExitCode


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "verify",
        help="compare each mirrored Delta table with Postgres; exit 1 when any differs",
        description="For every Delta table under TARGET/<schema>/<table> (with --config: every table "
        "of the config's publications that it selects, where its rules put it, on the columns and rows "
        "it mirrors: column lists and row filters), compare its rows with the Postgres table of the same "
        "name: row counts and an order-independent checksum of canonical "
        "values (Postgres values go through the same conversion as replicated ones). On a mismatch, "
        "rows found on one side only are listed. The DSN comes from --dsn, the config, $APPLIER_DSN "
        "or libpq's PGHOST/PGSERVICE variables, and is never printed. Exit 0: all equal; 1: some "
        "differ (a Delta table whose Postgres table was renamed, moved or dropped since the mirror last ran is one "
        "that differs); 2: a bad flag, config or DSN; 3: Postgres cannot be reached or refuses the login.",
    )
    p.add_argument("--config", help="a mirror config (configs/mirror.yaml): its DSN, target and table selection")
    p.add_argument("--dsn", help="libpq connection string (default: the config's, or $APPLIER_DSN)")
    p.add_argument("--target", help="directory (or s3://, gs://, abfss:// URI) of the mirrored Delta tables")
    p.add_argument("--table", action="append", help="only this schema.table (repeatable)")
    p.add_argument("--special-values", choices=["error", "clamp", "null"],
                   help="the special-value policy the mirror was written with (default: the config's "
                   "apply.special_values, else error); Postgres values are converted under it before comparing")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import psycopg

    from applier.api import plan_verify, verify_plan
    from applier.errors import ConfigError
    from applier.spark.session import SparkProvider, SparkSettings, build_spark_session

    # DSN parsed and connected before Spark starts: unreachable or unparsable -> exit 3 or 2, one line.
    plan = plan_verify(args.config, dsn=args.dsn, target=args.target, tables=args.table or (),
                       special_values=args.special_values)
    # Spark only for a table delta-rs cannot read (or a catalog name): most runs start no JVM
    spark = SparkProvider(lambda: build_spark_session(SparkSettings(locations=(plan.target,))))
    try:
        results = verify_plan(spark, plan)
        if plan.publication is not None and not plan.only:  # tables the config no longer publishes under their name
            from applier.checks.verify import unfollowed_tables

            with psycopg.connect(plan.dsn, autocommit=True) as conn:
                results += unfollowed_tables(spark, conn, plan.target, plan.publication, plan.settings)
    except psycopg.errors.InsufficientPrivilege as e:  # a restart cures nothing, and it is no bug: exit 2
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        table = message.rpartition(" for table ")[2] if " for table " in message else "the table"
        raise ConfigError(
            f"the role verify connects as cannot read a mirrored table ({message}): verify reads every mirrored "
            f"table from Postgres. Grant it as the table's owner (GRANT SELECT ON {table} TO <role>), connect as a "
            "role that can read it, or verify the other tables only (--table)", sqlstate=e.sqlstate) from None
    bad = 0
    for r in results:
        state = "equal" if r.equal else "DIFFERENT"
        print(f"{r.source_name}: postgres {r.source_rows} rows, delta {r.target_rows} rows: {state}")
        if not r.equal:
            bad += 1
            for problem in r.problems:
                print(f"  {problem}")
            for row in r.only_in_source:  # '' is a row of a table without columns
                print(f"  only in postgres: {row.replace(chr(31), ' | ') or '(a row without columns)'}")
            for row in r.only_in_target:
                print(f"  only in delta:    {row.replace(chr(31), ' | ') or '(a row without columns)'}")
    if bad:
        logging.getLogger("applier.verify").warning("%d of %d tables differ", bad, len(results))
        if plan.publication is not None:  # a publication that leaves changes out explains every difference
            from applier.sources.publication import partial_publication_note

            with psycopg.connect(plan.dsn, autocommit=True) as conn:
                partial = partial_publication_note(conn, plan.publication)
            if partial is not None:
                print(f"why: {partial}")
        return ExitCode.DIFFERENCES
    return ExitCode.OK
