"""One writer per target, with what goes with it: the commands, the Python API and the foreachBatch
sink open ``target_writer`` (or, for a raw log, ``location_lock``) before they write.

The locks themselves are below: a ``flock`` in a local directory (applier.infra.lock) and a lease
object on an object store (applier.storage.lease). Choosing between them, checking that the target
can be written, and checking the target's tables against what earlier runs wrote (sink/registry.py)
is orchestration over storage, state and the sink, so it lives here, above all of them.
"""

from __future__ import annotations

import sys
from collections.abc import Collection, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from applier.checks.writable import check_writable_directory
from applier.infra.lock import LOCK_FILE, clear_stale_spill, writer_lock
from applier.infra.stateformat import refuse_newer, upgrade
from applier.sink.registry import TargetRegistry
from applier.sink.tableversions import TableVersions
from applier.state import StateDir
from applier.storage.lease import store_lease
from applier.storage.location import is_object_store
from applier.storage.objects import ObjectStore

__all__ = ["location_lock", "target_writer"]


@contextmanager
def location_lock(location: str | Path, what: str, *, lock_name: str = LOCK_FILE) -> Iterator[None]:
    """One writer of ``location``: ``flock`` on ``lock_name`` in it when it is a local directory, a lease
    object (``<lock_name>.json`` beside the data, taken with put-if-absent) on an object store."""
    if is_object_store(location):
        with store_lease(ObjectStore(str(location)), what, key=f"{lock_name}.json"):
            yield
        return
    with writer_lock(location, what, lock_name=lock_name):
        yield


@contextmanager
def target_writer(target_path: str | Path, state_dir: str | None = None, *, command: str,
                  dry_run: bool = False, config_file: str | None = None,
                  mended: Collection[str] = ()) -> Iterator[None]:
    """Be the only writer of a target (``replay``, ``mirror``): hold the lock in its state
    directory, remove the spill files a killed run left there, and check that every table earlier
    runs wrote is still there, still the same Delta table (sink/registry.py) and not behind the
    version and applied LSN they recorded for it (sink/tableversions.py: its Delta history went
    backwards); the tables are remembered again when the body ends, even by an error. A dry run writes
    nothing and takes no lock. ``resync`` is told of a table behind but not stopped: it is the way to
    copy one anew, nor by a gone or replaced table it names (``mended``: it copies them anew). ``config_file``:
    the config the command was given (the remedy a stop prints names it).

    Every entry point that writes a target opens this first: the commands (and so the spark-submit
    jobs), the Python API (``applier.replay``, ``applier.mirror``) and the foreachBatch sink
    (``DeltaApplySink``, for the streaming query's life), so that their guarantees are the same."""
    state = StateDir.for_target(target_path, state_dir)
    refuse_newer(state, command)  # a state a newer release wrote: exit 2 before anything is touched
    if dry_run:
        yield
        return
    # a file or a read-only mount is a mistake to fix (exit 2), found before the lock, the server and Spark
    check_writable_directory(target_path, "target.path (--target)")
    if state_dir is not None or is_object_store(target_path):
        check_writable_directory(state.root, "target.state_dir")
    with ExitStack() as held:
        if is_object_store(target_path):  # one writer across machines: a lease object beside the tables
            held.enter_context(store_lease(ObjectStore(str(target_path)), "target"))
        held.enter_context(writer_lock(state.root, "target"))
        upgrade(state, command)  # the state's format brought to this release's, under the lock (stateformat.py)
        if removed := clear_stale_spill(state.spill_dir):
            print(f"applier: removed {removed} spill file(s) left by a killed run", file=sys.stderr, flush=True)
        registry = TargetRegistry(state, target_path)
        registry.check(command, mended=mended)  # a resync's own tables may be gone: it copies them anew
        versions = TableVersions(state, str(target_path))
        if behind := versions.behind(registry.entries):
            error = versions.error(behind, command, config_file)
            if command != "resync":
                raise error
            print(f"applier: {error}", file=sys.stderr, flush=True)
        registry.record()
        try:
            yield
        finally:
            registry.record()
            versions.record(registry.entries)
