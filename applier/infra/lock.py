"""One writer per target: an exclusive ``flock`` on a file in the state directory.

Why: two runs writing the same Delta tables race on their commits (the second one crashed with an
uncaught ``ProtocolChangedException``) and on the state files. ``flock`` belongs to the open file
description, so the kernel releases it when the process exits however it exits (``kill -9``
included): a crashed run never leaves a stale lock to clean up by hand. The file itself stays; it
only holds a note of who holds the lock, for the error message.

Once the lock is held no other run can be using the state's spill directory, so spill files found
there were left by a killed run and are removed (``clear_stale_spill``). Taking the lock with what
goes with it (a lease object on an object store, the target's registry) is applier.drivers.writer's.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from applier.errors import TargetLockedError

__all__ = ["LOCK_FILE", "clear_stale_spill", "writer_lock"]

LOCK_FILE = "writer.lock"


@contextmanager
def writer_lock(directory: str | Path, what: str, *, lock_name: str = LOCK_FILE) -> Iterator[Path]:
    """Hold the exclusive writer lock of ``directory`` (created if needed) for the ``with`` body;
    raise :class:`applier.errors.TargetLockedError` at once when another process holds it."""
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
