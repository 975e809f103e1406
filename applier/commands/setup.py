"""``applier setup``: check Java, fetch the Delta jars once, write the JVM's class archive, and list the
PostgreSQL servers found."""

from __future__ import annotations

import argparse
import time

from applier.devtools.pgcluster import find_installations
from applier.errors import ConfigError
from applier.infra.cache import default_cache_dir
from applier.spark.classdata import archive_path, write_archive
from applier.spark.jars import CONNECTORS, check_java, connector_jars, delta_jars


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "setup",
        help="check Java, fetch the Delta jars into the local cache, list PostgreSQL servers",
        description="Prepare this machine: checks Java (Spark 4 needs 17+), fetches the Delta Lake jars "
        "from Maven Central once into the cache ($APPLIER_CACHE_DIR, default the checkout's .cache or "
        "~/.cache/applier) so that later runs work offline, and lists the PostgreSQL server binaries "
        "the demo and tests can start. It also writes a class data archive of Spark's classes into the "
        "cache (once, ~200 MB) that the JVMs applier launches map, which halves Spark's start. Set "
        "APPLIER_DELTA_JARS=provided when your cluster already has Delta, or to a directory of jars for "
        "offline machines.",
    )
    p.add_argument("--print-jars", action="store_true",
                   help="print only the Delta jars, comma-separated, for --jars of spark-submit or "
                   "spark-pipelines (fetched first if needed; empty when APPLIER_DELTA_JARS=provided)")
    p.add_argument("--connectors", default="s3", metavar="LIST",
                   help="Hadoop file system connectors to fetch for Spark, comma-separated: s3 (hadoop-aws and the "
                   "AWS SDK bundle, ~690 MB; the default), azure (hadoop-azure), gcs (hadoop-gcp), or none. Only a "
                   "run whose target or log is on that store puts them on Spark's classpath (docs/object-storage.md)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.print_jars:
        print(",".join(str(j) for j in delta_jars(default_cache_dir())))
        return 0
    print(f"java: {check_java()}")
    cache = default_cache_dir()
    jars = delta_jars(cache)
    print(f"delta jars: {len(jars)} in {jars[0].parent if jars else '(provided by the environment)'}")
    if jars:  # a local Spark of ours: the archive its JVM maps (applier.spark.classdata)
        archive = archive_path(cache)
        if archive.is_file():
            print(f"jvm class archive: {archive}")
        else:
            started = time.monotonic()
            write_archive(cache)
            print(f"jvm class archive: {archive} (written in {time.monotonic() - started:.0f} s)")
    wanted = {c.strip() for c in args.connectors.split(",") if c.strip() and c.strip() != "none"}
    if jars and wanted:  # APPLIER_DELTA_JARS set: the environment provides its connectors as well
        unknown = wanted - set(CONNECTORS)
        if unknown:
            raise ConfigError(f"--connectors: unknown {', '.join(sorted(unknown))}; choose from "
                              f"{', '.join(sorted(CONNECTORS))} or none")
        connectors = connector_jars(cache, wanted, log=print)
        print(f"spark connectors ({', '.join(sorted(wanted))}): {len(connectors)} jars in {cache / 'jars'}")
    installs = find_installations(cache)
    for inst in installs:
        print(f"postgresql {inst.major}: {inst.bindir} ({inst.origin})")
    if not installs:
        print("postgresql: none found (the demo needs one unless you pass --dsn)")
    return 0
