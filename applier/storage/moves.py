"""Moving a Delta table's directory on an object store, where there is no rename.

Why it is safe to stop anywhere: the move copies every object of the table to the new prefix
(data files first, the ``_delta_log`` last, so a half copy is no table at all to a reader), then
deletes the old objects (the log first, so the old place stops being a table at once), and finally
a marker. The marker (``_applier_moved_from``, written at the new prefix before the first copy)
tells a repeated move that a table found at the new prefix is its own half-done copy and not
someone else's table: repeating the whole move after a crash copies the same immutable objects
again and ends the same. Readers ignore the marker (Delta skips files whose names start with ``_``,
VACUUM too). The caller holds the target's writer lock and has saved its intent to move, so no one
writes either prefix meanwhile.
"""

from __future__ import annotations

import logging

from applier.errors import ConfigError
from applier.infra.crashpoints import crashpoint
from applier.storage.location import bucket_and_prefix, bucket_root
from applier.storage.objects import ObjectStore

__all__ = ["MARKER", "TableInTheWay", "move_table_on_store"]

log = logging.getLogger(__name__)

MARKER = "_applier_moved_from"
_LOG = "_delta_log/"


class TableInTheWay(Exception):
    """The new prefix holds a Delta table that is not a copy of the one being moved."""


def move_table_on_store(src: str, dst: str) -> bool:
    """Move the table at ``src`` to ``dst`` (both in one bucket): True when objects were moved, False when
    ``src`` holds nothing (moved already: only a leftover marker is removed). Raises ``TableInTheWay``."""
    root = bucket_root(src)
    if bucket_root(dst) != root:
        raise ConfigError("a table cannot be moved from one bucket to another", source=src, destination=dst)
    store = ObjectStore(root)
    src_prefix = bucket_and_prefix(src)[1] + "/"
    dst_prefix = bucket_and_prefix(dst)[1] + "/"
    marker = dst_prefix + MARKER
    keys = store.keys(src_prefix)
    if not keys:
        store.delete(marker)
        return False
    relative = [key[len(src_prefix):] for key in keys]
    if store.any_under(dst_prefix + _LOG):
        found = store.get(marker)
        if found is None or found.data.decode() != src:
            raise TableInTheWay(dst)
    store.put(marker, src.encode())
    data = [r for r in relative if not r.startswith(_LOG)]
    # the log in version order, its entry point (_last_checkpoint) last of all
    in_log = sorted((r for r in relative if r.startswith(_LOG)), key=lambda r: (r.endswith("_last_checkpoint"), r))
    for index, rel in enumerate(data + in_log, 1):
        store.copy(src_prefix + rel, dst_prefix + rel)
        crashpoint("object_copied")
        if index % 500 == 0:
            log.info("moving %s to %s: %d of %d objects copied", src, dst, index, len(relative))
    for rel in in_log[::-1] + data:  # the entry point first: the old place stops being a table at once
        store.delete(src_prefix + rel)
    store.delete(marker)
    return True
