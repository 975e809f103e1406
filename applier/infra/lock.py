"""One writer per target: an exclusive ``flock`` on a file in the state directory.

Why: two runs writing the same Delta tables race on their commits (the second one crashed with an
uncaught ``ProtocolChangedException``) and on the state files. ``flock`` belongs to the open file
description, so the kernel releases it when the process exits however it exits (``kill -9``
included): a crashed run never leaves a stale lock to clean up by hand. The file itself stays; it
only holds a note of who holds the lock, for the error message.

Once the lock is held no other run can be using the state's spill directory, so spill files found
there were left by a killed run and are removed (``clear_stale_spill``).
"""

from __future__ import annotations

import fcntl
import os
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from applier.errors import ApplierError

__all__ = ["TargetLockedError", "clear_stale_spill", "location_lock", "target_writer", "writer_lock"]

LOCK_FILE = "writer.lock"


class TargetLockedError(ApplierError):
    """Another applier run holds the target (or raw log) this run would write."""


@contextmanager
def writer_lock(directory: str | Path, what: str, *, lock_name: str = LOCK_FILE) -> Iterator[Path]:
    """Hold the exclusive writer lock of ``directory`` (created if needed) for the ``with`` body;
    raise :class:`TargetLockedError` at once when another process holds it."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    path = root / lock_name
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 512, 0).decode("utf-8", "replace").strip() or "unknown"
            raise TargetLockedError(
                f"another applier run is writing to this {what}; wait for it to finish or stop it "
                "(the lock is released when that process exits, even by kill -9)",
                lock=str(path), holder=holder) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} since {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}".encode(), 0)
        yield path
    finally:
        os.close(fd)  # releases the flock


@contextmanager
def location_lock(location: str | Path, what: str, *, lock_name: str = LOCK_FILE) -> Iterator[None]:
    """One writer of ``location``: ``flock`` on ``lock_name`` in it when it is a local directory, a lease
    object (``<lock_name>.json`` beside the data, taken with put-if-absent) on an object store."""
    from applier.storage.location import is_object_store

    if is_object_store(location):
        from applier.storage.lease import store_lease
        from applier.storage.objects import ObjectStore

        with store_lease(ObjectStore(str(location)), what, key=f"{lock_name}.json"):
            yield
        return
    with writer_lock(location, what, lock_name=lock_name):
        yield


def clear_stale_spill(spill_dir: str | Path) -> int:
    """Remove the spill files a killed run left in ``spill_dir`` (call only while holding the writer
    lock); returns how many."""
    root = Path(spill_dir)
    if not root.is_dir():
        return 0
    removed = 0
    for entry in root.glob("applier-spill-*"):  # the buffer's file names (assembly/buffer.py)
        entry.unlink(missing_ok=True)
        removed += 1
    return removed


@contextmanager
def target_writer(target_path: str | Path, state_dir: str | None = None, *, command: str,
                  dry_run: bool = False) -> Iterator[None]:
    """Be the only writer of a target (``replay``, ``mirror``): hold the lock in its state
    directory, remove the spill files a killed run left there, and check that every table earlier
    runs wrote is still there and still the same Delta table (sink/registry.py); the tables are
    remembered again when the body ends, even by an error. A dry run writes nothing and takes no lock.

    Every entry point that writes a target opens this first: the commands (and so the spark-submit
    jobs), the Python API (``applier.replay``, ``applier.mirror``) and the foreachBatch sink
    (``DeltaApplySink``, for the streaming query's life), so that their guarantees are the same."""
    from applier.checks.writable import check_writable_directory
    from applier.sink.registry import TargetRegistry
    from applier.state import StateDir
    from applier.storage.lease import store_lease
    from applier.storage.location import is_object_store
    from applier.storage.objects import ObjectStore

    if dry_run:
        yield
        return
    # a file or a read-only mount is a mistake to fix (exit 2), found before the lock, the server and Spark
    check_writable_directory(target_path, "target.path (--target)")
    state = StateDir.for_target(target_path, state_dir)
    if state_dir is not None or is_object_store(target_path):
        check_writable_directory(state.root, "target.state_dir")
    with ExitStack() as held:
        if is_object_store(target_path):  # one writer across machines: a lease object beside the tables
            held.enter_context(store_lease(ObjectStore(str(target_path)), "target"))
        held.enter_context(writer_lock(state.root, "target"))
        if removed := clear_stale_spill(state.spill_dir):
            print(f"applier: removed {removed} spill file(s) left by a killed run", file=sys.stderr, flush=True)
        registry = TargetRegistry(state, target_path)
        registry.check(command)
        registry.record()
        try:
            yield
        finally:
            registry.record()
