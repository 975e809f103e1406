"""The Delta table of logical decoding messages (``apply.messages_table``): pg_logical_emit_message
payloads kept with their LSN, written once per group like the mirrored tables."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from applier.lsn import format_lsn
from applier.protocol.messages import LogicalMessage
from applier.sink.owntables import append_rows
from applier.sink.spec import TableSpec, app_id_for

if TYPE_CHECKING:
    from applier.sink.store import StorePicker


def messages_spec() -> TableSpec:
    """lsn string, transactional boolean, prefix string, content binary."""
    import pyarrow as pa

    return TableSpec("logical decoding messages", pa.schema([
        pa.field("lsn", pa.string()), pa.field("transactional", pa.bool_()), pa.field("prefix", pa.string()),
        pa.field("content", pa.binary())]), (), "n")


def record_messages(stores: StorePicker, path: str, messages: Sequence[tuple[int, LogicalMessage]],
                    version: int) -> None:
    """Append logical decoding messages to a Delta table, once per ``version`` (idempotent like the tables)."""
    if not messages:
        return
    rows = [(format_lsn(lsn), bool(m.transactional), m.prefix, bytes(m.content)) for lsn, m in messages]
    append_rows(stores, path, messages_spec(), rows,
                tag=(app_id_for("_messages"), version, f"messages end_lsn={format_lsn(version)}"))
