"""Prometheus metrics and a health check for a running mirror (``metrics.port``, ``--metrics-port``).

Why: a mirror runs for months; nobody runs ``status`` by hand at 3 a.m. The numbers that say whether
it is healthy (lag in bytes and seconds, commits and their latency, the slot's WAL state) are served
in Prometheus' text format at ``/metrics``, and ``/healthz`` answers 200 while the loop makes
progress (or is idle and caught up) and 503 when it has not moved for ``metrics.stall_seconds``:
a container's liveness probe. The registry is the run's own (no global state), so two mirrors in
one process, or the tests, do not mix their numbers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import make_wsgi_app

from applier.infra.statuspage import PAGE, CachedStatus

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

WAL_STATES = ("reserved", "extended", "unreserved", "lost")


class SlotWalState(Protocol):
    """What the metrics show of a slot: applier.sources.slothealth.SlotHealth, which reads it from the
    server (a layer above; the metrics only need these two numbers)."""

    @property
    def wal_status(self) -> str | None: ...

    @property
    def safe_wal_size(self) -> int | None: ...

#: The exit code category (applier.commands.exitcodes) of each error kind the mirror recovers from.
ERROR_CATEGORIES = {"reconnect": "unavailable", "resync": "bad_data", "park": "bad_data", "set_aside": "bad_data"}


class MirrorMetrics:
    """The mirror's numbers, updated by the loop, the follower and the slot watch."""

    def __init__(self, *, stall_seconds: float = 300.0) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.consecutive_stops = Gauge(
            "applier_consecutive_stopped_runs", "runs of this mirror before this one that stopped on the same "
            "error, in a row (0: the last run ended well); more than 1 is a stall a restart will not mend",
            registry=r)
        self.parked = Gauge("applier_parked_tables", "tables set aside (apply.on_table_error: park): their changes "
                            "are left out until `applier resync --table` copies them again", registry=r)
        self.lag_bytes = Gauge("applier_lag_bytes", "WAL bytes between the server's position and the applied one",
                               registry=r)
        self.lag_seconds = Gauge("applier_lag_seconds", "now minus the source commit time of the last applied "
                                 "transaction (0 when caught up)", registry=r)
        self.transactions = Counter("applier_transactions", "source transactions applied", registry=r)
        self.commits = Counter("applier_group_commits", "groups applied (one Delta commit per table touched)",
                               registry=r)
        self.rows = Counter("applier_rows", "rows upserted or deleted, per table", ["table"], registry=r)
        self.commit_seconds = Histogram("applier_group_commit_seconds", "time to apply one group",
                                        buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300), registry=r)
        self.group_size = Histogram("applier_group_transactions", "transactions per applied group",
                                    buckets=(1, 2, 5, 10, 50, 100, 500, 1000, 10_000, 100_000), registry=r)
        self.skipped = Counter("applier_transactions_skipped", "transactions skipped (apply.skip_transactions)",
                               registry=r)
        self.wal_status = Gauge("applier_slot_wal_status", "1 for the slot's current wal_status", ["status"],
                                registry=r)
        self.safe_wal_size = Gauge("applier_slot_safe_wal_size_bytes", "WAL the server may still write before the "
                                   "slot exceeds max_slot_wal_keep_size (-1: unlimited)", registry=r)
        self.last_progress = Gauge("applier_last_progress_timestamp_seconds", "when the loop last moved (Unix time)",
                                   registry=r)
        self.copy_rows = Gauge("applier_copy_rows", "rows copied so far by the initial copy or a table sync, per "
                               "table", ["table"], registry=r)
        self.copy_rows_estimated = Gauge("applier_copy_rows_estimated", "the table's rows as pg_class.reltuples "
                                         "estimated them when its copy started", ["table"], registry=r)
        self.errors = Counter("applier_errors", "errors the mirror recovered from by itself, by the exit code "
                              "category they would otherwise have stopped it with (unavailable: 3, bad_data: 4) and "
                              "kind: reconnect (the source connection was lost), resync (a table copied again after "
                              "a schema change)", ["category", "kind"], registry=r)
        self.table_commits = Counter("applier_table_commits", "Delta commits that changed rows, per table", ["table"],
                                     registry=r)
        self.captured = Counter("applier_captured_messages", "raw messages stored by capture", registry=r)
        self.sync_waiting = Gauge("applier_table_sync_waiting", "1 while the table's copy (a table sync) waits for "
                                  "its slot, whose creation waits for transactions open on the server; its changes "
                                  "are held meanwhile", ["table"], registry=r)
        self.sync_blockers = Gauge("applier_table_sync_blocking_transactions", "transactions a waiting table sync's "
                                   "slot waits for, by kind: prepared (pg_prepared_xacts) or open "
                                   "(pg_stat_activity)", ["kind"], registry=r)
        self.cut_lsn = Gauge("applier_cut_lsn", "end LSN of the newest consistent cut (applier cut), as a number",
                             registry=r)
        self.cut_lag_seconds = Gauge("applier_cut_lag_seconds", "now minus the source commit time of the newest "
                                     "consistent cut's last transaction: how old the newest state a reader can read "
                                     "across tables is (it grows while the source commits nothing)", registry=r)
        self._cut_time: float | None = None
        self.cut_lag_seconds.set_function(
            lambda: max(time.time() - self._cut_time, 0.0) if self._cut_time is not None else float("nan"))
        self.stall_seconds = stall_seconds
        self._moved = time.monotonic()
        self._rows_seen: dict[str, int] = {}
        self._sync_tables: set[str] = set()

    def beat(self) -> None:
        """The loop moved: read a frame, applied a group, or found the stream idle and caught up."""
        self._moved = time.monotonic()
        self.last_progress.set(time.time())

    def healthy(self) -> bool:
        return time.monotonic() - self._moved < self.stall_seconds

    def group_applied(self, seconds: float, transactions: int, rows: Mapping[str, int]) -> None:
        """One applied group; ``rows`` is the run's cumulative count per table (the increase is counted)."""
        self.commits.inc()
        self.transactions.inc(transactions)
        self.commit_seconds.observe(seconds)
        self.group_size.observe(transactions)
        for table, total in rows.items():
            grown = total - self._rows_seen.get(table, 0)
            if grown > 0:
                self.rows.labels(table).inc(grown)
                self.table_commits.labels(table).inc()
            self._rows_seen[table] = total
        self.beat()

    def cut_recorded(self, lsn: int, commit_time: datetime | None) -> None:
        """A consistent cut was recorded (applier.sink.cuts); its lag is computed when scraped."""
        self.cut_lsn.set(lsn)
        if commit_time is not None:
            self._cut_time = commit_time.timestamp()

    def lag(self, behind: int | None, seconds: float) -> None:
        if behind is not None:
            self.lag_bytes.set(behind)
        self.lag_seconds.set(seconds)

    def copied(self, table: str, rows: int, estimated: int) -> None:
        self.copy_rows.labels(table).set(rows)
        self.copy_rows_estimated.labels(table).set(estimated)
        self.beat()  # a long copy is progress, not a stall

    def sync_waits(self, tables: Iterable[str], prepared: int, running: int) -> None:
        """What a table sync waits for now (no tables: none waits)."""
        waiting = set(tables)
        for table in self._sync_tables - waiting:
            self.sync_waiting.labels(table).set(0)
        for table in waiting:
            self.sync_waiting.labels(table).set(1)
        self._sync_tables = waiting
        self.sync_blockers.labels("prepared").set(prepared)
        self.sync_blockers.labels("open").set(running)

    def error(self, kind: str) -> None:
        self.errors.labels(ERROR_CATEGORIES[kind], kind).inc()

    def slot(self, health: SlotWalState) -> None:
        for status in WAL_STATES:
            self.wal_status.labels(status).set(1 if health.wal_status == status else 0)
        self.safe_wal_size.set(-1 if health.safe_wal_size is None else health.safe_wal_size)


class MetricsServer:
    """``/metrics`` and ``/healthz`` on ``port`` (0: a free one; ``port`` says which), on a daemon thread;
    with ``status`` (``applier status --json``'s object, made on demand) also the status page at ``/``
    and its data at ``/status.json`` (applier.infra.statuspage)."""

    def __init__(self, metrics: MirrorMetrics, port: int, host: str = "127.0.0.1", *,
                 status: Callable[[], str] | None = None) -> None:
        from wsgiref.simple_server import WSGIRequestHandler, make_server

        class _Quiet(WSGIRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
                pass  # scrapes every few seconds would flood the log

        prometheus = make_wsgi_app(metrics.registry)

        page = None if status is None else CachedStatus(status)

        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            where = environ.get("PATH_INFO")
            if page is not None and where in ("/", "/status"):
                start_response("200 OK", [("Content-Type", "text/html; charset=utf-8"), ("Cache-Control", "no-store")])
                return [PAGE.encode()]
            if page is not None and where == "/status.json":
                try:
                    body = page()
                except Exception as e:  # noqa: BLE001 - the page says why, the mirror goes on
                    start_response("500 Internal Server Error", [("Content-Type", "text/plain; charset=utf-8")])
                    return [f"the status could not be read: {e}\n".encode()]
                start_response("200 OK", [("Content-Type", "application/json"), ("Cache-Control", "no-store")])
                return [body.encode()]
            if where == "/healthz":
                ok = metrics.healthy()
                start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
                return [b"ok\n" if ok else f"stalled: no progress for {metrics.stall_seconds:g} s\n".encode()]
            return prometheus(environ, start_response)  # type: ignore[no-any-return]

        self.metrics = metrics
        self._server: WSGIServer = make_server(host, port, app, handler_class=_Quiet)
        self.port = int(self._server.server_port)
        self._thread = threading.Thread(target=self._server.serve_forever, name="applier-metrics", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def serve_metrics(port: int, host: str, say: Callable[[str], None], *, stall_seconds: float = 300.0,
                  metrics: MirrorMetrics | None = None, status: Callable[[], str] | None = None) -> MetricsServer:
    """Serve ``metrics`` (new ones when not given) on ``host:port`` and say where; a port that cannot be
    bound is a ConfigError (exit 2): the user's setting is wrong, not the source."""
    from applier.errors import ConfigError

    metrics = metrics or MirrorMetrics(stall_seconds=stall_seconds)
    metrics.beat()
    try:
        server = MetricsServer(metrics, port, host, status=status)
    except OSError as e:
        raise ConfigError(f"cannot serve metrics on {host}:{port}: {e}", port=port) from None
    page = f", the status page at http://{host}:{server.port}/" if status is not None else ""
    say(f"metrics at http://{host}:{server.port}/metrics, health at /healthz{page}")
    return server
