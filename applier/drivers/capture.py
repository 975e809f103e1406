"""``capture``: drain a slot into a stored raw log (a Delta table), exactly once, for replay later.

Each round peeks the slot (nothing is confirmed by a peek), keeps the messages up to the last
transaction boundary (Commit, Stream Commit, Prepare, Stream Prepare, Commit/Rollback Prepared),
appends them to the log as one Delta commit tagged with that boundary's end LSN (txnAppId
``applier-capture:<slot>``), and only then advances the slot to it. After a crash between the Delta
commit and the advance, the next peek starts where the previous one did, so its output begins with
the rows already stored; they are dropped up to the boundary whose end LSN the log has recorded.

Rows carry ``seq`` (the position in the log; Delta readers with Spark should order by it), the
decoding ``session`` (one per peek: Relation messages are re-sent at each session start, and a
streamed transaction still open at the end of a session is re-sent from its first segment in the
next, which replay handles) and ``captured_at``.

Relation rows also carry ``catalog`` (NULL on every other row): what the live catalog said of that
relation just after the round was peeked (applier.sources.catalog_lookup.CatalogNote: its name then or
that it was dropped; its columns' attnums when they are the message's columns or, when the catalog has
moved on since (two renames between two captures), when they can only be one set of attnums
(``forced_attnums``); and what became of the relations this log saw under its name before). ``replay``
answers from these notes the questions a live mirror asks the catalog (a rename or a drop, a renamed
column), so that the log replays exactly through them. A log written before this column existed gains it
at the next capture (Delta schema evolution); its older rows read as NULL, and its Relations are replayed
without notes, as before.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import psycopg

from applier.config import CaptureConfig
from applier.errors import ApplierError
from applier.infra.progress import Backlog, Progress, ProgressReport
from applier.lsn import format_lsn
from applier.protocol.decoder import MessageDecoder
from applier.protocol.messages import Relation, transaction_end_lsn
from applier.sink.idempotence import applied_version
from applier.sink.store.sparkbase import idempotent_write
from applier.sources import sql_slot
from applier.sources.catalog_lookup import AttnumRecorder
from applier.sources.heldback import HoldWatch, readable_upto
from applier.sources.serverneeds import check_server_serves
from applier.sources.slothealth import SlotWatch

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from applier.infra.metrics import MirrorMetrics

CAPTURE_SCHEMA = ("lsn STRING, xid BIGINT, data BINARY, seq BIGINT, session STRING, captured_at TIMESTAMP, "
                  "catalog STRING")


def capture_app_id(slot: str) -> str:
    return f"applier-capture:{slot}"


@dataclass
class CaptureSummary:
    rounds: int = 0
    messages: int = 0
    skipped_already_stored: int = 0
    confirmed_lsn: int | None = None
    seconds: float = 0.0

    def lines(self) -> list[str]:
        return [f"messages stored: {self.messages} in {self.rounds} commits",
                f"already stored (skipped after a restart): {self.skipped_already_stored}",
                f"slot confirmed to: {format_lsn(self.confirmed_lsn) if self.confirmed_lsn else '-'}",
                f"time: {self.seconds:.1f}s"]


def _log_state(spark: SparkSession, path: str, app_id: str) -> tuple[int | None, int]:
    """(end LSN the log has recorded, next seq)."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    if not DeltaTable.isDeltaTable(spark, path):
        return None, 0
    recorded = applied_version(spark, path, app_id)
    top = spark.read.format("delta").load(path).agg(F.max("seq")).first()
    return recorded, (int(top[0]) + 1 if top is not None and top[0] is not None else 0)


def _logged_notes(spark: SparkSession, path: str) -> list[str]:
    """The catalog notes the log holds already (none in a log written before they existed), each once
    (a table's Relation is noted again in every round that touches it, mostly alike)."""
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, path):
        return []
    log = spark.read.format("delta").load(path)
    if "catalog" not in log.columns:
        return []
    return [r[0] for r in log.where("catalog IS NOT NULL").select("catalog").distinct().collect()]


def capture(spark: SparkSession, config: CaptureConfig, *, once: bool = True,
            progress: Progress | None = None, stop: threading.Event | None = None,
            poll_seconds: float = 1.0) -> CaptureSummary:
    """Drain the slot into ``config.log_path``; with ``once``, up to the WAL flush position at each
    round's start, until a round finds no new complete transaction."""
    started = time.monotonic()
    say = progress or (lambda _m: None)
    stop = stop or threading.Event()
    src = config.source
    recorded, seq = _log_state(spark, config.log_path, capture_app_id(src.slot))
    summary = CaptureSummary()
    decoder = MessageDecoder()
    notes = AttnumRecorder()
    notes.remember(_logged_notes(spark, config.log_path))
    server = None
    if config.metrics.port is not None:  # /metrics and /healthz while capture runs (applier.infra.metrics)
        from applier.infra.metrics import serve_metrics

        server = serve_metrics(config.metrics.port, config.metrics.host, say,
                               stall_seconds=config.metrics.stall_seconds)
    metrics = server.metrics if server is not None else None
    watch = SlotWatch(src.resolved_dsn(), src.slot, warn_below=src.wal_warning_bytes)
    try:
        with psycopg.connect(src.resolved_dsn(), autocommit=True) as conn:
            check_server_serves(conn, src)  # before the slot: what this server cannot decode is exit 2
            sql_slot.create_slot(conn, src.slot, two_phase=src.two_phase, failover=src.failover)
            _capture_rounds(spark, config, conn, summary, decoder, recorded, seq, once=once, say=say, stop=stop,
                            poll_seconds=poll_seconds, metrics=metrics, watch=watch, notes=notes)
    finally:
        if server is not None:
            server.close()
    summary.seconds = time.monotonic() - started
    return summary


def _capture_rounds(spark: SparkSession, config: CaptureConfig, conn: psycopg.Connection, summary: CaptureSummary,
                    decoder: MessageDecoder, recorded: int | None, seq: int, *, once: bool,
                    say: Callable[[str], None], stop: threading.Event, poll_seconds: float,
                    metrics: MirrorMetrics | None, watch: SlotWatch, notes: AttnumRecorder) -> None:
    """Peek, store, advance, until drained (``once``) or stopped."""
    src = config.source
    options = sql_slot.options_for(src)
    app_id = capture_app_id(src.slot)
    path = config.log_path
    batch = config.batch_changes
    backlog: Backlog | None = None
    hold = HoldWatch(src.resolved_dsn(), src.slot, wait_seconds=src.standby_wait_seconds)
    while not stop.is_set():
        health = watch.check()  # at most every 30 s; a lost slot stops here with the way back
        if metrics is not None:
            metrics.beat()
            if health is not None:
                metrics.slot(health)
        # while the server holds changes back for a standby, a peek past what it released waits inside the call
        target, held = readable_upto(conn, src.slot, sql_slot.current_flush_lsn(conn))
        hold.seen(held)
        rows = [] if held is not None and target <= (summary.confirmed_lsn or recorded or 0) else \
            list(sql_slot.peek(conn, src.slot, options, upto_lsn=target, upto_nchanges=batch))
        cut = None  # index just past the last boundary
        cut_end = None
        skip_to = 0
        relations: dict[int, Relation] = {}  # row index -> its Relation message
        for i, row in enumerate(rows):
            try:
                msg = decoder.decode(row.data, row.lsn)
            except ApplierError as e:
                e.add_context(xid=row.xid)
                raise
            if isinstance(msg, Relation):
                relations[i] = msg
            end = transaction_end_lsn(msg)
            if end is None:
                continue
            if recorded is not None and end <= recorded:
                skip_to = i + 1  # stored before a crash that came ahead of the slot advance
                continue
            cut, cut_end = i + 1, end
        summary.skipped_already_stored += skip_to
        if cut is None or cut_end is None:
            if recorded is not None and skip_to:
                sql_slot.advance(conn, src.slot, recorded)
                summary.confirmed_lsn = recorded
            if not rows and target:  # drained: nothing of ours before ``target``, so the slot need not hold that WAL
                summary.confirmed_lsn = sql_slot.advance(conn, src.slot, target)  # (other databases write it)
                if metrics is not None:
                    metrics.lag(0, 0.0)
            if rows and len(rows) >= batch:
                batch *= 2  # one streamed transaction larger than a round: read further next time
                continue
            if once and held is None:
                break
            if once:
                hold.waited_out()  # held back for a standby: exit 6 after source.standby_wait_seconds
            stop.wait(poll_seconds)
            continue
        stored = rows[skip_to:cut]
        session = str(uuid.uuid4())
        now = datetime.now(UTC)
        described = [i for i in range(skip_to, cut) if i in relations]  # read after the peek: a later catalog
        noted = dict(zip(described, notes.notes(conn, [_described(relations[i]) for i in described],
                                                [rows[i].lsn for i in described]), strict=True))
        data = [(format_lsn(r.lsn), r.xid, r.data, seq + n, session, now, noted.get(skip_to + n))
                for n, r in enumerate(stored)]
        frame = spark.createDataFrame(data, CAPTURE_SCHEMA).coalesce(1)  # one file, rows in log order
        with idempotent_write(spark, app_id, cut_end, f"capture {src.slot} up to {format_lsn(cut_end)}"):
            # a log written before the catalog column existed gains it here
            frame.write.format("delta").mode("append").option("mergeSchema", "true").save(path)
        seq += len(stored)
        recorded = cut_end
        sql_slot.advance(conn, src.slot, cut_end)  # only now: the messages are stored
        summary.rounds += 1
        summary.messages += len(stored)
        summary.confirmed_lsn = cut_end
        batch = config.batch_changes
        behind = max(target - cut_end, 0)
        if backlog is None:  # from the first round: WAL from where it started to the server's position
            backlog = Backlog(max(target - stored[0].lsn, behind))
        say(ProgressReport(f"stored {len(stored)} messages up to {format_lsn(cut_end)} ({summary.messages} in "
                           f"all; {backlog.line(behind)})",
                           {**backlog.fields(behind), "task": "capture", "messages": summary.messages,
                            "lsn": format_lsn(cut_end)}))
        if metrics is not None:
            metrics.captured.inc(len(stored))
            metrics.lag(behind, 0.0)


def _described(rel: Relation) -> tuple[int, tuple[str, str], tuple[str, ...]]:
    return rel.oid, (rel.namespace or "pg_catalog", rel.name), tuple(c.name for c in rel.columns)
