"""Peak memory figures the benchmarks report (issue 7: Python RSS and JVM heap for each)."""

from __future__ import annotations

import resource
from typing import Any


def python_peak_rss_mb() -> float:
    """This process's peak resident set (getrusage; Linux reports KiB)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def jvm_peak_heap_mb(spark: Any) -> float:
    """The driver JVM's peak heap: the sum of its heap pools' peak usage (an upper bound: pools peak
    at different moments)."""
    pools = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getMemoryPoolMXBeans()
    heap = sum(p.getPeakUsage().getUsed() for p in pools if str(p.getType().toString()) == "Heap memory")
    return round(heap / 2**20, 1)
