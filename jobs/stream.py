"""spark-submit entry point: Structured Streaming from a slot (or a stored raw log) into Delta tables.

    APPLIER_DSN='host=... dbname=...' spark-submit --packages io.delta:delta-spark_4.2_2.13:4.4.0 \
        jobs/stream.py --slot applier --publication applier --target /lake/mirror \
        --checkpoint /lake/_checkpoints/mirror

    spark-submit ... jobs/stream.py --raw-log /lake/raw-log --target /lake/mirror --checkpoint ... --once

The source is ``spark.readStream.format("pgoutput")`` (offsets are LSNs; the slot advances only
when a batch is committed) or a Delta raw log written by ``applier capture``; the sink is
``applier.drivers.streaming.DeltaApplySink`` through ``foreachBatch``. Restart with the same checkpoint
after any failure: batches are re-applied idempotently.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

try:
    from applier.commands.exitcodes import ExitCode, for_exception
    from applier.commands.logsetup import add_logging_arguments, configure_from
    from applier.errors import ApplierError, ConfigError
except ModuleNotFoundError as missing:  # spark-submit started the driver with a Python that lacks applier
    if missing.name is None or missing.name.split(".")[0] != "applier":
        raise
    print(f"jobs/stream.py: {sys.executable} has no applier (No module named {missing.name!r}). spark-submit runs "
          "the driver with $PYSPARK_DRIVER_PYTHON, else $PYSPARK_PYTHON, else python3 from PATH: set PYSPARK_PYTHON "
          "to the Python applier is installed in (PYSPARK_PYTHON=/path/to/.venv/bin/python spark-submit ...), or "
          "activate that venv first", file=sys.stderr)
    sys.exit(2)  # as for Java or the Delta jars missing: this machine's setup, not the data


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="jobs/stream.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--slot", help="read this logical slot through the pgoutput data source")
    src.add_argument("--raw-log", help="read this Delta raw log (applier capture) as a stream")
    p.add_argument("--dsn", default=os.environ.get("APPLIER_DSN"),
                   help="libpq connection string (with --slot; default $APPLIER_DSN; keep passwords in "
                        "PGPASSFILE or PGPASSWORD, not here)")
    p.add_argument("--publication", default="applier", help="publication (with --slot)")
    p.add_argument("--target", required=True, help="directory of the Delta tables")
    p.add_argument("--checkpoint", required=True, help="Structured Streaming checkpoint directory")
    p.add_argument("--once", action="store_true", help="process what is available now, then stop")
    p.add_argument("--interval", default="10 seconds", help="trigger interval when running continuously")
    p.add_argument("--metrics-port", type=int, metavar="PORT", default=None,
                   help="serve Prometheus metrics at http://HOST:PORT/metrics (transactions, rows per table, "
                        "batch apply time, lag seconds) and /healthz while the query runs; 0: a free port, logged")
    p.add_argument("--metrics-host", metavar="HOST", default="127.0.0.1",
                   help="the address the metrics server listens on (default 127.0.0.1, this machine only: the "
                        "endpoints have no authentication; 0.0.0.0 opens them to every interface)")
    add_logging_arguments(p)  # -v, -q, --log-level, --log-format: the same as `applier`
    return p.parse_args(argv)


def build_query(spark, args: argparse.Namespace, metrics=None):  # type: ignore[no-untyped-def]
    """The streaming query (not started): source -> foreachBatch(DeltaApplySink)."""
    from applier.drivers.streaming import DeltaApplySink
    from applier.sources.spark_datasource import register_pgoutput_source

    if args.slot:
        if not args.dsn:
            raise ConfigError("--slot needs --dsn or APPLIER_DSN")
        from applier.infra.redact import register

        register(args.dsn)  # masked in every log line and error this process prints
        register_pgoutput_source(spark)
        raw = (spark.readStream.format("pgoutput").option("dsn", args.dsn).option("slot", args.slot)
               .option("publication", args.publication).load())
    else:
        raw = spark.readStream.format("delta").option("maxFilesPerTrigger", 50).load(args.raw_log)
    sink = DeltaApplySink(args.target, metrics=metrics)
    writer = raw.writeStream.foreachBatch(sink).option("checkpointLocation", args.checkpoint)
    # --once drains with processAllAvailable() rather than trigger(availableNow): the Python data
    # source does not take part in availableNow's admission control.
    return writer.trigger(processingTime="1 second" if args.once else args.interval)


def run(spark, args: argparse.Namespace) -> int:  # type: ignore[no-untyped-def]
    """Start the query; with --once stop when everything available is applied. 3 on failure (the
    query's error is logged; restart with the same checkpoint)."""
    from pyspark.errors import StreamingQueryException

    server = None
    if getattr(args, "metrics_port", None) is not None:
        from applier.infra.metrics import serve_metrics

        server = serve_metrics(args.metrics_port, getattr(args, "metrics_host", "127.0.0.1"),
                               logging.getLogger("applier.stream").info)
    query = build_query(spark, args, server.metrics if server is not None else None).start()
    try:
        if args.once:
            query.processAllAvailable()
        else:
            query.awaitTermination()
    except (KeyboardInterrupt, StreamingQueryException):
        pass  # the failure is reported below from query.exception()
    finally:
        query.stop()
        if server is not None:
            server.close()
    error = query.exception()
    if error is not None:
        logging.getLogger("applier.stream").error("the query failed: %s", error)
        return ExitCode.UNAVAILABLE
    return ExitCode.OK


def main(argv: list[str]) -> int:
    # Under spark-submit the Delta jars come from --packages or the cluster. Set here, not at import:
    # importing this module (the tests do) must not change how other Spark sessions find their jars.
    os.environ.setdefault("APPLIER_DELTA_JARS", "provided")
    # The pgoutput source runs in Spark's Python workers, which must import applier too: build_spark_session
    # sets PYSPARK_PYTHON to this interpreter when the caller has not chosen one, before the session starts.
    from applier.spark.session import build_spark_session

    args = parse_args(argv)
    configure_from(args)
    try:
        return run(build_spark_session(), args)
    except ApplierError as e:  # exit codes as for `applier` (applier.commands.exitcodes)
        logging.getLogger("applier.stream").error("%s", e)
        return for_exception(e)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
