"""The one place that chooses a table's store for each operation, from what each store can do.

delta-rs first (no JVM, the common case), Spark for the rest, as declared by ``DeltaRsStore.can_open``,
``can_write`` and ``can_create``: the way psycopg's ``pq`` picks its implementation once. Answers that
read a table's protocol are remembered per path until ``forget`` (a schema change, a move). Where
delta-rs is picked, ``StorePicker`` hands out a ``FallbackStore``: what delta-rs declines, Spark makes,
so no caller writes that fallback or asks which class its store is.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from applier.sink.store.checkpoints import checkpoint_type_changes, refresh_checkpoint
from applier.sink.store.deltars import DeletionVectorStore, DeltaRsStore
from applier.sink.store.fallback import FallbackStore
from applier.sink.store.memory import InMemoryStore
from applier.sink.store.spark import SparkStore

if TYPE_CHECKING:
    from applier.sink.spec import TableOptions, TableSpec
    from applier.spark.session import SparkLike

log = logging.getLogger(__name__)

#: what a StorePicker hands out: delta-rs with Spark behind it, Spark alone, or the in-memory store of tests
Store = FallbackStore | SparkStore | InMemoryStore

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


def log_reader(path: str) -> DeltaRsStore | None:
    """delta-rs's reader of the table's log (no JVM), or None where delta-rs cannot open the path (a name
    holding '%'): then ``logged_configuration``/``logged_applied_version`` read its JSON commits."""
    return DELTARS if DELTARS.can_open(path) else None


def deltars_writer(path: str) -> DeltaRsStore | None:
    """delta-rs where it writes the existing table at ``path`` (maintenance's compaction, vacuum and
    checkpoint), None where Spark must (a Delta feature delta-rs cannot write)."""
    return DELTARS if DELTARS.can_write(path) else None


def logged_configuration(path: str) -> dict[str, str]:
    """The table's properties from its JSON commits alone (see ``log_reader``)."""
    return SparkStore(None).logged_configuration(path)


def logged_applied_version(path: str, app_id: str) -> int | None:
    """``app_id``'s applied version from the table's JSON commits alone (see ``log_reader``)."""
    return SparkStore(None).logged_applied_version(path, app_id)


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
        self._dv_merges: dict[str, bool] = {}  # table path -> dv_store makes its MERGEs
        #: the MERGEs of local tables with deletion vectors, made without Spark; it keeps what each
        #: commit reads for the next one (a run's: one per picker)
        self.dv_store = DeletionVectorStore()

    def _deltars(self, spark: SparkLike | None = None, why: str | None = None) -> FallbackStore:
        return FallbackStore(DELTARS, spark if spark is not None else self.spark, why=why)

    def _spark(self, spark: SparkLike | None = None, why: str | None = None) -> SparkStore:
        return SparkStore(spark if spark is not None else self.spark, why=why)

    def reader(self, path: str) -> Store:
        """The store that reads the table: delta-rs where it can open the path (rows it does not read as
        Spark does are read by Spark), else Spark."""
        if self.only is not None:
            return self.only
        return self._deltars() if DELTARS.can_open(path) else self._spark()

    def evolver(self, path: str) -> Store:
        """The store that changes the table's columns: delta-rs when it writes the table (read again: a
        schema change may be about to change its protocol), Spark making what delta-rs declines (a
        rename, a widening), else Spark."""
        if self.only is not None:
            return self.only
        self.forget(path)
        return self._deltars() if self.deltars_writes(path) else self._spark()

    def deltars_writes(self, path: str) -> bool:
        """Whether delta-rs may write the table: the setting allows it and it writes the table's
        protocol (read once per path until ``forget``). Where it does, and the table's newest checkpoint
        holds statistics in other types than its columns have now (a table rewritten with new types
        before applier wrote a checkpoint after such rewrites, or by another tool), Spark writes one
        first: delta-rs's own checkpoint after its commits would fail on it
        (applier.sink.store.checkpoints)."""
        if self.merge_engine != "auto":
            return False
        writable = self._writable.get(path)
        if writable is None:
            writable = self._writable[path] = DELTARS.can_write(path)
            if writable:
                self._refresh_checkpoint(path)
        return writable

    def _refresh_checkpoint(self, path: str) -> None:
        if self.spark is None:
            if changes := checkpoint_type_changes(path):
                log.warning("%s: its newest checkpoint holds statistics in other types than its columns have now "
                            "(%s); delta-rs's next checkpoint of it will fail, and no Spark session was given to "
                            "write one", path, ", ".join(sorted(changes)))
            return
        refresh_checkpoint(self.spark, path)

    def writer(self, path: str, spark: SparkLike | None = None) -> Store:
        """The store that makes the other changes to an existing table (maintenance, a fresh copy's empty
        table, a column fill): delta-rs when it writes the table, Spark making what it declines, else
        Spark. ``spark``: the session (or provider) to use, when not the run's."""
        if self.only is not None:
            return self.only
        return self._deltars(spark) if self.deltars_writes(path) else self._spark(spark)

    def merger(self, path: str, spec: TableSpec, spark: SparkLike | None = None, *,
               why: str | None = None) -> Store:
        """The store that makes a MERGE into the table: delta-rs when it writes the table and its keys are
        not floating point (NaN and -0.0 compare differently in SQL engines), Spark making a plan delta-rs
        declines; else Spark. ``spark``: the session (or provider) this commit runs on, when not the
        run's; ``why``: what starting Spark for it is logged as."""
        if self.only is not None:
            return self.only
        if self.deltars_writes(path) and not spec.floating_point_key:
            return self._deltars(spark, why)
        if self.dv_merges(path) and not spec.floating_point_key:
            return FallbackStore(self.dv_store, spark if spark is not None else self.spark, why=why)
        return self._spark(spark, why)

    def dv_merges(self, path: str) -> bool:
        """Whether the table's MERGEs mark rows in deletion vectors without Spark (a local table whose
        properties enable them: applier.sink.store.dvmerge); read once per path until ``forget``."""
        if self.merge_engine != "auto":
            return False
        merges = self._dv_merges.get(path)
        if merges is None:
            merges = self._dv_merges[path] = self.dv_store.can_merge(path)
        return merges

    def creator(self, path: str, spec: TableSpec, options: TableOptions) -> Store:
        """The store that creates a new table: delta-rs when it creates it exactly as Spark would."""
        if self.only is not None:
            return self.only
        if self.merge_engine == "auto" and DELTARS.can_create(path, spec, options):
            return self._deltars()
        return self._spark()

    def copier(self, path: str, spec: TableSpec, *, large: bool = True) -> Store:
        """The store that writes a copy into the existing table: delta-rs when it writes the table (or makes
        its MERGEs with deletion vectors: a copy reads nothing back) and the copy is ``large`` (a copy of
        less than one commit goes through Spark when Spark created the table: it is up already)."""
        from applier.sink.naming import needs_column_mapping

        if self.only is not None:
            return self.only
        if large and not needs_column_mapping(spec.column_names) and (self.deltars_writes(path)
                                                                      or self.dv_merges(path)):
            return self._deltars()  # a copy only writes: delta-rs writes into a table with deletion vectors
        return self._spark()

    def forget(self, *paths: str) -> None:
        """What was read of these tables' protocols no longer holds (replaced, moved, evolved)."""
        for path in paths:
            self._writable.pop(path, None)
            self._dv_merges.pop(path, None)
