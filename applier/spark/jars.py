"""Delta Lake jars: fetched once from Maven Central into a local cache, then used offline.

Why not ``delta.configure_spark_with_delta_pip``: it makes Spark resolve ``spark.jars.packages``
through Ivy at every start, which needs the network every time, and it asks for
``delta-spark_<spark>_2.13:<pip version>``. Maven Central has no jar for delta-spark 4.4.1 (the pip
release has no matching jar release), so we try that coordinate first and then the newest jar
release that pairs with pyspark 4.2 (4.4.0); the Python API of 4.4.1 calls the same JVM classes.

Resolution runs Ivy's command line (bundled with pyspark) once; the jars land in
``<cache>/jars/<coordinate>/`` with a ``jars.txt`` manifest, and every later start passes those
files as ``spark.jars`` with no network at all. Jars that pyspark already ships (Hadoop, Parquet,
log4j, Scala...) are left out: Spark's own copies would win on the classpath anyway.

``APPLIER_DELTA_JARS`` overrides everything: ``provided`` (the cluster already has Delta on its
classpath), a directory of jars, or a comma-separated list of jar paths.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

from applier.errors import EnvironmentSetupError

SCALA_VERSION = "2.13"
#: Tried in order; the first that resolves is cached. See the module docstring for why 4.4.0.
DELTA_JAR_VERSIONS = ("4.4.1", "4.4.0")
ENV_OVERRIDE = "APPLIER_DELTA_JARS"


def _pyspark_dir() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def _spark_major_minor() -> str:
    import pyspark

    return ".".join(pyspark.__version__.split(".")[:2])


def delta_coordinates() -> list[str]:
    """Maven coordinates to try, newest first (``io.delta:delta-spark_4.2_2.13:4.4.1`` ...)."""
    artifact = f"delta-spark_{_spark_major_minor()}_{SCALA_VERSION}"
    return [f"io.delta:{artifact}:{v}" for v in DELTA_JAR_VERSIONS]


def _artifact_name(jar_name: str) -> str:
    """``hadoop-client-api-3.4.2.jar`` -> ``hadoop-client-api`` (strip version and extension)."""
    m = re.match(r"^(.*?)-\d[^-]*(?:-.*)?\.jar$", jar_name)
    return m.group(1) if m else jar_name.removesuffix(".jar")


def check_java() -> str:
    """Return ``java -version``'s first line, or raise with what to install."""
    try:
        out = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=60)
    except FileNotFoundError as e:
        raise EnvironmentSetupError(
            "Java is not installed (Spark needs Java 17 or 21): install it, e.g. "
            "'apt-get install openjdk-17-jre-headless', or set JAVA_HOME"
        ) from e
    first = (out.stderr or out.stdout).strip().splitlines()[:1]
    if out.returncode != 0 or not first:
        raise EnvironmentSetupError("'java -version' failed; check JAVA_HOME and the Java install")
    m = re.search(r'version "(\d+)', first[0])
    if m and int(m.group(1)) < 17:
        raise EnvironmentSetupError(f"Spark 4 needs Java 17 or newer, found: {first[0]}")
    return first[0]


def cached_jars(cache_dir: Path) -> list[Path] | None:
    """The jars of the first coordinate already in the cache, or None."""
    for coordinate in delta_coordinates():
        jars = _cached(cache_dir, coordinate)
        if jars is not None:
            return jars
    return None


def _resolve(cache_dir: Path, coordinate: str, log: Callable[[str], object]) -> tuple[list[Path] | None, str]:
    """Resolve ``coordinate`` and its dependencies with Ivy into ``<cache>/jars/<coordinate>/`` (jars
    pyspark ships left out) and write the ``jars.txt`` manifest; (jars, "") or (None, why not)."""
    ivy_jars = sorted(_pyspark_dir().glob("jars/ivy-*.jar"))
    if not ivy_jars:
        raise EnvironmentSetupError("pyspark's bundled Ivy jar not found; is pyspark installed?")
    shipped = {_artifact_name(p.name) for p in _pyspark_dir().glob("jars/*.jar")}
    org, artifact, version = coordinate.split(":")
    target = cache_dir / "jars" / coordinate.replace(":", "_")
    staging = target.with_name(target.name + ".partial")
    log(f"applier: fetching {coordinate} and its dependencies from Maven Central into {target}")
    proc = subprocess.run(
        ["java", "-jar", str(ivy_jars[0]), "-dependency", org, artifact, version,
         "-confs", "default", "-types", "jar", "-warn",
         "-cache", str(cache_dir / "ivy-cache"),
         "-retrieve", f"{staging}/[artifact]-[revision](-[classifier]).[ext]"],
        capture_output=True, text=True, timeout=900,
    )
    if proc.returncode != 0:
        return None, f"{coordinate}: {proc.stdout.strip()[-300:]} {proc.stderr.strip()[-300:]}"
    keep = sorted(p for p in staging.glob("*.jar") if _artifact_name(p.name) not in shipped)
    if not any(p.name.startswith(f"{artifact}-") for p in keep):
        return None, f"{coordinate}: resolution produced no {artifact} jar"
    target.mkdir(parents=True, exist_ok=True)
    for jar in keep:
        jar.replace(target / jar.name)
    (target / "jars.txt").write_text("\n".join(p.name for p in keep) + "\n")
    for leftover in staging.glob("*"):
        leftover.unlink()
    staging.rmdir()
    return [target / p.name for p in keep], ""


def _cached(cache_dir: Path, coordinate: str) -> list[Path] | None:
    manifest = cache_dir / "jars" / coordinate.replace(":", "_") / "jars.txt"
    if manifest.is_file():
        jars = [manifest.parent / line for line in manifest.read_text().split() if line]
        if jars and all(j.is_file() for j in jars):
            return jars
    return None


def fetch_delta_jars(cache_dir: Path, *, log: Callable[[str], object] = print) -> list[Path]:
    """Resolve the Delta jars from Maven Central with Ivy into the cache (needs the network once)."""
    failures: list[str] = []
    for coordinate in delta_coordinates():
        jars, why_not = _resolve(cache_dir, coordinate, log)
        if jars is not None:
            return jars
        failures.append(why_not)
    raise EnvironmentSetupError(
        "could not fetch the Delta jars from Maven Central; with no network, put the jars somewhere "
        f"and set {ENV_OVERRIDE} to that directory (or 'provided' when the cluster has them)",
        tried="; ".join(failures)[-1500:],
    )


def hadoop_version() -> str:
    """The Hadoop version pyspark ships (``hadoop-client-api-3.5.0.jar`` -> ``3.5.0``): the connectors must match it."""
    for jar in _pyspark_dir().glob("jars/hadoop-client-api-*.jar"):
        return jar.name.removeprefix("hadoop-client-api-").removesuffix(".jar")
    raise EnvironmentSetupError("pyspark's hadoop-client-api jar not found; is pyspark installed?")


#: The Hadoop file system connector of each object store (fetched with its SDK: ~690 MB for S3's bundle).
#: Hadoop 3.5 has its own GCS connector (``hadoop-gcp``, which core-default.xml already names for gs://).
CONNECTORS = {"s3": "org.apache.hadoop:hadoop-aws", "azure": "org.apache.hadoop:hadoop-azure",
              "gcs": "org.apache.hadoop:hadoop-gcp"}
#: URI scheme -> connector name
CONNECTOR_OF_SCHEME = {"s3": "s3", "s3a": "s3", "abfs": "azure", "abfss": "azure", "az": "azure", "azure": "azure",
                       "gs": "gcs", "gcs": "gcs"}


def connector_jars(cache_dir: Path, connectors: set[str], *, fetch: bool = True,
                   log: Callable[[str], object] | None = None) -> list[Path]:
    """The jars of Hadoop's connectors for ``connectors`` (``{"s3"}``), matching pyspark's Hadoop, from the
    cache (fetched once when missing); [] when ``APPLIER_DELTA_JARS`` says the environment provides jars."""
    if os.environ.get(ENV_OVERRIDE, "").strip():
        return []
    out: list[Path] = []
    for name in sorted(connectors):
        if name not in CONNECTORS:
            raise EnvironmentSetupError(f"applier does not fetch a Spark connector for {name!r}",
                                        known=", ".join(sorted(CONNECTORS)))
        coordinate = f"{CONNECTORS[name]}:{hadoop_version()}"
        jars = _cached(cache_dir, coordinate)
        if jars is None:
            if not fetch:
                raise EnvironmentSetupError(f"the Spark connector for {name} is not in the cache; run 'applier setup "
                                            f"--connectors {name}' once with network", cache_dir=str(cache_dir))
            jars, why_not = _resolve(cache_dir, coordinate, log or logging.getLogger("applier.setup").info)
            if jars is None:
                raise EnvironmentSetupError(f"could not fetch the Spark connector for {name} from Maven Central",
                                            tried=why_not[-1500:])
        out += jars
    return out


def delta_jars(cache_dir: Path, *, fetch: bool = True) -> list[Path]:
    """The Delta jar files to put on ``spark.jars`` ([] when the environment provides them)."""
    override = os.environ.get(ENV_OVERRIDE, "").strip()
    if override == "provided":
        return []
    if override:
        path = Path(override)
        jars = sorted(path.glob("*.jar")) if path.is_dir() else [Path(p) for p in override.split(",") if p]
        missing = [str(j) for j in jars if not j.is_file()]
        if not jars or missing:
            raise EnvironmentSetupError(f"{ENV_OVERRIDE} names no usable jars", missing=", ".join(missing))
        return jars
    cached = cached_jars(cache_dir)
    if cached is not None:
        return cached
    if not fetch:
        raise EnvironmentSetupError(
            "Delta jars are not in the cache; run 'applier setup' (or scripts/setup) once with network",
            cache_dir=str(cache_dir),
        )
    return fetch_delta_jars(cache_dir, log=logging.getLogger("applier.setup").info)
