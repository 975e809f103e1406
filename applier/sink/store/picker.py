"""The one place that chooses a table's store for each operation, from what each store can do.

delta-rs first (no JVM, the common case), Spark for the rest, as declared by ``DeltaRsStore.can_open``,
``can_write`` and ``can_create``: the way psycopg's ``pq`` picks its implementation once. Answers that
read a table's protocol are remembered per path until ``forget`` (a schema change, a move).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from applier.sink.store.deltars import DeltaRsStore
from applier.sink.store.memory import InMemoryStore
from applier.sink.store.spark import SparkStore

if TYPE_CHECKING:
    from applier.sink.spec import TableOptions, TableSpec
    from applier.spark.session import SparkLike

Store = DeltaRsStore | SparkStore | InMemoryStore

#: one delta-rs store serves every caller: it holds no state
DELTARS = DeltaRsStore()


def reader(path: str, spark: SparkLike | None = None) -> DeltaRsStore | SparkStore:
    """The store that reads the table at ``path``: delta-rs where it can open the path (no JVM), else
    Spark (``spark``, started only by a read that needs it)."""
    return DELTARS if DELTARS.can_open(path) else SparkStore(spark)


def scanner(path: str, spark: SparkLike | None = None, *, spark_only: bool = False) -> DeltaRsStore | SparkStore:
    """The store that reads the rows of the table at ``path`` (``verify``): delta-rs where it reads them
    as Spark does (no JVM), else Spark; ``spark_only``: Spark in any case (what a Spark consumer sees).
    A path that holds no table gets Spark's store, whose ``exists`` says so."""
    return DELTARS if not spark_only and DELTARS.can_scan(path) else SparkStore(spark)


def writer(path: str, spark: SparkLike | None = None) -> DeltaRsStore | SparkStore:
    """The store that writes to (or maintains) the existing table at ``path``."""
    return DELTARS if DELTARS.can_write(path) else SparkStore(spark)


class StorePicker:
    """A run's choice of store per table (``merge_engine`` 'spark': every write through Spark).

    ``only``: every operation on that store (an ``InMemoryStore``: the loop and the drivers run without
    a JVM or files, in tests)."""

    def __init__(self, spark: SparkLike | None, *, merge_engine: str = "auto",
                 only: InMemoryStore | None = None) -> None:
        self.spark = spark
        self.merge_engine = merge_engine
        self.only = only
        self._writable: dict[str, bool] = {}  # table path -> delta-rs writes its protocol

    def reader(self, path: str) -> Store:
        if self.only is not None:
            return self.only
        return reader(path, self.spark)

    def evolver(self, path: str) -> Store:
        """The store that changes the table's columns: delta-rs when it writes the table (read again: a
        schema change may be about to change its protocol), which declines what only Spark makes (a
        rename, a widening: ``evolve`` returns None and Spark's store makes it), else Spark."""
        if self.only is not None:
            return self.only
        self.forget(path)
        return DELTARS if self.deltars_writes(path) else SparkStore(self.spark)

    def deltars_writes(self, path: str) -> bool:
        """Whether delta-rs may write the table: the setting allows it and it writes the table's
        protocol (read once per path until ``forget``)."""
        if self.merge_engine != "auto":
            return False
        writable = self._writable.get(path)
        if writable is None:
            writable = self._writable[path] = DELTARS.can_write(path)
        return writable

    def writer(self, path: str) -> Store:
        """The store that makes the other changes to an existing table (maintenance, a fresh copy's empty
        table, a column fill): delta-rs when it writes the table; it may decline (returns None), and then
        ``spark_store()`` makes the change."""
        if self.only is not None:
            return self.only
        return DELTARS if self.deltars_writes(path) else SparkStore(self.spark)

    def spark_store(self) -> SparkStore:
        """Spark's store, which makes every change Delta makes: what a store that declines leaves to it."""
        return SparkStore(self.spark)

    def merger(self, path: str, spec: TableSpec, spark: SparkLike | None = None) -> Store:
        """The store that makes a MERGE into the table: delta-rs when it writes the table and its keys are
        not floating point (NaN and -0.0 compare differently in SQL engines); delta-rs may still decline
        the plan itself (``DeltaRsStore.merge`` returns None), and then Spark makes it. ``spark``: the
        session (or provider) this commit runs on, when not the run's."""
        if self.only is not None:
            return self.only
        if self.deltars_writes(path):
            if not spec.floating_point_key:
                return DELTARS
        return SparkStore(spark if spark is not None else self.spark)

    def creator(self, path: str, spec: TableSpec, options: TableOptions) -> Store:
        """The store that creates a new table: delta-rs when it creates it exactly as Spark would."""
        if self.only is not None:
            return self.only
        if self.merge_engine == "auto" and DELTARS.can_create(path, spec, options):
            return DELTARS
        return SparkStore(self.spark)

    def copier(self, path: str, spec: TableSpec, *, large: bool = True) -> Store:
        """The store that writes a copy into the existing table: delta-rs when it writes the table and the
        copy is ``large`` (a copy of less than one commit goes through Spark when Spark created the table:
        it is up already)."""
        from applier.sink.naming import needs_column_mapping

        if self.only is not None:
            return self.only
        if large and not needs_column_mapping(spec.column_names) and self.deltars_writes(path):
            return DELTARS
        return SparkStore(self.spark)

    def forget(self, *paths: str) -> None:
        """What was read of these tables' protocols no longer holds (replaced, moved, evolved)."""
        for path in paths:
            self._writable.pop(path, None)
