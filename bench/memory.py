"""Peak memory figures the benchmarks report (issue 7: Python RSS and JVM heap for each), and the
Spark session of a benchmark's own process."""

from __future__ import annotations

import gc
import os
import resource
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from applier.spark.session import SparkSettings


def peak_rss_mb(pid: int | str = "self") -> float | None:
    """A process's peak resident set: VmHWM of its own address space (None when it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (a mirror's JVM, for its peak RSS)."""
    from pathlib import Path

    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def python_peak_rss_mb() -> float:
    """This process's peak resident set. Not getrusage's ru_maxrss, which Linux carries over from the
    parent through fork and exec (a mode started by a parent that had loaded the raw log reported
    the parent's 547 MB); that is only the fallback where /proc is missing."""
    own = peak_rss_mb()
    return own if own is not None else round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def jvm_peak_heap_mb(spark: Any) -> float:
    """The driver JVM's peak heap: the sum of its heap pools' peak usage (an upper bound: pools peak
    at different moments)."""
    pools = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getMemoryPoolMXBeans()
    heap = sum(p.getPeakUsage().getUsed() for p in pools if str(p.getType().toString()) == "Heap memory")
    return round(heap / 2**20, 1)


def spark_settings(**settings: Any) -> SparkSettings:
    """``SparkSettings(**settings)`` with the JIT the CLI takes from the environment: with
    ``APPLIER_SPARK__JIT=quick`` (which the test suite sets, tests/conftest.py) the benchmark's own JVM
    compiles with C1 only, as the mirrors it starts do; a fresh JVM then costs about half as much, which
    is most of what the smoke runs (tests/scenario/test_bench_smoke.py) take."""
    from applier.spark.session import SparkSettings

    return SparkSettings(quick_jit=os.environ.get("APPLIER_SPARK__JIT", "").lower() == "quick", **settings)


class GcTimer:
    """Seconds the cyclic garbage collector ran while it was installed, per generation: a catch-up
    makes millions of objects, and a full collection walks every one the process holds."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self.collections = [0, 0, 0]
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds[info["generation"]] += time.perf_counter() - self._started
            self.collections[info["generation"]] += 1

    def __enter__(self) -> GcTimer:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *_exc: object) -> None:
        gc.callbacks.remove(self)


def mirror_once_measured(config: str, dsn: str, locations: tuple[str, ...] = ()) -> dict[str, object]:
    """(In a benchmark's child process) ``applier mirror --config CONFIG --once`` in a process whose
    Spark session is already up: its exit code and seconds, the Spark start-up apart, peak memory, and
    the garbage collector's seconds in it."""

    from applier.cli import main
    from applier.spark.session import build_spark_session

    os.environ["APPLIER_DSN"] = dsn
    started = time.monotonic()
    spark = build_spark_session(spark_settings(locations=locations))
    startup = time.monotonic() - started
    started = time.monotonic()
    with GcTimer() as gc_timer:
        code = main(["mirror", "--config", config, "--once"])
    seconds = time.monotonic() - started
    return {"exit": code, "seconds": seconds, "spark_startup_seconds": startup,
            "gc_seconds": round(sum(gc_timer.seconds), 3), "gc_full_collections": gc_timer.collections[2],
            "python_peak_rss_mb": python_peak_rss_mb(), "jvm_peak_heap_mb": jvm_peak_heap_mb(spark)}
