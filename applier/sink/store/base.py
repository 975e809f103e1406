"""What every table store offers: the operations the apply stage, the copy, ``status`` and
maintenance make on one Delta table, whatever engine makes them.

Why a protocol: applier writes through two engines, delta-rs in the Python process (no JVM, the
common case) and Spark (what delta-rs cannot do: key-less MERGEs, column mapping, type widening, paths
it cannot open). Their choice used to be made again in every module that touched a table; now each
engine is one ``TableStore`` and ``applier.sink.store.picker`` chooses, in one place, from what each
declares it can do. A third engine (an in-memory one for tests, an Iceberg one) is one more class.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    import pyarrow as pa

    from applier.sink.history import HistoryPlan
    from applier.sink.plan import TablePlan
    from applier.sink.spec import Renames, RewritePolicy, SchemaEvolution, TableOptions, TableSpec

#: (app id, version, description): the idempotent-write ids a commit records as a Delta ``txn`` action
#: and its ``userMetadata`` (applier.sink.idempotence)
CommitTag = tuple[str, int, str]
WriteMode = Literal["append", "overwrite"]


@dataclass(frozen=True, slots=True)
class CommitResult:
    rows_upserted: int
    rows_deleted: int
    overwritten: bool
    #: the Delta version the commit created, where the store knows it without reading the log again
    #: (delta-rs's table object is at it after the commit); None: not known, or nothing committed. Not
    #: part of what a commit did (two stores that made the same commit compare equal)
    version: int | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class FileStats:
    """The data files of a table's newest version, from its log: their sizes, and its rows as the
    add actions count them (minus deletion-vector rows; None when a writer left no counts)."""

    sizes: tuple[int, ...]
    rows: int | None

    @property
    def count(self) -> int:
        return len(self.sizes)

    @property
    def size_bytes(self) -> int:
        return sum(self.sizes)

    def small(self, below: int) -> int:
        return sum(1 for s in self.sizes if s < below)


@dataclass(frozen=True, slots=True)
class TableLog:
    """What a table's log says of it now (``status``): no data file is read."""

    configuration: Mapping[str, str]
    partition_columns: tuple[str, ...]
    reader_features: tuple[str, ...]
    writer_features: tuple[str, ...]
    #: the newest commits' infos, newest first (``timestamp`` in ms, ``userMetadata``, ``operation``...)
    history: Sequence[Mapping[str, Any]]
    files: FileStats


@runtime_checkable
class TableStore(Protocol):
    """One engine's way to one Delta table at ``path`` (a local directory today)."""

    #: how lines and reports name the engine ('delta-rs', 'spark', 'memory')
    name: str
    #: whether its operations need Spark (a session started for them): what a caller that would rather
    #: not start one (a copy of many small tables, a feed that Arrow cannot hold) asks
    uses_spark: bool

    def exists(self, path: str) -> bool:
        """Whether ``path`` holds a table (a Delta log with a commit)."""
        ...

    def applied_version(self, path: str, app_id: str) -> int | None:
        """The version the table's ``txn`` actions record for ``app_id`` (None: never written by it)."""
        ...

    def version(self, path: str) -> int:
        """The table's newest Delta version, from its log: what a consistent cut records for a table a group
        wrote when the commit did not say (applier.sink.cuts)."""
        ...

    def columns(self, path: str) -> tuple[str, ...]:
        """The table's columns, in order."""
        ...

    def is_empty(self, path: str) -> bool:
        """True when the newest version holds no data file (so no rows)."""
        ...

    def scan(self, path: str, columns: Sequence[str], *, unless: str | None = None) -> Iterator[tuple[Any, ...]]:
        """The table's rows in ``columns``, as the Python values a Spark row holds (instants as aware UTC
        datetimes, a struct as a tuple, a map as a dict): what ``verify`` compares with Postgres.
        ``unless``: a boolean column whose true rows are left out (a soft-deleting table's deleted rows)."""
        ...

    def table_id(self, path: str) -> str | None:
        """The id fixed when the table was created (Delta ``metaData.id``); None when unreadable."""
        ...

    def create(self, path: str, spec: TableSpec, options: TableOptions, properties: Mapping[str, str]) -> None:
        """Create the table for ``spec`` with ``properties`` and ``options``' layout (an error if it exists)."""
        ...

    def evolve(self, path: str, spec: TableSpec, renames: Renames | None, *,
               rename: RewritePolicy | None = None) -> SchemaEvolution | None:
        """Bring the existing table's columns in line with ``spec`` (columns added, dropped ones kept
        and recorded, renames followed as ``rename`` says, types widened; a retype it cannot make raises the error that
        says what to do); None when this store declines the change (another store then makes it)."""
        ...

    def merge(self, path: str, schema: pa.Schema, plan: TablePlan, *, app_id: str, version: int,
              description: str, may_be_empty: bool = True) -> CommitResult | None:
        """The one commit ``plan`` describes, tagged ``(app_id, version)``; None when this store declines
        the plan (another store then makes the commit)."""
        ...

    def merge_history(self, path: str, spec: TableSpec, plan: HistoryPlan, *, app_id: str, version: int,
                      description: str) -> int | None:
        """A history table's commit (applier.sink.history): the versions it wrote or changed (0: applied
        already); None when this store declines it (Spark's store then makes it)."""
        ...

    def rows_by_key(self, path: str, schema: pa.Schema, key_columns: Sequence[str],
                    keys: Sequence[tuple[Any, ...]] | None, *, open_only: str | None = None,
                    unless: str | None = None) -> dict[object, list[Any]] | None:
        """The rows of ``schema``'s columns whose key is one of ``keys`` (every row: None), by frozen key;
        a column the table does not have yet reads NULL; ``open_only``: only rows where that column is
        NULL; ``unless``: not the rows where that flag is true. None when this store does not read the
        table as Spark does (Spark's store then reads them)."""
        ...

    def write_arrow(self, path: str, table: Any, *, mode: WriteMode, tag: CommitTag | None,
                    schema: pa.Schema | None = None) -> None:
        """One commit of a pyarrow Table (overwrite or append); with ``tag``, an idempotent one.
        ``schema``: the table's columns, for a store that converts the columns to its own types."""
        ...

    def replace_empty(self, path: str, spec: TableSpec) -> bool | None:
        """Leave the existing table empty with ``spec``'s columns and keys, in one commit that keeps its
        history, id, properties and layout (a fresh copy: ``applier resync``); None when this store
        declines (Spark's store then makes it)."""
        ...

    def fill_columns(self, path: str, spec: TableSpec, values: Mapping[str, object]) -> bool | None:
        """Set ``values``' columns to those constants in every row the table holds, in one commit (a
        column added with a constant default: applier.drivers.columnfill); None when this store declines."""
        ...

    def optimize(self, path: str, z_order: list[str], target_size: int | None) -> Mapping[str, Any] | None:
        """Compact the table's small files (Z-ordered by ``z_order`` when given), in one commit; what
        the engine reports of it; None when this store declines."""
        ...

    def vacuum(self, path: str, retention_hours: int | None, *, dry_run: bool, enforce_retention: bool) -> int | None:
        """Delete the files no version within ``retention_hours`` needs; how many (None: the engine does
        not count them)."""
        ...

    def set_properties(self, path: str, properties: Mapping[str, str], *,
                       carry: tuple[str, int] | None = None) -> None:
        """Set table properties in one commit; ``carry`` (app id, version) records a ``txn`` action in
        the same commit (a table that moved to a new source name keeps what it applied)."""
        ...
