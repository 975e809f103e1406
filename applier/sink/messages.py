"""The Delta table of logical decoding messages (``apply.messages_table``): pg_logical_emit_message
payloads kept with their LSN, written once per group like the mirrored tables."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from applier.lsn import format_lsn
from applier.protocol.messages import LogicalMessage
from applier.sink.idempotence import app_id_for, idempotent_write

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


MESSAGES_SCHEMA = "lsn STRING, transactional BOOLEAN, prefix STRING, content BINARY"


def record_messages(spark: SparkSession, path: str, messages: Sequence[tuple[int, LogicalMessage]],
                    version: int) -> None:
    """Append logical decoding messages to a Delta table, once per ``version`` (idempotent like the tables)."""
    if not messages:
        return
    rows = [(format_lsn(lsn), bool(m.transactional), m.prefix, bytes(m.content)) for lsn, m in messages]
    df = spark.createDataFrame(rows, MESSAGES_SCHEMA)
    with idempotent_write(spark, app_id_for("_messages"), version, f"messages end_lsn={format_lsn(version)}"):
        df.write.format("delta").mode("append").save(path)
