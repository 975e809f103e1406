"""Table stores: one protocol (``TableStore``), one implementation per engine (delta-rs, Spark, and an
in-memory one for tests), and the one place that picks the engine per table and operation
(``picker``). Nothing outside this package imports ``deltalake`` for a target table or asks what
delta-rs can do."""

from applier.sink.store.base import CommitResult, CommitTag, FileStats, TableLog, TableStore, WriteMode
from applier.sink.store.deltars import DeltaRsStore
from applier.sink.store.memory import InMemoryStore
from applier.sink.store.picker import DELTARS, StorePicker, reader, writer
from applier.sink.store.spark import SparkStore

__all__ = ["CommitResult", "CommitTag", "DELTARS", "DeltaRsStore", "FileStats", "InMemoryStore", "SparkStore",
           "StorePicker", "TableLog", "TableStore", "WriteMode", "reader", "writer"]
