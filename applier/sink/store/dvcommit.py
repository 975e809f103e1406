"""Commits applier writes into a local Delta log itself: a table with deletion vectors created, the
commits of its MERGEs (applier.sink.store.dvmerge), and the appends of the consistent cuts
(applier.sink.cuts: delta-rs's append of one row took 20-60 ms after every group, a drain's last step).

Why not delta-rs: it writes no deletion vectors, and the table it creates with
``delta.enableDeletionVectors`` (and each property set on it later) also asks readers for the
``variantType`` feature, which Spark's ``CREATE TABLE`` does not and older readers refuse. Creating the
table here keeps a mirror of such tables free of a JVM, with the protocol Spark gives it.

A commit is written aside, flushed, then linked into place as the version's file: the link fails when
the version exists (another writer took it), which is delta-rs's conflict, retried by the caller, and
a reader never sees a commit half written.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from applier.sink.store.dvlog import log_path

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["append_file", "create_dv_table", "write_commit", "write_data_file"]


def write_commit(root: Path, version: int, actions: list[dict[str, Any]]) -> None:
    """Version ``version`` of the table at ``root``: ``actions`` as JSON lines, atomically; a
    ``deltalake.exceptions.CommitFailedError`` when that version exists."""
    from deltalake.exceptions import CommitFailedError

    body = "\n".join(json.dumps(a, separators=(",", ":"), ensure_ascii=False) for a in actions) + "\n"
    final = log_path(root, version)
    aside = final.with_name(f".{final.name}.{uuid.uuid4()}.tmp")
    with open(aside, "w", encoding="utf-8") as out:
        out.write(body)
        out.flush()
        os.fsync(out.fileno())
    try:
        os.link(aside, final)
    except FileExistsError:
        raise CommitFailedError(f"version {version} of {root} was committed by another writer") from None
    finally:
        aside.unlink()


def create_dv_table(root: Path, schema: pa.Schema, properties: Mapping[str, str]) -> None:
    """Version 0 of a table with deletion vectors at ``root``: the protocol Spark's ``CREATE TABLE``
    gives it (reader 3, writer 7; ``deletionVectors``, Spark's default ``invariants`` and ``appendOnly``,
    ``timestampNtz`` for a timestamp without time zone), the schema as delta-rs writes it from Arrow,
    ``properties`` as its configuration. Raises ``CommitFailedError`` when a table exists there."""
    from deltalake import Schema

    schema_string = Schema.from_arrow(schema).to_json()
    reader, writer = ["deletionVectors"], ["deletionVectors", "invariants", "appendOnly"]
    if '"timestamp_ntz"' in schema_string:
        reader.append("timestampNtz")
        writer.append("timestampNtz")
    now = int(time.time() * 1000)
    (root / "_delta_log").mkdir(parents=True, exist_ok=True)
    write_commit(root, 0, [
        {"commitInfo": {"timestamp": now, "operation": "CREATE TABLE", "isBlindAppend": True,
                        "operationParameters": {"partitionBy": "[]", "properties": json.dumps(dict(properties))},
                        "engineInfo": "applier (deletion vectors)"}},
        {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": reader,
                      "writerFeatures": writer}},
        {"metaData": {"id": str(uuid.uuid4()), "format": {"provider": "parquet", "options": {}},
                      "schemaString": schema_string, "partitionColumns": [],
                      "configuration": dict(properties), "createdTime": now}},
    ])


def append_file(root: Path, version: int, rows: pa.Table, *, app_id: str, app_version: int,
                description: str) -> None:
    """Version ``version`` of the table at ``root``: ``rows`` appended as one new Parquet file, tagged
    with ``app_id`` at ``app_version`` (the ``txn`` action delta-rs's tagged appends record) and
    ``description`` as ``userMetadata``; a ``CommitFailedError`` when that version exists (the file
    written is then left unreferenced, as a failed delta-rs append leaves its own). The caller knows
    that the table at ``version - 1`` takes the rows as they are (its schema, no features to honour)."""
    now = int(time.time() * 1000)
    write_commit(root, version, [
        {"commitInfo": {"timestamp": now, "operation": "WRITE", "operationParameters": {"mode": "Append"},
                        "readVersion": version - 1, "isBlindAppend": True, "userMetadata": description,
                        "engineInfo": "applier"}},
        {"txn": {"appId": app_id, "version": app_version, "lastUpdated": now}},
        write_data_file(root, rows, now),
    ])


def write_data_file(root: Path, rows: pa.Table, now: int) -> dict[str, Any]:
    """``rows`` written as a new Parquet file of the table at ``root`` (not in it until a commit names
    it); its ``add`` action, with its statistics, ``now`` its modification time (ms)."""
    import pyarrow.parquet as pq

    from applier.sink.copyfiles import file_stats

    name = f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
    pq.write_table(rows, root / name, compression="snappy")
    return {"add": {"path": name, "partitionValues": {}, "size": (root / name).stat().st_size,
                    "modificationTime": now, "dataChange": True, "stats": file_stats(rows)}}
