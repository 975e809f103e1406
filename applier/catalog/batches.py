"""A committed transaction's changes to one table, with the schema version they were decoded with:
the batches assembly hands the sink (applier.changes has the row changes they hold).

Here rather than in applier.changes because a batch carries a ``SchemaVersion`` of the catalog, and
applier.changes stays a leaf below the catalog.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from applier.catalog.relations import SchemaVersion
from applier.changes import TableChange

__all__ = ["GroupedTransactions", "TableBatch"]


@dataclass(frozen=True, slots=True)
class TableBatch:
    """The changes of one committed transaction to one table, decoded with one schema version, in
    commit order (a transaction that altered the table mid-way yields one batch per version)."""

    relation_oid: int
    namespace: str
    name: str
    schema: SchemaVersion
    commit_lsn: int
    end_lsn: int
    changes: Sequence[TableChange]
    commit_time: int | None = None  # microseconds since 2000-01-01 UTC, as pgoutput sends it

    @property
    def qualified_name(self) -> str:
        return f"{self.namespace}.{self.name}"


#: What a group hands the sink: per committed transaction, its end LSN and its batches.
GroupedTransactions = Sequence[tuple[int, Sequence[TableBatch]]]
