"""The change contract between assembly and every destination: what a committed transaction holds
for one table, in commit order, with explicit row shapes.

Assembly builds these (applier.assembly.feeder) and the sink reads them (applier.sink.engine and its
fold); neither imports the other, both import this module. The shapes follow pgoutput (see
shared/notes/pgoutput-semantics.md):

- the old row is absent (insert, or an update that did not change the key), a KEY image ('K': the
  replica identity key of the row before the change) or a FULL image ('O': REPLICA IDENTITY FULL);
- the new row is FULL, or PARTIAL when columns were sent as 'u' (unchanged TOAST): those positions
  hold ``UNCHANGED_TOAST`` and take their value from the old FULL image, from an earlier image of the
  same row, or from the target row (PostgreSQL's apply worker keeps the local column).

Every change carries its ordinal in the transaction, and every batch its schema version, commit LSN
and end LSN, so a destination can order, deduplicate and describe what it writes without going back
to the stream. The batches (``TableBatch``) live in applier.catalog.batches, beside the schema
version they carry: this module is a leaf that imports nothing of applier.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

#: Row-change operations (single characters, as pgoutput names them).
OP_INSERT, OP_UPDATE, OP_DELETE, OP_TRUNCATE = "I", "U", "D", "T"

NewShape = Literal["full", "partial"] | None

Row = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class TableChange:
    """One row change to one table.

    Exactly one of ``old_key`` (a KEY image, already reduced to the key columns) and ``old_row`` (a
    FULL image, every column) is set when the message carried an old row. ``new_partial`` says that
    ``new_row`` holds ``UNCHANGED_TOAST`` markers (decided from the wire kinds, so nobody has to scan
    the values). ``ordinal`` is the change's position in its transaction."""

    op: str
    old_key: Row | None
    old_row: Row | None
    new_row: Row | None
    ordinal: int = 0
    new_partial: bool = False
    restart_identity: bool = False  # TRUNCATE ... RESTART IDENTITY (op 'T' only)
    cascade: bool = False  # TRUNCATE ... CASCADE (op 'T' only; the message already lists every cascaded table)

    @property
    def new_shape(self) -> NewShape:
        if self.new_row is None:
            return None
        return "partial" if self.new_partial else "full"


@dataclass(frozen=True, slots=True)
class SkippedTransaction:
    """A transaction left out on the user's word (``apply.skip_transactions``), for the audit table."""

    commit_lsn: int
    xid: int
    end_lsn: int
    reason: str
