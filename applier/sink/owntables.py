"""Tables applier writes for itself beside the mirrored ones (the logical decoding messages, the audit
of skipped transactions): created when first written, then appended to, through the store the run
picks for them like any table (delta-rs where it writes the table, so recording a message or a skip
starts no JVM; the in-memory store in tests)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from applier.errors import SinkError
from applier.sink.spec import TableOptions, TableSpec
from applier.sink.store.arrow import arrow_table

if TYPE_CHECKING:
    from applier.sink.store import StorePicker
    from applier.sink.store.base import CommitTag


def append_rows(stores: StorePicker, path: str, spec: TableSpec, rows: list[tuple[Any, ...]], *,
                tag: CommitTag | None) -> None:
    """Append ``rows`` (``spec``'s columns) to the table at ``path``, created first when it does not
    exist; with ``tag``, an idempotent commit (a version the table has applied writes nothing)."""
    table = arrow_table(rows, spec.schema)
    if table is None:
        raise SinkError(f"a row of {spec.source_name} does not convert to its Arrow types", path=path)
    if not stores.reader(path).exists(path):
        stores.creator(path, spec, TableOptions()).create(path, spec, TableOptions(), {})
        stores.forget(path)
    stores.copier(path, spec).write_arrow(path, table, mode="append", tag=tag, schema=spec.schema)
