"""Build the SparkSession the engine runs on: Delta extensions, local jars, quiet and deterministic.

The session is always passed in to the layers that need it (no global state); this is the one place
that decides how it is configured.

The master is set only when nobody else chose one: PySpark applies builder options over
spark-submit's, so an unconditional ``builder.master(...)`` made ``spark-submit --master spark://...``
run locally. A master already chosen by spark-submit (the driver JVM's ``spark.master``),
``PYSPARK_SUBMIT_ARGS`` (``--master`` or ``--conf spark.master=``), the ``MASTER`` environment
variable or ``spark-defaults.conf`` wins; ``spark.master`` of the config is the fallback.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
import threading
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias, Union

from applier.errors import EnvironmentSetupError
from applier.infra.cache import default_cache_dir
from applier.spark.classdata import archive_options
from applier.spark.jars import CONNECTOR_OF_SCHEME, check_java, connector_jars, delta_jars
from applier.spark.quiet import jvm_stderr_filtered, log4j_config, quiet_python_side
from applier.storage.location import OBJECT_SCHEMES, scheme_of
from applier.storage.options import spark_hadoop_conf

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from applier.config import SparkConfig


@dataclass(frozen=True, slots=True)
class SparkSettings:
    master: str | None = None  # used only when no master is set already (see preset_master); default local[2]
    app_name: str = "applier"
    shuffle_partitions: int = 2
    driver_memory: str = "2g"
    warehouse_dir: str | None = None
    ui: bool = False
    extra: Mapping[str, str] = field(default_factory=dict)
    cache_dir: Path | None = None
    # C1 only (-XX:TieredStopAtLevel=1): a JVM that lives seconds to minutes spends its CPU running,
    # not compiling with C2 (SparkConfig.jit)
    quick_jit: bool = False
    java_options: str = ""  # more driver JVM options (only when applier launches the JVM)
    # targets and logs the session must reach: an object store among them adds its Hadoop connector
    # to the jars and its settings (applier.storage.options.spark_hadoop_conf)
    locations: tuple[str, ...] = ()


DEFAULT_MASTER = "local[2]"


def _jvm_conf() -> object | None:
    """The driver JVM's SparkConf when a JVM is already running (under spark-submit), else None.

    Never starts a JVM: launching it here would fix the driver's memory and options before the
    builder's settings could reach it."""
    from pyspark import SparkConf, SparkContext

    if SparkContext._gateway is None and not os.environ.get("PYSPARK_GATEWAY_PORT"):
        return None
    SparkContext._ensure_initialized()  # attaches to spark-submit's gateway
    return SparkConf()  # loads the JVM's spark.* system properties (what spark-submit set)


def preset_master() -> str | None:
    """The master chosen outside applier's config, or None when nobody chose one (see the module docstring)."""
    from pyspark import SparkContext

    active = SparkContext._active_spark_context
    if active is not None:
        return str(active.master)
    conf = _jvm_conf()
    if conf is not None and conf.contains("spark.master"):  # type: ignore[attr-defined]  # a py4j JVM object
        return str(conf.get("spark.master"))  # type: ignore[attr-defined]  # a py4j JVM object
    args = shlex.split(os.environ.get("PYSPARK_SUBMIT_ARGS", ""))
    for i, arg in enumerate(args):
        if arg == "--master" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--master="):
            return arg.removeprefix("--master=")
        if arg == "--conf" and i + 1 < len(args) and args[i + 1].startswith("spark.master="):
            return args[i + 1].removeprefix("spark.master=")
    if os.environ.get("MASTER"):
        return os.environ["MASTER"]
    return _defaults_file_master()


def master_is_local(configured: str | None) -> bool:
    """Whether Spark's master, as it would be chosen (``configured``: the config's ``spark.master``), runs
    everything in this process's JVM (``local[...]``) rather than on a cluster's executors."""
    return (preset_master() or configured or "local[*]").startswith("local")


def _defaults_file_master() -> str | None:
    conf_dir = os.environ.get("SPARK_CONF_DIR") or (
        os.path.join(os.environ["SPARK_HOME"], "conf") if os.environ.get("SPARK_HOME") else None)
    if conf_dir is None:
        return None
    path = Path(conf_dir) / "spark-defaults.conf"
    if not path.is_file():
        return None
    for line in path.read_text(errors="replace").splitlines():
        parts = line.strip().split(None, 1)
        if len(parts) == 2 and parts[0] == "spark.master":
            return parts[1].strip()
    return None


def _launches_jvm() -> bool:
    """pyspark will start a JVM of its own (not spark-submit's, not one already running)."""
    from pyspark import SparkContext

    return SparkContext._gateway is None and not os.environ.get("PYSPARK_GATEWAY_PORT")


def _merged_jars(jars: list[Path]) -> str:
    """``spark.jars`` with the Delta jars added to what spark-submit's ``--jars`` already set (not replacing it),
    each file name once: the connectors' dependencies repeat some of Delta's (hadoop-azure's commons-logging)
    and of each other (wildfly-openssl), and Spark refuses a second file of the same name with an ERROR in
    every run's log ("already registered with a different path")."""
    conf = _jvm_conf()
    jars_set = conf.get("spark.jars", "") if conf is not None else ""  # type: ignore[attr-defined]  # py4j object
    out = [j for j in jars_set.split(",") if j]
    names = {Path(j).name for j in out}
    for jar in jars:
        if jar.name not in names:
            names.add(jar.name)
            out.append(str(jar))
    return ",".join(out)


def build_spark_session(settings: SparkSettings | None = None) -> SparkSession:
    """Start (or attach to) a SparkSession with Delta; fails with a clear error when Java or jars are missing."""
    settings = settings or SparkSettings()
    check_java()
    cache_dir = settings.cache_dir or default_cache_dir()
    jars = delta_jars(cache_dir)
    stores = {scheme for scheme in map(scheme_of, settings.locations) if scheme in OBJECT_SCHEMES}
    store_conf = spark_hadoop_conf(stores, os.environ, settings.locations)
    if stores and jars:  # APPLIER_DELTA_JARS set: the environment provides its connectors too
        jars = [*jars, *connector_jars(cache_dir, {CONNECTOR_OF_SCHEME.get(s, s) for s in stores})]
    # Spark picks a non-loopback address by default and warns; a local engine has no reason to.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Python workers (UDFs, the pgoutput data source) must see this interpreter's packages.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    preset = preset_master()
    launching = _launches_jvm()
    java_options = "-Duser.timezone=UTC"
    if launching:  # our JVM: Spark's errors only on stderr (applier.spark.quiet), not its start-up chatter
        java_options += f" -Dlog4j2.configurationFile=file:{log4j_config(cache_dir)}"
        # Spark's classes mapped from the archive `applier setup` wrote (applier.spark.classdata)
        java_options += f" {archive_options(cache_dir)}"
        if settings.quick_jit:
            # C1 alone sizes the code cache at 48 MB (against 240 MB with C2), and C1's larger code
            # fills it in a long catch-up ("Out of space in CodeCache for method handle intrinsic")
            java_options += " -XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"
        java_options = f"{java_options} {settings.java_options}".strip()
    builder = SparkSession.builder
    if preset is None:
        builder = builder.master(settings.master or DEFAULT_MASTER)
    builder = (
        builder.appName(settings.app_name)
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .config("spark.sql.shuffle.partitions", str(settings.shuffle_partitions))
        # Delta rebuilds a table's state from its log with this many tasks (default 50); on a local
        # engine that made every small MERGE of the mirror ~2.8 s instead of ~1 s (bench/lag.py).
        .config("spark.databricks.delta.snapshotPartitions", str(settings.shuffle_partitions))
        .config("spark.driver.memory", settings.driver_memory)
        .config("spark.ui.enabled", str(settings.ui).lower())
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.databricks.delta.schema.autoMerge.enabled", "false")
        .config(*PARQUET_TIMESTAMPS)
        .config("spark.driver.extraJavaOptions", java_options)
        .config("spark.executor.extraJavaOptions", "-Duser.timezone=UTC")
    )
    if jars:
        builder = builder.config("spark.jars", _merged_jars(jars))
    if settings.warehouse_dir:
        builder = builder.config("spark.sql.warehouse.dir", settings.warehouse_dir)
    for key, value in {**store_conf, **settings.extra}.items():
        builder = builder.config(key, value)
    try:
        with jvm_stderr_filtered() if launching else nullcontext():
            session = builder.getOrCreate()
    except Exception as e:  # py4j/gateway failures carry their own detail
        raise EnvironmentSetupError(f"Spark did not start: {e}") from e
    session.sparkContext.setLogLevel("ERROR")
    session.conf.set(*PARQUET_TIMESTAMPS)  # a session that ran already took no builder settings
    quiet_python_side()
    if store_conf:  # a session that ran already (a notebook's, a test's) took no builder settings
        hadoop = session.sparkContext._jsc.hadoopConfiguration()
        for key, value in store_conf.items():
            if key not in settings.extra:
                hadoop.set(key.removeprefix("spark.hadoop."), value)
    return session


def build_spark_session_for(config: SparkConfig, locations: tuple[str, ...] = ()) -> SparkSession:
    """The session a job's ``spark:`` config section describes (its master only when none is set already),
    able to reach ``locations`` (the target, the log)."""
    return build_spark_session(SparkSettings(
        master=config.master, app_name=config.app_name, shuffle_partitions=config.shuffle_partitions,
        driver_memory=config.driver_memory, extra=dict(config.conf), quick_jit=config.jit == "quick",
        locations=locations))


#: How Spark writes ``timestamp`` columns to Parquet. Its default, INT96 (nanoseconds), is what delta-rs
#: reads back as nanoseconds since 1970 in 64 bits: any instant outside 1677-2262 overflows there, and a
#: later delta-rs rewrite of the file (an update of another row, a compaction) writes the wrapped value
#: back (9999-12-31 became 1816-03-30). Microseconds hold every instant both PostgreSQL and Delta can.
PARQUET_TIMESTAMPS = ("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")


def writing_microseconds(session: SparkSession) -> SparkSession:
    """``session`` set to write timestamps as microseconds (a runtime setting: a session a caller
    started, or a new session of the run's, does not inherit it from the builder)."""
    session.conf.set(*PARQUET_TIMESTAMPS)
    return session


class SparkProvider:
    """The run's SparkSession, started on the first call of :meth:`get` (issue 31 item 2).

    A mirror whose tables delta-rs reads and writes (keyed tables, a protocol delta-rs writes,
    ``merge_engine: auto``) copies and follows without a JVM; the code paths that need Spark (a
    key-less table's MERGE, a feature delta-rs cannot write, ``merge_engine: spark``, executors, a
    catalog table name, history tables...) call ``get(why)``, which starts the session once and
    logs one line saying why. Built from a session already started (``SparkProvider.of(spark)``,
    what ``applier.mirror(spark, ...)`` callers pass), it just hands that session out.

    Thread-safe: a group's commits run side by side (applier.sink.parallel). Not global state: one
    provider is made per command run and passed in, as the session was.
    """

    def __init__(self, build: Callable[[], SparkSession] | None = None, *, session: SparkSession | None = None,
                 parent: SparkProvider | None = None,
                 on_start: Callable[[SparkSession], None] | None = None) -> None:
        if (build is None) == (session is None) and parent is None:
            raise ValueError("a SparkProvider needs exactly one of build and session")
        self._build = build
        self._session = writing_microseconds(session) if session is not None else None
        self._parent = parent
        self._on_start = on_start  # called with the session once it started, on the thread that started it
        self._lock = threading.Lock()
        self.why: str | None = None  # what started it (None: given a started session, or not started)

    @classmethod
    def of(cls, spark: SparkSession | SparkProvider) -> SparkProvider:
        """``spark`` itself when it is a provider, else a provider of that (started) session."""
        return spark if isinstance(spark, SparkProvider) else cls(session=spark)

    @classmethod
    def for_config(cls, config: SparkConfig, locations: tuple[str, ...] = ()) -> SparkProvider:
        """A provider that starts the session the job's ``spark:`` config section describes, when needed,
        able to reach ``locations`` (the target, the log: an object store adds its connector)."""
        return cls(lambda: build_spark_session_for(config, locations))

    @property
    def started(self) -> bool:
        return self._session is not None

    def if_started(self) -> SparkSession | None:
        """The session when it runs already, else None (never starts it)."""
        return self._session

    def get(self, why: str) -> SparkSession:
        """The session, started now (logging ``starting Spark: <why>``) when it is not running yet."""
        session = self._session
        if session is not None:
            return session
        with self._lock:
            if self._session is None:
                if self._parent is not None:  # a session of its own on the parent's SparkContext
                    parent = self._parent.get(why)
                    session = writing_microseconds(parent.newSession())
                else:
                    assert self._build is not None
                    logging.getLogger("applier.spark").info("starting Spark: %s", why)
                    session = self._build()
                    self.why = why
                    # Delta's conflict exceptions come through as themselves (applier.sink.conflicts
                    # retries them) only once this is imported, so before the first commit
                    import delta.exceptions  # noqa: F401
                if self._on_start is not None:
                    self._on_start(session)
                self._session = session
            return self._session

    def new_session(self, *, on_start: Callable[[SparkSession], None] | None = None) -> SparkProvider:
        """A provider of a session of its own (``SparkSession.newSession()``: own conf, shared
        SparkContext), made from this one's session only when it is asked for; ``on_start`` is called
        with it then (on the asking thread)."""
        return SparkProvider(parent=self, on_start=on_start)


#: What the engine's classes take: a started session, or a provider that starts one when needed.
SparkLike: TypeAlias = Union["SparkSession", SparkProvider]


def session_of(spark: SparkLike, why: str) -> SparkSession:
    """The session of ``spark`` (a provider starts it now, see SparkProvider.get)."""
    return spark.get(why) if isinstance(spark, SparkProvider) else writing_microseconds(spark)
