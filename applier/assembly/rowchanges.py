"""Row changes: each buffered change as one ``TableChange`` of converted values per table it touches.

Shapes, explicitly (see applier.changes): the old image is absent, a KEY image ('K', reduced here
to the identity key) or a FULL image ('O'); the new image is full or partial (columns sent as 'u',
unchanged TOAST, hold UNCHANGED_TOAST). Resolution of 'u' happens where the rows meet: the sink's
fold takes it from the 'O' image, from the previous image of the same row in the group, or marks it
"keep the target's value" (of the OLD key when the key changed).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from applier.assembly.transactions import Change
from applier.catalog import SchemaVersion
from applier.changes import TableChange
from applier.infra.fastobj import fast_constructor
from applier.protocol.messages import COL_UNCHANGED_TOAST, Delete, Insert, Truncate, TupleData, Update
from applier.values import UNCHANGED_TOAST

Convert = Callable[[SchemaVersion, TupleData], tuple[Any, ...]]

_change: Callable[..., TableChange] = fast_constructor(TableChange)


def row_changes(change: Change, convert: Convert) -> list[tuple[SchemaVersion, TableChange]]:
    """The row changes of one buffered change with the schema version each was decoded with (a
    TRUNCATE yields one per listed table; a logical decoding message none)."""
    msg = change.message
    if isinstance(msg, (Insert, Update, Delete)):
        schema = change.schemas[0]
        return [(schema, row_change(msg, schema, change.ordinal, lambda tup: convert(schema, tup)))]
    if isinstance(msg, Truncate):
        return [(schema, _change("T", None, None, None, change.ordinal, False, msg.restart_identity, msg.cascade))
                for schema in change.schemas]
    return []


def row_change(msg: Insert | Update | Delete, schema: SchemaVersion, ordinal: int,
               convert: Callable[[TupleData], tuple[Any, ...]]) -> TableChange:
    """The row change of one Insert, Update or Delete decoded with ``schema`` (``convert`` is its
    converter), the ``ordinal``-th change of its transaction."""
    if isinstance(msg, Insert):
        new = msg.new
        return _change("I", None, None, convert(new), ordinal, COL_UNCHANGED_TOAST in new.kinds)
    if isinstance(msg, Update):
        new = msg.new
        old_key = old_row = None
        if msg.old is not None:
            old = convert(msg.old)
            if msg.old_kind == "O":
                old_row = old
            else:
                old_key = tuple([old[i] for i in schema.key_indexes])
        row = convert(new)
        partial = COL_UNCHANGED_TOAST in new.kinds
        if partial and old_key is not None:
            row = _key_from_old(row, old_key, schema.key_indexes)
        return _change("U", old_key, old_row, row, ordinal, partial)
    old = convert(msg.old)
    if msg.old_kind == "O":
        return _change("D", None, old, None, ordinal)
    return _change("D", tuple([old[i] for i in schema.key_indexes]), None, None, ordinal)


def _key_from_old(row: tuple[Any, ...], old_key: tuple[Any, ...], key_indexes: tuple[int, ...]) -> tuple[Any, ...]:
    """A key column that is toasted and did not change arrives as 'u' in the new image, and PostgreSQL
    then sends the old key ('K') in full (heapam.c logs the identity when a key column is stored
    externally): the new image's key is that one. Without this the row had no key to be merged on."""
    if not any(row[i] is UNCHANGED_TOAST for i in key_indexes):
        return row
    filled = list(row)
    for i, value in zip(key_indexes, old_key, strict=True):
        if filled[i] is UNCHANGED_TOAST:
            filled[i] = value
    return tuple(filled)
