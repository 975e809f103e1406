"""A command's stderr is for the user (issue 34, item on quiet stderr): starting Spark used to print
five lines of JVM and Spark chatter (incubator modules, NativeCodeLoader, the default log4j profile,
the default log level) before applier's own lines, and pyspark logged every SQL error it raised as a
JSON line with the JVM stack. Run in a fresh interpreter, so that this test's JVM is launched the
way a command launches it; what the JVM writes to stderr for real must still come through."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark]

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys
from applier.infra.redact import register
from applier.spark.session import build_spark_session
register("postgresql://mirror:s3cret-pw@db.example/app")
spark = build_spark_session()
assert spark.range(5).count() == 5
try:
    spark.sql("SELECT * FROM no_such_table")
except Exception as e:
    print("raised", type(e).__name__)
args = spark._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments()
print("archive" if any(str(a).startswith("-XX:SharedArchiveFile=") for a in args) else "no-archive")
spark._jvm.java.lang.System.err.println("a line the JVM writes to stderr")
spark._jvm.java.lang.System.err.println("failed on postgresql://mirror:s3cret-pw@db.example/app")
spark.stop()
"""


def test_starting_spark_leaves_stderr_to_what_matters(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_SUBMIT_ARGS", "PYSPARK_GATEWAY_PORT")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the JVM maps the class archive `applier setup` wrote (applier.spark.classdata), and says nothing of it
    from applier.infra.cache import default_cache_dir
    from applier.spark.classdata import archive_path

    archived = archive_path(default_cache_dir()).is_file()
    assert archived or os.environ.get("CI") != "true", "setup wrote no JVM class archive"
    assert proc.stdout.split() == ["raised", "AnalysisException", "archive" if archived else "no-archive"], proc.stdout
    lines = proc.stderr.splitlines()
    assert lines[0] == "a line the JVM writes to stderr" and len(lines) == 2, proc.stderr[-3000:]
    assert lines[1].startswith("failed on ") and "s3cret-pw" not in proc.stderr, lines  # masked like our own lines
