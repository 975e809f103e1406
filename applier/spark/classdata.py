"""A class data archive for the driver JVM applier launches, so that Spark starts in half the time.

A local SparkSession's JVM spends most of its start loading and verifying Spark's classes (about
20,000 of them before the first Delta commit). Java 17 can map them from an archive written by an
earlier run (AppCDS, ``-XX:ArchiveClassesAtExit`` / ``-XX:SharedArchiveFile``). ``applier setup``
writes one into the cache by running a small Delta workload once; every later JVM applier launches
maps it (bench/RESULTS.md "JVM start": Spark's start and a first MERGE measured with and without).

The archive is only valid for the JVM, pyspark and jar class path it was written with: its name
carries a key of those, and the JVM itself refuses an archive that does not match (``-Xshare:auto``:
it then loads classes as usual, silently). Not used when the JVM is spark-submit's.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

#: the JVM's notes about the archive (e.g. "Unable to use shared archive" after a JDK upgrade) stay off
#: stderr: a refused archive only means the classes load the usual way
_QUIET = "-Xshare:auto -Xlog:cds=off -Xlog:cds+dynamic=off"


def _java_identity() -> str:
    """The java binary pyspark will launch (JAVA_HOME's, else the one on PATH), by path and mtime:
    a JDK upgrade gives the archive a new name without running ``java -version`` on every start."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java") or "java"
    try:
        real = os.path.realpath(java)
        return f"{real}:{os.stat(real).st_mtime_ns}"
    except OSError:
        return java


def archive_path(cache_dir: Path) -> Path:
    """Where the archive for this JVM and pyspark lives in the cache."""
    import pyspark

    key = hashlib.sha256(f"{_java_identity()}|{pyspark.__version__}|{pyspark.__file__}".encode()).hexdigest()[:16]
    return cache_dir / "spark" / f"classes-{key}.jsa"


def archive_options(cache_dir: Path) -> str:
    """The driver JVM options that map the archive, or '' when there is none (or APPLIER_CLASS_ARCHIVE=off)."""
    if os.environ.get("APPLIER_CLASS_ARCHIVE", "").lower() in ("off", "0", "false", "no"):
        return ""
    path = archive_path(cache_dir)
    return f"-XX:SharedArchiveFile={path} {_QUIET}" if path.is_file() else ""


def write_archive(cache_dir: Path) -> Path:
    """Write the archive (replacing an older one for the same key) by running ``applier.spark.warmup`` in a
    JVM that dumps the classes it loaded when it exits. Takes about as long as one mirror run's Spark start
    and first MERGE; a process killed meanwhile leaves no archive behind, only a temporary file."""
    path = archive_path(cache_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    env = {**os.environ, "APPLIER_CLASS_ARCHIVE": "off", "APPLIER_CACHE_DIR": str(cache_dir)}
    done = subprocess.run([sys.executable, "-m", "applier.spark.warmup", str(tmp)], env=env,
                          capture_output=True, text=True)
    if done.returncode != 0 or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"writing the JVM class archive failed (exit {done.returncode}): {done.stderr[-2000:]}")
    os.replace(tmp, path)
    for old in path.parent.glob("classes-*.jsa*"):  # archives of an earlier JDK or pyspark, stale temporaries
        if old != path and not old.name.endswith(f".tmp{os.getpid()}"):
            old.unlink(missing_ok=True)
    return path
