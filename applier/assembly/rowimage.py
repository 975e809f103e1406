"""Row images: each change as (operation, old image, new image) of converted values.

Shapes, explicitly (see the notes on pgoutput): the old image is absent, a KEY image ('K': identity
columns set, others NULL) or a FULL image ('O': REPLICA IDENTITY FULL); the new image is full or
partial (columns sent as 'u', unchanged TOAST, hold UNCHANGED_TOAST). Resolution of 'u' happens
where the rows meet: the sink's fold takes it from the 'O' image, from the previous image of the
same row in the batch, or marks it "keep the target's value" (of the OLD key when the key changed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from applier.assembly.transactions import Change
from applier.catalog import SchemaVersion
from applier.infra.fastobj import fast_constructor
from applier.protocol.messages import Delete, Insert, Truncate, Update

OldKind = Literal["key", "full"] | None


@dataclass(frozen=True, slots=True)
class RowImage:
    op: str  # 'I', 'U', 'D' or 'T'
    schema: SchemaVersion
    old_kind: OldKind
    old: tuple[Any, ...] | None
    new: tuple[Any, ...] | None
    lsn: int
    ordinal: int
    restart_identity: bool = False  # TRUNCATE ... RESTART IDENTITY (op 'T' only)
    cascade: bool = False  # TRUNCATE ... CASCADE (op 'T' only; the message already lists every cascaded table)

    @property
    def identity_key(self) -> tuple[Any, ...] | None:
        """The replica identity key of the target row before the change (None: take it from ``new``)."""
        if self.old is None:
            return None
        return tuple([self.old[i] for i in self.schema.key_indexes])


_image = fast_constructor(RowImage)


def row_images(change: Change, convert: Any) -> list[RowImage]:
    """The row images of one change; ``convert(schema, tuple_data)`` converts TupleData to values."""
    msg = change.message
    if isinstance(msg, Insert):
        schema = change.schemas[0]
        return [_image("I", schema, None, None, convert(schema, msg.new), change.lsn, change.ordinal)]
    if isinstance(msg, Update):
        schema = change.schemas[0]
        old = convert(schema, msg.old) if msg.old is not None else None
        kind: OldKind = None if msg.old_kind is None else ("full" if msg.old_kind == "O" else "key")
        return [_image("U", schema, kind, old, convert(schema, msg.new), change.lsn, change.ordinal)]
    if isinstance(msg, Delete):
        schema = change.schemas[0]
        kind = "full" if msg.old_kind == "O" else "key"
        return [_image("D", schema, kind, convert(schema, msg.old), None, change.lsn, change.ordinal)]
    if isinstance(msg, Truncate):
        return [_image("T", schema, None, None, None, change.lsn, change.ordinal, msg.restart_identity,
                         msg.cascade) for schema in change.schemas]
    return []
