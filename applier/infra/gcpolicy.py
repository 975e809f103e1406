"""Garbage collection in the apply loops (replay, mirror): once per applied group, not automatically.

A group keeps up to millions of small objects alive until it is applied (decoded messages, row
tuples, fold entries). CPython's automatic collector is triggered by allocations and scans the
live objects again and again while they accumulate, which cost about half of the Python time of a
one-million-change catch-up (bench/catchup.py: 17.8 s -> 7.5 s to decode and assemble it, fold
5.9 s -> 3.4 s). Those objects form no reference cycles and are freed by reference counting as
soon as the group is applied, so the loops switch the automatic collector off and collect once
after each group instead, when the group's objects are gone and little is left to scan. Objects
that existed before the loop started (modules, the Spark gateway) are frozen out of those scans.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collect_between_groups() -> Iterator[None]:
    """Within the block the collector runs only when ``after_group()`` is called."""
    enabled = gc.isenabled()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.unfreeze()
        if enabled:
            gc.enable()


def after_group() -> None:
    """Collect the cyclic garbage the group left behind (exceptions with tracebacks, Spark handles)."""
    if not gc.isenabled():
        gc.collect()
