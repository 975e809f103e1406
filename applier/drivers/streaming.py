"""Structured Streaming: a ``foreachBatch`` sink that applies raw pgoutput messages to Delta tables.

    query = (spark.readStream.format("delta").load(raw_log)          # or format("pgoutput"), Kafka, ...
             .writeStream.foreachBatch(DeltaApplySink(target="/lake/mirror"))
             .option("checkpointLocation", "/lake/_checkpoints/mirror").start())

Each micro-batch is a slice of the raw log (columns ``lsn``, ``xid``, ``data``; ordered by ``seq``
when the frame has it). A transaction may span micro-batches, so what follows the last complete
transaction of a batch (its "tail") is kept in the state directory with the catalog, under the
batch id; the next batch starts from the newest saved state of an *earlier* batch id. That makes a
retried batch (same id, after a failure) start from exactly the state the first attempt started
from, and Delta's per-table transaction ids make re-applying its transactions a no-op. Prepared
transactions' staged copies are only released one batch later, so a retried batch still finds them.

The sink is a target's writer like ``applier replay``: every batch runs inside the target's session
(applier.drivers.writer.target_writer: the one-writer lock, stale spill removed, the target registry
checked before and recorded after), so a CLI run, an API call or another stream writing the same
target at the same time is refused instead of racing this batch on the Delta commits and the batch
states. Per batch, not for the query's life: a query restarted in the same process (a new sink on
the same checkpoint) must not find the target held by the old, stopped one.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from applier.assembly import CommittedTransaction
from applier.config import ApplySettings, TablesSettings
from applier.drivers.writer import target_writer
from applier.errors import ApplierError
from applier.infra.gcpolicy import collect_between_groups
from applier.loop import ApplyLoop
from applier.lsn import parse_lsn
from applier.protocol.replication import pg_now
from applier.state import StateDir, atomic_write_json

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from applier.infra.metrics import MirrorMetrics

#: Saved batch states kept (the newest two: the last finished batch, and the one before for a retry).
_KEEP_STATES = 2


def _lsn_value(value: Any) -> int:
    return int(value) if isinstance(value, int) else parse_lsn(str(value))


class DeltaApplySink:
    """``foreachBatch`` callable: apply the committed transactions of each micro-batch of raw messages."""

    def __init__(self, target: str, *, apply: ApplySettings | None = None, tables: TablesSettings | None = None,
                 state_dir: str | None = None, metrics: MirrorMetrics | None = None) -> None:
        self.target = target
        #: told of each applied batch (jobs/stream.py --metrics-port: applier.infra.metrics)
        self.metrics = metrics
        self._rows: dict[str, int] = {}  # rows per table over all batches, for the metrics' counters
        self.settings = apply or ApplySettings()
        self.tables = tables or TablesSettings()
        self.state = StateDir.for_target(target, state_dir)
        self.batches_dir = self.state.root / "stream"
        self.transactions = 0  # applied by this object (all batches)
        self.state_dir = state_dir

    # --- batch state ----------------------------------------------------------------------------

    def _saved(self) -> list[tuple[int, Path]]:
        if not self.batches_dir.is_dir():
            return []
        return sorted((int(p.stem.split("-")[1]), p) for p in self.batches_dir.glob("batch-*.json"))

    def _state_before(self, batch_id: int) -> dict[str, Any]:
        earlier = [p for i, p in self._saved() if i < batch_id]
        return json.loads(earlier[-1].read_text(encoding="utf-8")) if earlier else {}

    def _save(self, batch_id: int, payload: dict[str, Any]) -> None:
        atomic_write_json(self.batches_dir / f"batch-{batch_id:012d}.json", payload)
        for _i, p in self._saved()[:-_KEEP_STATES]:
            p.unlink(missing_ok=True)

    # --- the sink -------------------------------------------------------------------------------

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        # The whole batch under the loop's garbage-collection policy (applier.infra.gcpolicy):
        # building the batch's state allocates as much per message as applying it.
        with collect_between_groups(), target_writer(self.target, self.state_dir, command="replay"):
            self._apply_batch(df, batch_id)

    def _apply_batch(self, df: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        spark = df.sparkSession
        before = self._state_before(batch_id)
        finished_prepared: list[str] = []

        def applied(txn: CommittedTransaction) -> None:
            if txn.kind == "prepared" and txn.gid is not None:
                finished_prepared.append(txn.gid)  # released one batch later (see module docstring)
            else:
                feeder.applied(txn)

        # the order of a stored log read in pieces is checked as it is fed
        loop = ApplyLoop(spark, self.target, apply=self.settings, tables=self.tables, state=self.state,
                         catalog_json=before.get("catalog") or {}, check_order=True, on_applied=applied)
        feeder = loop.feeder
        for gid in before.get("finished_prepared", []):
            if feeder.assembler.prepared is not None:
                feeder.assembler.prepared.discard(gid)
        frame = df.orderBy("seq") if "seq" in df.columns else df
        pending: list[tuple[int, int, bytes]] = []  # raw rows since the last transaction boundary
        rows = [(r[0], r[1], r[2]) for r in before.get("tail", [])]
        incoming = ((_lsn_value(r["lsn"]), int(r["xid"]), bytes(r["data"]))
                    for r in frame.select("lsn", "xid", "data").toLocalIterator())
        for source in (iter(rows), incoming):
            for lsn, xid, data in source:
                if isinstance(data, str):
                    data = bytes.fromhex(data)
                pending.append((lsn, xid, data))
                received_before = loop.received
                try:
                    loop.feed(lsn, xid, data)
                except ApplierError as e:
                    e.add_context(batch_id=batch_id)
                    raise
                completed = loop.received > received_before
                if completed and not feeder.assembler.open_transactions():
                    pending = []
        loop.flush()
        self.transactions += loop.transactions
        if self.metrics is not None:
            for table, rows_applied in loop.applier.stats.rows.items():
                self._rows[table] = self._rows.get(table, 0) + rows_applied
            self.metrics.group_applied(time.monotonic() - started, loop.transactions, self._rows)
            if loop.last_commit_time is not None:
                self.metrics.lag(None, max((pg_now() - loop.last_commit_time) / 1e6, 0.0))
            if loop.last_cut is not None:  # the batch's newest consistent cut (the loop has no metrics here)
                self.metrics.cut_recorded(loop.last_cut.lsn, loop.last_cut.commit_time)
        self._save(batch_id, {
            "catalog": feeder.catalog.to_json(),
            "tail": [[lsn, xid, data.hex()] for lsn, xid, data in pending],
            "finished_prepared": finished_prepared,
        })
