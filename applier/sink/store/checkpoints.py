"""A table's newest checkpoint as delta-rs reads it, and a fresh one where it cannot.

Why: Spark writes a checkpoint every ``delta.checkpointInterval`` (10) of its commits, with each file's
statistics also as a struct (``add.stats_parsed``) in the column types of that moment. A type Delta cannot
widen is mended by rewriting the table with the new types in one overwrite (``overwriteSchema``: a fresh
copy's empty table, a rename or widening rewrite; applier.sink.store.sparkddl), which leaves that
checkpoint the newest. delta-rs (its kernel) reads the newest checkpoint's ``stats_parsed`` in the table's
present types: where a column's type changed in a way it does not cast (int to string, decimal to
bigint), opening the table for a write works, but the checkpoint delta-rs writes after its commits at
versions 99, 199... fails (``Kernel error: Invalid argument error: Incorrect datatype. Expected Utf8, got
Int32``): the commit is in the log and the write raises, so the run stopped (exit 4), and the next run went
on until the table's next hundred commits (the soak, seed 2, steps 314 and 328: pieces of a large
transaction, a commit each, got a table there within one run; tests/integration/test_pieces_types.py).

A checkpoint of the present version, written by Spark, has its statistics in the present types: every
later checkpoint reads that one. So each overwrite that may change types is followed by one
(``refresh_checkpoint``), and a table delta-rs is about to write whose newest checkpoint still has
statistics in other types (a target written before this, or rewritten by another tool) gets one first
(applier.sink.store.picker). Added, dropped and renamed columns leave checkpoints delta-rs reads, and are
left alone; a widening the kernel casts (int to bigint) gets a checkpoint too, as any changed type does: one
Spark job after a change that already took one.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from applier.spark.session import SparkLike

log = logging.getLogger(__name__)

#: the statistics of a checkpoint's ``stats_parsed`` that hold column values (in the column's type)
_VALUE_STATS = ("minValues", "maxValues")


def checkpoint_type_changes(path: str) -> dict[str, tuple[str, str]]:
    """The columns whose statistics in the newest checkpoint of the table at ``path`` (``add.stats_parsed``)
    have another type than the column has now: ``{column: (type in the checkpoint, type now)}``, in
    Arrow's names. Empty when the table has no checkpoint, or one without such statistics (delta-rs
    writes none), or one in a form this does not read (a V2 checkpoint), or a path delta-rs cannot
    open (delta-rs never writes it)."""
    from applier.sink.store.deltars import DeltaRsStore

    if not DeltaRsStore.can_open(path):
        return {}
    try:
        files = _log_files(path)
        with files.open_input_stream("_delta_log/_last_checkpoint") as f:
            last = json.loads(f.read())
    except Exception:  # noqa: BLE001 - no table, no hint, an unreadable one (delta-rs's own classes): nothing to do
        return {}
    stats = _stats_types_of_hint(last)
    if stats is None:
        stats = _stats_types_of_file(files, last)
    if not stats:
        return {}
    import pyarrow as pa

    now = pa.schema(DeltaRsStore.open(path).schema().to_arrow())
    changes = {}
    for name, old in stats.items():
        if name in now.names and not _same_type(old, now.field(name).type):
            changes[name] = (str(old), str(now.field(name).type))
    return changes


def refresh_checkpoint(spark: SparkLike, path: str, *, table: str | None = None) -> bool:
    """A checkpoint of the table's newest version written by Spark, when its newest checkpoint has
    statistics in other types than its columns have now (``checkpoint_type_changes``); whether one was
    written."""
    changes = checkpoint_type_changes(path)
    if not changes:
        return False
    from applier.sink.store.sparkbase import SparkTables

    what = ", ".join(f"{name} ({old} there, {new} now)" for name, (old, new) in sorted(changes.items()))
    version = SparkTables(spark).checkpoint(path, why=f"{table or path}: a checkpoint in the present column types")
    log.info("%s: checkpoint at version %d (the newest before held statistics of %s, which delta-rs cannot read "
             "in the present types)", table or path, version, what)
    return True


def _log_files(path: str) -> Any:
    """The table's files, local or on an object store, through delta-rs's own storage settings."""
    import pyarrow.fs as pafs
    from deltalake.fs import DeltaStorageHandler

    from applier.storage.options import deltalake_options

    return pafs.PyFileSystem(DeltaStorageHandler(str(path), deltalake_options(path)))


def _stats_types_of_hint(last: dict[str, Any]) -> dict[str, Any] | None:
    """The value statistics' types from ``_last_checkpoint``'s ``checkpointSchema`` (Spark writes it):
    ``{}`` when the checkpoint has no ``stats_parsed``; None when the hint holds no schema."""
    schema = last.get("checkpointSchema")
    if not isinstance(schema, dict):
        return None
    add = next((f for f in schema.get("fields", ()) if f.get("name") == "add"), None)
    if add is None or not isinstance(add.get("type"), dict):
        return {}
    parsed = next((f for f in add["type"].get("fields", ()) if f.get("name") == "stats_parsed"), None)
    if parsed is None or not isinstance(parsed.get("type"), dict):
        return {}
    from deltalake import Schema

    out: dict[str, Any] = {}
    for stat in parsed["type"].get("fields", ()):
        if stat.get("name") in _VALUE_STATS and isinstance(stat.get("type"), dict):
            import pyarrow as pa

            for field in pa.schema(Schema.from_json(json.dumps(stat["type"])).to_arrow()):
                out.setdefault(field.name, field.type)
    return out


def _stats_types_of_file(files: Any, last: dict[str, Any]) -> dict[str, Any]:
    """The value statistics' types from the checkpoint file's own schema (a classic checkpoint, one file
    or the first of its parts); ``{}`` when it has none or cannot be read."""
    import pyarrow.parquet as pq

    version = int(last.get("version", -1))
    if version < 0:
        return {}
    parts = last.get("parts")
    name = (f"_delta_log/{version:020d}.checkpoint.parquet" if not parts
            else f"_delta_log/{version:020d}.checkpoint.{1:010d}.{int(parts):010d}.parquet")
    try:
        with files.open_input_file(name) as f:
            schema = pq.read_schema(f)
    except (FileNotFoundError, OSError):
        return {}
    import pyarrow as pa

    if "add" not in schema.names:
        return {}
    add = schema.field("add").type
    if not pa.types.is_struct(add) or add.get_field_index("stats_parsed") < 0:
        return {}
    parsed = add.field("stats_parsed").type
    out: dict[str, Any] = {}
    for stat in _VALUE_STATS:
        if pa.types.is_struct(parsed) and parsed.get_field_index(stat) >= 0:
            for field in parsed.field(stat).type:
                out.setdefault(field.name, field.type)
    return out


def _same_type(old: Any, new: Any) -> bool:
    """Whether a statistic of type ``old`` is one of a column of type ``new``: equal types, or instants
    of any unit and zone (a checkpoint written elsewhere may keep other units; delta-rs reads those)."""
    import pyarrow as pa

    if old == new:
        return True
    return bool(pa.types.is_timestamp(old) and pa.types.is_timestamp(new))
