"""Spark's start-up chatter kept off the user's stderr.

A local SparkSession's JVM used to open every command's stderr with five lines that are not about
the user's data: the JVM's ``WARNING: Using incubator modules``, Hadoop's ``NativeCodeLoader``
warning, and three lines Spark prints when it falls back to its default log4j profile. applier's own
log lines came after them, and users learned to ignore stderr, which is where errors go.

Two parts: a log4j2 configuration of our own (written once into the cache, handed to the driver JVM
with ``-Dlog4j2.configurationFile``) that logs Spark's errors and nothing below, in the format of
applier's lines; and, while pyspark launches the JVM, its stderr taken through a pipe whose reader
drops the JVM's fixed start-up notices and passes every other line on, for the JVM's whole life
(a JVM crash or an error still reaches the user), scrubbed of the secrets applier masks in its own
lines (a DSN, a password) like everything else on stderr. Not used when the JVM already runs (spark-submit):
then the launcher's settings are the user's.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from applier.infra.redact import scrub

LOG4J2_PROPERTIES = """\
# written by applier (applier/spark/quiet.py): Spark's errors only, on stderr
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yyyy-MM-dd'T'HH:mm:ss.SSS'Z'}{UTC} %p spark.%c{1}: %m%n%ex
"""

#: lines the JVM prints on every start that say nothing about the run
JVM_NOTICES = (b"WARNING: Using incubator modules", b'Setting default log level to "',
               b"To adjust logging level use sc.setLogLevel(newLevel)")


def quiet_python_side() -> None:
    """pyspark logs every SQL error it raises, as a JSON line with the JVM stack, before raising it;
    applier reports the errors that stop a run itself (and some it expects, e.g. a path that is not a
    Delta table yet, are not errors at all), so those loggers are turned off. The exceptions are raised
    as before."""
    from pyspark.logger import PySparkLogger

    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        PySparkLogger.getLogger(name).disabled = True


def log4j_config(cache_dir: Path) -> Path:
    """The log4j2 configuration file (written when missing or different)."""
    path = cache_dir / "spark" / "log4j2.properties"
    if not path.is_file() or path.read_text() != LOG4J2_PROPERTIES:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(LOG4J2_PROPERTIES)
        os.replace(tmp, path)
    return path


@contextmanager
def jvm_stderr_filtered() -> Iterator[None]:
    """Inside the block, file descriptor 2 is a pipe: a process started there (the JVM) keeps it as its
    stderr. A daemon thread copies what comes through to the real stderr, leaving out ``JVM_NOTICES``."""
    read_end, write_end = os.pipe()
    real = os.dup(2)
    os.dup2(write_end, 2)
    os.close(write_end)
    forwarder = threading.Thread(target=_forward, args=(read_end, real), name="applier-jvm-stderr", daemon=True)
    forwarder.start()
    try:
        yield
    finally:
        os.dup2(real, 2)  # the pipe's write end now lives only in the JVM: it closes when the JVM ends


def _forward(read_end: int, real: int) -> None:
    with os.fdopen(read_end, "rb", buffering=0) as pipe:
        pending = b""
        while chunk := pipe.read(65536):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            out = b"".join(line + b"\n" for line in lines if not line.startswith(JVM_NOTICES))
            if out:
                os.write(real, _scrubbed(out))
        if pending and not pending.startswith(JVM_NOTICES):
            os.write(real, _scrubbed(pending))
    os.close(real)


def _scrubbed(data: bytes) -> bytes:
    return scrub(data.decode("utf-8", "replace")).encode("utf-8")
