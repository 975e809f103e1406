"""One writer per object-store target: a lock object taken with put-if-absent, held as a lease.

Why a lease: ``flock`` exists only on a local file system, and a lock object on a store outlives a
process killed by ``kill -9``. So the object says who holds it and until when; the holder renews it
(put-if-unchanged on its own ETag) well before it expires, and a run finding it takes it over when
the lease has expired, or at once when the holder ran on this host and its process is gone (the
crash-and-restart case needs no waiting). A holder that cannot renew (the store is unreachable, or
another run took the lock over) stops the process at once, exit 3, as a crash would: interrupting
the main thread is not enough, because a run that is interrupted (Ctrl-C) commits what it has
received before it stops, and a commit without the lock lets two writers race. A crash loses
nothing: what was committed is kept (with its ``txn`` versions) and the next run goes on from there.

``APPLIER_LEASE_SECONDS`` sets the lease (default 60; renewed every third of it): longer for a store
whose requests can stall for long, shorter to take over a crashed run on another host sooner.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from applier.errors import TargetLockedError
from applier.storage.objects import ObjectStore

__all__ = ["LOCK_KEY", "store_lease"]

log = logging.getLogger(__name__)

#: The lock object, relative to the target's URI (beside the tables, in the reserved ``_applier``).
LOCK_KEY = "_applier/writer.lock.json"
LEASE_ENV = "APPLIER_LEASE_SECONDS"
#: The exit code of a run that lost its lock (ExitCode.UNAVAILABLE: the store, or another run, took it)
_LOST_EXIT = 3


def lease_seconds_from_env() -> float:
    """``APPLIER_LEASE_SECONDS``, checked (a config error, exit 2, when it is not a number of seconds >= 3)."""
    from applier.errors import ConfigError

    text = os.environ.get(LEASE_ENV, "").strip()
    if not text:
        return 60.0
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if seconds < 3:
        raise ConfigError(f"{LEASE_ENV} must be a number of seconds, at least 3", value=text)
    return seconds


def _stop_now(reason: str) -> None:
    """End the process as a crash would, before it can commit again (see the module docstring)."""
    import sys

    print(f"applier: error: lost the writer lock ({reason}); stopped at once, as after a crash: what was "
          "committed is kept and the next run goes on from there (exit 3)", file=sys.stderr, flush=True)
    logging.shutdown()
    os._exit(_LOST_EXIT)


def _alive_here(holder: dict[str, object]) -> bool | None:
    """True/False when the holder ran on this host (its process alive or not), None when elsewhere."""
    if holder.get("host") != socket.gethostname():
        return None
    try:
        os.kill(int(str(holder.get("pid"))), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError):
        return True
    return True


@contextmanager
def store_lease(store: ObjectStore, what: str, *, lease_seconds: float | None = None, key: str = LOCK_KEY,
                clock: Callable[[], float] = time.time,
                on_lost: Callable[[str], None] | None = None) -> Iterator[dict[str, object]]:
    """Hold the writer lock object ``key`` of ``store`` for the ``with`` body (renewed in the
    background); raise TargetLockedError at once when another live run holds it."""
    lease_seconds = lease_seconds if lease_seconds is not None else lease_seconds_from_env()
    token = uuid.uuid4().hex

    def body() -> dict[str, object]:
        return {"host": socket.gethostname(), "pid": os.getpid(), "token": token,
                "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "expires": clock() + lease_seconds}

    mine = body()
    etag = store.put_if_absent(key, json.dumps(mine).encode())
    if etag is None:
        found = store.get(key)
        held: dict[str, object] = {}
        if found is not None:
            try:
                held = json.loads(found.data)
            except ValueError:
                held = {}
        alive = _alive_here(held)
        expired = float(str(held.get("expires", 0))) < clock()
        if found is None:
            etag = store.put_if_absent(key, json.dumps(mine).encode())
        elif alive is False or (alive is None and expired):
            etag = store.put_if_unchanged(key, json.dumps(mine).encode(), found.etag or "")
            if etag is not None:
                why = "its process is gone" if alive is False else "its lease expired"
                log.warning("took over the writer lock of %s from %s pid %s (%s)", store.uri, held.get("host"),
                            held.get("pid"), why)
        if etag is None:
            until = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(str(held.get("expires", 0)))))
            raise TargetLockedError(
                f"another applier run is writing to this {what}; wait for it to finish or stop it (a run that "
                f"died leaves the lock until its lease ends at {until}, or at once for a run on this host)",
                lock=f"{store.uri}/{key}", holder=f"{held.get('host')} pid {held.get('pid')} since "
                f"{held.get('since')}")
    stop = threading.Event()

    def lost(reason: str) -> None:
        log.error("lost the writer lock of %s: %s; stopping before the next commit", store.uri, reason)
        (on_lost or _stop_now)(reason)

    def current_etag(tag: str) -> str | None:
        """The ETag a put returned, or (a store that returns none) the object's own."""
        if tag:
            return tag
        now = store.get(key)
        return now.etag if now is not None else None

    def renew() -> None:
        held_etag = current_etag(etag)
        while not stop.wait(lease_seconds / 3):
            try:
                renewed = None if held_etag is None else \
                    store.put_if_unchanged(key, json.dumps(body()).encode(), held_etag)
                held_etag = None if renewed is None else current_etag(renewed)
            except Exception as e:  # noqa: BLE001 - any failure to renew ends the run's right to write
                lost(str(e))
                return
            if held_etag is None:
                lost("another run took it over, or it was deleted")
                return

    renewer = threading.Thread(target=renew, name="applier-lease", daemon=True)
    renewer.start()
    try:
        yield mine
    finally:
        stop.set()
        renewer.join(timeout=5)
        try:
            now = store.get(key)
            if now is not None and json.loads(now.data).get("token") == token:
                store.delete(key)
        except Exception as e:  # noqa: BLE001 - a lease left behind expires; do not hide the body's error
            log.warning("could not release the writer lock of %s: %s (it expires by itself)", store.uri, e)
