"""Delta commit conflicts with a concurrent writer (an OPTIMIZE, a VACUUM-less compaction job, another
writer of the same table) are retried: the applier's writes are idempotent (txnAppId/txnVersion), so
running a conflicted MERGE again is exactly right, and a conflict means nothing was committed."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import TypeVar

from applier.errors import SinkError

log = logging.getLogger(__name__)

T = TypeVar("T")


def _conflict_types() -> tuple[type[BaseException], ...]:
    """delta-rs's failed commit (its conflict checker found that a concurrent commit removed files this
    one read, e.g. an OPTIMIZE) and, where pyspark is loaded (a Spark commit can run only there),
    Delta's conflict exceptions of Spark's commits. A run whose tables delta-rs writes never imports
    pyspark for them."""
    from applier.sink.store.deltars import commit_failed_error

    if sys.modules.get("pyspark") is None:
        return (commit_failed_error(),)
    import delta.exceptions as dx  # also installs Delta's conversion of the JVM exceptions

    return (*(getattr(dx, name) for name in dx.__all__), commit_failed_error())


def retry_on_conflict(write: Callable[[], T], *, table: str, attempts: int = 6, first_delay: float = 0.5,
                      sleep: Callable[[float], None] = time.sleep) -> T:
    """Run ``write``; after a Delta commit conflict run it again with backoff (0.5 s doubling), up to
    ``attempts`` times, then stop with a SinkError that says what conflicted."""
    conflicts = _conflict_types()
    for attempt in range(1, attempts + 1):
        try:
            return write()
        except conflicts as e:
            kind = type(e).__name__
            if attempt == attempts:
                raise SinkError(f"Delta commit conflict persisted after {attempts} attempts ({kind}): another "
                                "writer keeps changing the table; pause it (e.g. a scheduled OPTIMIZE) and "
                                "run again", table=table) from None
            delay = first_delay * 2 ** (attempt - 1)
            log.warning("%s: Delta commit conflict with a concurrent writer (%s); retrying in %.1fs "
                        "(attempt %d of %d)", table, kind, delay, attempt, attempts)
            sleep(delay)
    raise AssertionError("unreachable")
