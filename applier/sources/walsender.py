"""Read a logical slot through the streaming replication protocol (psycopg 3, ``replication=database``).

The connection speaks the walsender's command language: ``CREATE_REPLICATION_SLOT ... (SNAPSHOT
'export')`` (to copy tables at exactly the slot's starting point) and ``START_REPLICATION SLOT ...
LOGICAL``, after which the server streams CopyData frames (see applier.protocol.replication). The
slot's ``confirmed_flush_lsn`` only moves when we say so in a standby status update, and we only say
so for what is durably applied: :meth:`WalSenderStream.confirm` is the one place that happens.
"""

from __future__ import annotations

import array
import fcntl
import logging
import select
import termios
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg
from psycopg import pq

from applier.errors import TransientSourceError
from applier.lsn import format_lsn, parse_lsn
from applier.protocol import wire
from applier.protocol.replication import (
    XLOG_DATA_TAG,
    XLOG_PAYLOAD_AT,
    PrimaryKeepalive,
    XLogData,
    parse_copy_data,
    standby_status_update,
    xlog_payload,
)
from applier.sources.failures import stream_error
from applier.sources.sql_slot import PINNED_SESSION_SETTINGS

log = logging.getLogger(__name__)



def _unread_bytes(sock: int) -> int:
    """The bytes the kernel holds for us on ``sock``, not read yet (FIONREAD)."""
    held = array.array("i", [0])
    fcntl.ioctl(sock, termios.FIONREAD, held)
    return held[0]


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@dataclass(frozen=True, slots=True)
class CreatedSlot:
    """What CREATE_REPLICATION_SLOT returned: where decoding starts and the snapshot that matches it."""

    name: str
    consistent_point: int
    snapshot_name: str | None


class WalSenderStream:
    """One ``replication=database`` connection: create a slot, stream it, confirm applied positions."""

    def __init__(self, dsn: str, *, status_interval: float = 10.0) -> None:
        options = " ".join(f"-c {k}={v}" for k, v in PINNED_SESSION_SETTINGS.items() if k != "client_encoding")
        try:
            self.conn = psycopg.connect(dsn, replication="database", autocommit=True, options=options,
                                        client_encoding="UTF8")
        except psycopg.Error as e:
            raise stream_error(f"cannot open a replication connection: {e}", e.sqlstate,
                               isinstance(e, psycopg.OperationalError) and e.sqlstate is None) from None
        self.pgconn = self.conn.pgconn
        self.status_interval = status_interval
        self.streaming = False
        self.confirmed = 0  # what we last told the server is flushed
        self.server_wal_end = 0  # the walsender's sent position, from its keepalives
        self.last_keepalive: float = 0.0
        self._last_status = 0.0
        self.frames_read = 0  # CopyData frames taken from libpq
        self.socket_reads = 0  # reads of the socket into libpq's buffer that brought something
        # The connection is shared with the heartbeat thread (start_heartbeat): whoever touches it
        # through read() or send_status() holds this lock. read_message() (the catch-up's hot reader)
        # does not take it: while a hot reader holds the stream (hot_reader) the heartbeat pauses, the
        # reader keeps the connection alive itself, and a confirm from another thread is left to it.
        self._lock = threading.RLock()
        self._heartbeat: threading.Thread | None = None
        self._heartbeat_stop = threading.Event()
        self._hot_reader: threading.Thread | None = None
        self._status_pending = False  # a confirm not sent yet: sent at the next status check

    def _command(self, sql: str) -> pq.abc.PGresult:
        res = self.pgconn.exec_(sql.encode("utf-8"))
        if res.status not in (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK, pq.ExecStatus.COPY_BOTH):
            message = res.error_message.decode("utf-8", "replace").strip()
            state = res.error_field(pq.DiagnosticField.SQLSTATE)
            raise stream_error(f"replication command failed: {message}", state.decode() if state else None,
                               self.pgconn.status == pq.ConnStatus.BAD, command=sql.split(" (")[0])
        return res

    def create_slot(self, slot: str, *, two_phase: bool, export_snapshot: bool,
                    temporary: bool = False, failover: bool = False) -> CreatedSlot:
        """Create the pgoutput slot. With ``export_snapshot`` the snapshot stays usable (``SET
        TRANSACTION SNAPSHOT``) until this connection runs its next command. A ``temporary`` slot is
        dropped by the server when this connection closes (table sync and a resumed copy use one for
        their snapshot)."""
        options = [f"SNAPSHOT {_literal('export' if export_snapshot else 'nothing')}"]
        if two_phase:
            options.append("TWO_PHASE true")
        if failover:  # PostgreSQL 17+
            options.append("FAILOVER true")
        kind = "TEMPORARY LOGICAL" if temporary else "LOGICAL"
        res = self._command(f"CREATE_REPLICATION_SLOT {_ident(slot)} {kind} pgoutput ({', '.join(options)})")
        values = [res.get_value(0, i) for i in range(res.nfields)]
        point = parse_lsn((values[1] or b"").decode())
        snapshot = values[2].decode() if values[2] else None
        return CreatedSlot(slot, point, snapshot)

    def set_failover(self, slot: str, failover: bool) -> None:
        """ALTER_REPLICATION_SLOT ... (FAILOVER): PostgreSQL 17+, on a slot no one reads."""
        self._command(f"ALTER_REPLICATION_SLOT {_ident(slot)} (FAILOVER {'true' if failover else 'false'})")

    def drop_slot(self, slot: str) -> None:
        self._command(f"DROP_REPLICATION_SLOT {_ident(slot)} WAIT")

    def start(self, slot: str, options: Mapping[str, str], start_lsn: int = 0) -> None:
        """START_REPLICATION from ``start_lsn`` (0/0: from the slot's confirmed position)."""
        opts = ", ".join(f"{_ident(k)} {_literal(v)}" for k, v in options.items())
        self._command(f"START_REPLICATION SLOT {_ident(slot)} LOGICAL {format_lsn(start_lsn)} ({opts})")
        self.streaming = True
        self._last_status = time.monotonic()

    def read(self, timeout: float) -> XLogData | PrimaryKeepalive | None:
        """The next frame, or None when nothing came within ``timeout`` seconds (0: only what has
        already arrived, without waiting). Keepalives that ask for a reply are answered here (with the
        confirmed position, never more)."""
        with self._lock:
            data = self._next(timeout)
            if data is None:
                return None
            frame = parse_copy_data(bytes(data))
            if isinstance(frame, PrimaryKeepalive):
                self._keepalive(frame)
            self._status_if_due()
            return frame

    def start_heartbeat(self) -> None:
        """From now on a thread sends the status update the walsender expects every ``status_interval``
        seconds whenever the reader does not (it is waiting for a group's Delta commits, or for Spark
        to start): without it the server ends the connection after ``wal_sender_timeout`` (60 s by
        default) of silence, and the run reconnects and reads the same changes again. Only our
        confirmed position is sent, so the heartbeat never lets the slot move past what is applied."""
        if self._heartbeat is not None:
            return
        self._heartbeat = threading.Thread(target=self._beat, name="applier-walsender-heartbeat", daemon=True)
        self._heartbeat.start()

    def _beat(self) -> None:
        tick = min(1.0, self.status_interval / 4)
        while not self._heartbeat_stop.wait(tick):
            with self._lock:
                if not self.streaming:
                    return
                if self._hot_reader is not None:
                    continue  # it keeps the connection alive itself
                try:
                    self._status_if_due()
                except TransientSourceError:
                    return  # the reader meets the broken connection itself and reconnects

    @contextmanager
    def hot_reader(self) -> Iterator[None]:
        """The calling thread reads the stream with ``read_message`` (the executor catch-up's reader)
        until the block ends; then the heartbeat takes over.

        libpq is not safe for two threads on one connection, and the hot reader takes no lock, so a
        ``confirm`` from another thread meanwhile (the catch-up's commits) only records the position:
        the reader sends it at its next status check, and the heartbeat, if started, pauses. When the
        reader stops, at the end of the backlog, the executors may still be committing for minutes:
        the heartbeat answers the walsender from then on. Without it the server ended the connection after
        ``wal_sender_timeout`` and the catch-up's confirm went to a closed socket, unseen."""
        with self._lock:  # a status update under way (the heartbeat's, a confirm) ends first
            self._hot_reader = threading.current_thread()
        try:
            yield
        finally:
            with self._lock:
                self._hot_reader = None
            self.start_heartbeat()

    def read_message(self, timeout: float, *, gather: float = 0.0) -> tuple[int, bytes] | PrimaryKeepalive | None:
        """``read`` for a hot loop (the catch-up's reader, ~10 M frames): an XLogData frame comes as
        ``(wal_start, payload)`` without an object of its own, and the clock is looked at every 256 of
        them. A third of the reader's time went into building XLogData objects.

        ``gather`` (seconds): when libpq's buffer is empty and the socket holds nothing either, wait
        that long before waiting on the socket. A reader that keeps up with the walsender waits on
        the socket for every frame: the walsender, finding room in the socket every time, sends each
        frame on its own and wakes the reader for it, and both burn CPU on system calls and wake-ups
        (bench/stream_read.py: some runs read 1M messages in 4,000 socket reads, others in 470,000).
        With a 1 ms gather the reader waits on the socket only when the walsender has been quiet that
        long. It used to gather only after a read that brought fewer than 64 frames, and then waited
        on the socket after every larger read: the catch-up's walsender then used 5.6-8.6 CPU-s for
        1M changes, against 4.5-4.9 for PostgreSQL's own subscriber. Reading what the socket holds
        without waiting, and gathering whenever it is empty: 4.8-6.5 CPU-s, and the catch-up's median
        went from 0.83x PostgreSQL's (14 runs) to 1.00x (9 runs; bench/RESULTS.md). For bulk reading
        only: it adds up to ``gather`` of latency per read.
        """
        data = self._next(timeout, gather)
        if data is None:
            return None
        if (message := xlog_payload(data)) is not None:
            if not self.frames_read & 255:
                self._status_if_due()
            return message
        frame = parse_copy_data(bytes(data))  # a keepalive, or a damaged frame (raises with its offset)
        if isinstance(frame, XLogData):
            return frame.wal_start, frame.payload
        self._keepalive(frame)
        self._status_if_due()
        return frame

    def read_buffered(self, lsns: list[int], datas: list[bytes], limit: int) -> PrimaryKeepalive | None:
        """Up to ``limit`` XLogData frames that libpq holds already, appended as ``(wal_start, payload)``
        to ``lsns`` and ``datas``, without waiting for the socket: read_message's work in one loop for
        a run of frames (the catch-up's reader: a call and a tuple per frame were a third of its CPU).
        Stops at the first other frame: a keepalive is handled as read_message handles it, and returned;
        a damaged frame raises as there; the end of the stream is left to the next ``read_message``,
        which raises with the server's word."""
        get, tag, head, unpack = self.pgconn.get_copy_data, XLOG_DATA_TAG, XLOG_PAYLOAD_AT, wire.UINT64.unpack_from
        append_lsn, append_data = lsns.append, datas.append
        got = 0
        keepalive = None
        while got < limit:
            n, data = get(1)
            if n <= 0:
                break
            if data[0] == tag and n >= head:
                append_lsn(unpack(data, 1)[0])
                append_data(bytes(data[head:]))
                got += 1
                continue
            self.frames_read += 1
            frame = parse_copy_data(bytes(data))  # raises, with its offset, for a damaged frame
            if isinstance(frame, XLogData):  # (not reached: the test above takes every XLogData)
                append_lsn(frame.wal_start)
                append_data(frame.payload)
                got += 1
                continue
            self._keepalive(frame)
            keepalive = frame
            break
        self.frames_read += got
        self._status_if_due()
        return keepalive

    def _keepalive(self, frame: PrimaryKeepalive) -> None:
        self.server_wal_end = max(self.server_wal_end, frame.wal_end)
        self.last_keepalive = time.monotonic()
        if frame.reply_requested:
            self.send_status()

    def _next(self, timeout: float, gather: float = 0.0) -> bytes | memoryview | None:
        """The next CopyData payload, or None when nothing came within ``timeout`` seconds (``gather``:
        see read_message)."""
        deadline: float | None = None
        while True:
            n, data = self.pgconn.get_copy_data(1)
            if n > 0:
                self.frames_read += 1
                return data
            if n == -1:
                res = self.pgconn.get_result()
                detail = res.error_message.decode("utf-8", "replace").strip() if res is not None else ""
                state = res.error_field(pq.DiagnosticField.SQLSTATE) if res is not None else None
                error = stream_error(f"the server ended the replication stream: {detail or 'COPY done'}",
                                     state.decode() if state else None, self.pgconn.status == pq.ConnStatus.BAD)
                raise error
            if n < -1:
                raise TransientSourceError("replication stream broke: "
                                           + self.pgconn.error_message.decode("utf-8", "replace").strip())
            self._status_if_due()
            if gather and not _unread_bytes(self.pgconn.socket):
                time.sleep(gather)  # let frames pile up in the socket: one read takes many
            gather = 0.0  # once per frame asked for
            if deadline is None:
                deadline = time.monotonic() + timeout
            remaining = deadline - time.monotonic()
            ready, _, _ = select.select([self.pgconn.socket], [], [], min(max(remaining, 0.0), 1.0))
            if ready:
                try:
                    self.pgconn.consume_input()
                except psycopg.OperationalError as e:
                    raise TransientSourceError(f"replication connection lost: {e}") from None
                self.socket_reads += 1
            elif remaining <= 0:
                return None

    def reading_note(self) -> str:
        """How the reading went, for a catch-up's line (applier.drivers.backlog)."""
        return f"{self.frames_read / max(self.socket_reads, 1):.0f} frames per socket read"

    def keep_alive(self) -> None:
        """While not reading (waiting for something else): the status update the walsender expects every
        ``status_interval`` seconds, so that it does not time the connection out."""
        self._status_if_due()

    def _status_if_due(self) -> None:
        if self._status_pending or time.monotonic() - self._last_status >= self.status_interval:
            self.send_status()

    def send_status(self, *, reply_requested: bool = False) -> None:
        """Tell the server our position: written = flushed = applied = the last confirmed LSN."""
        with self._lock:
            self._status_pending = False  # before the position is read: a confirm after it sets it again
            try:
                self.pgconn.put_copy_data(standby_status_update(self.confirmed, reply_requested=reply_requested))
                self.pgconn.flush()
            except psycopg.OperationalError as e:
                raise TransientSourceError(f"replication connection lost: {e}") from None
            self._last_status = time.monotonic()

    def confirm(self, lsn: int) -> None:
        """Everything up to ``lsn`` is durably applied: the slot may release it."""
        if lsn > self.confirmed:
            self.confirmed = lsn
            with self._lock:
                reader = self._hot_reader
                if reader is not None and reader is not threading.current_thread():
                    self._status_pending = True  # the reader sends it (hot_reader)
                else:
                    self.send_status()

    def close(self) -> None:
        self._heartbeat_stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join()
        if self.streaming and not self.conn.closed:
            try:
                self.send_status()
                self.pgconn.put_copy_end()
                self.pgconn.flush()
                self._drain()
            except (TransientSourceError, psycopg.Error, OSError) as e:  # the connection had broken
                self._lost_at_close(str(e))
        self.streaming = False
        self.conn.close()

    def _lost_at_close(self, detail: str) -> None:
        """Nothing is wrong in Delta, but the slot may not have taken the last confirm: say so, since
        the next run then reads the same transactions again (and skips them, as already applied)."""
        log.warning("the replication connection had ended before it was closed (%s): the server may not "
                    "have taken the last confirmed position, %s; the next session reads again what "
                    "follows the slot's position and skips what Delta already holds", detail or "no detail",
                    format_lsn(self.confirmed))

    def _drain(self, timeout: float = 10.0) -> None:
        """Read what the server still sends until it ends the COPY too. Why: a walsender still sending
        when the socket closes fails its write and exits before it reads the status update waiting
        behind that data, so the last confirm was lost now and then (the next run read again
        transactions it had applied, and skipped them). The server answers our CopyDone only after it
        has processed the status update sent before it."""
        deadline = time.monotonic() + timeout
        while True:
            n, _ = self.pgconn.get_copy_data(1)
            if n > 0:
                continue
            if n == -1:  # the COPY is over: the server's CopyDone, or the error it ended the stream with
                res = self.pgconn.get_result()
                if res is not None and res.status == pq.ExecStatus.FATAL_ERROR:
                    self._lost_at_close(res.error_message.decode("utf-8", "replace").strip())
                return
            if n < -1:  # the connection broke
                self._lost_at_close(self.pgconn.error_message.decode("utf-8", "replace").strip())
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            ready, _, _ = select.select([self.pgconn.socket], [], [], min(remaining, 1.0))
            if ready:
                self.pgconn.consume_input()
