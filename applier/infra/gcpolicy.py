"""Garbage collection in the apply loops (replay, mirror): once per applied group, not automatically.

A group keeps up to millions of small objects alive until it is applied (decoded messages, row
tuples, fold entries). CPython's automatic collector is triggered by allocations and scans the
live objects again and again while they accumulate, which cost about half of the Python time of a
one-million-change catch-up (bench/catchup.py: 17.8 s -> 7.5 s to decode and assemble it, fold
5.9 s -> 3.4 s). Those objects form no reference cycles and are freed by reference counting as
soon as the group is applied, so the loops switch the automatic collector off and collect once
after each group instead, when the group's objects are gone and little is left to scan.

What survives a collection is frozen out of the next ones (``gc.freeze``): the modules, the Spark
gateway, the loop's caches. A full collection of this process scans about 70k objects and takes
50 ms of CPU on the standard machine, 150 ms or more beside a busy database; made after every group
of a following mirror, it was most of a small group's commit (bench/follow.py's drain). Cycles that
form later among frozen objects are swept by a full collection every ``SWEEP_SECONDS``.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from contextlib import contextmanager

#: how often a collection after a group also sweeps what the earlier ones froze
SWEEP_SECONDS = 60.0


class _Sweep:
    """When the next full sweep is due: process-wide, as the collector's own state is."""

    due = 0.0


@contextmanager
def collect_between_groups() -> Iterator[None]:
    """Within the block the collector runs only when ``after_group()`` is called.

    A block inside another (a follower's catch-up round, inside the mirror's loop) freezes what exists
    when it begins, and leaves the freezing to the outer block at its end: its end unfroze what the
    outer block had frozen, the modules included, and every later collection of the loop scanned the
    whole heap again."""
    if not gc.isenabled():  # inside a block already (or the collector is off for another reason)
        gc.freeze()
        yield
        return
    gc.freeze()
    gc.disable()
    _Sweep.due = time.monotonic() + SWEEP_SECONDS
    try:
        yield
    finally:
        gc.unfreeze()
        gc.enable()


def after_group() -> None:
    """Collect the cyclic garbage the group left behind (exceptions with tracebacks, Spark handles),
    then freeze what survived; every ``SWEEP_SECONDS``, sweep the frozen objects too."""
    if gc.isenabled():
        return
    now = time.monotonic()
    if now >= _Sweep.due:
        gc.unfreeze()
        _Sweep.due = now + SWEEP_SECONDS
    gc.collect()
    gc.freeze()
