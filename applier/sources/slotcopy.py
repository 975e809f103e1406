"""A backlog read through SQL from temporary copies of the slot, in pieces, for a catch-up.

Why: a walsender sends each message on its own (a send and a receive system call per message, and a
look at the clock and at the client's replies), about 3 µs of the server's CPU a change on the standard
machine, and a catch-up reads at that pace; ``pg_logical_slot_get_binary_changes`` decodes the same
WAL into the same pgoutput messages in well under 1 µs a change and hands them over as one result
(bench/RESULTS.md, thirty-eighth session). PostgreSQL's own subscription reads a walsender, so a
backlog read this way is caught up faster than it can be there, and the server spends less CPU on it.

Why a copy, read with ``get``: ``peek`` always starts at the slot's confirmed position, so reading a
backlog in pieces with it would decode it again for every piece, and one peek of all of it is held
by the server until the last message is decoded (nothing overlaps). ``get`` moves its slot, and the
mirror's slot must only move once the Delta commits exist. A temporary copy
(``pg_copy_logical_replication_slot``) starts where the slot is, moves piece by piece, and is dropped
with its session, a crash included; the caller advances the slot itself after its commits
(``sql_slot.advance``), before a walsender reads it.

Why two copies: a get hands over nothing until it has decoded its whole piece (the function's result
is materialized), so with one copy the server's decoding and this process's work take turns. The pieces
are cut at WAL positions chosen up front, so the second copy can decode the next piece while the rows
of this one are taken apart: it is first advanced (``pg_replication_slot_advance``: a fast-forward
decoding without output, far cheaper than a get) to the piece's start. A get stops after the first
record that ends at or past its ``upto_lsn`` and outputs the transactions whose commit record starts at
or past the slot's confirmed position; an advance stops after the same record and confirms exactly the
position asked. So the piece ``[a, b)`` holds exactly the transactions whose commit record starts in
it, provided no record starts at or past ``b`` and still ends the get: a position inside a record or
at its end, never inside a page's header. Every cut is therefore placed in the middle of a WAL page
(``piece_end``). Without a second free slot one copy reads the pieces in turn.

Why without streaming: a get that stops inside a streamed transaction would have the next one
stream it again from its start (a new decoding session), so every transaction comes whole, at its
commit; a piece then always ends where no transaction is open. Prepared transactions (``two_phase``)
are not read this way at all: their Prepare belongs to the slot's own decoding (the caller checks).

The pieces grow (``FIRST_PIECE_BYTES`` of WAL, doubling up to ``STEADY_PIECE_BYTES``): the first
arrives soon, and then the server decodes a piece in about the time this process takes one apart. Each
get or advance decodes from its copy's ``restart_lsn``, which moves only at an ``xl_running_xacts``
record (every 15 s of a busy server), so a piece decodes the WAL before it again, without output
(decoding 95% of a 1M-change backlog again took 0.15 s; bench/RESULTS.md): a piece is never smaller
than that stretch (``piece_size``), up to ``LARGEST_PIECE_BYTES``. A thread of its own fetches the
pieces and takes the rows apart, while the catch-up surveys and folds what the last ones brought.
"""

from __future__ import annotations

import logging
import queue
import struct
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import NoReturn

import psycopg
from psycopg import pq, sql

from applier.errors import SourceError
from applier.lsn import format_lsn
from applier.protocol.replication import PrimaryKeepalive
from applier.sources.failures import stream_error
from applier.sources.pqwait import next_result, wait_socket
from applier.sources.sql_slot import flat_options, pin_session

log = logging.getLogger(__name__)

#: the WAL the first piece covers (1M changes of narrow rows are about 120 MiB of WAL): it is decoded
#: before anything else can start, so it is small
FIRST_PIECE_BYTES = 8 << 20

#: the pieces after it double up to this size: about what the catch-up takes apart while the server
#: decodes the next one (bigger pieces leave this process waiting for the server, smaller ones pay the
#: decoding of the WAL before them again more often)
STEADY_PIECE_BYTES = 32 << 20

#: no piece covers more WAL: a piece is held by the server (in ``WORK_MEM``, then a temporary file)
#: until its rows are all taken
LARGEST_PIECE_BYTES = 1 << 30

#: copies of the slot read at once: while this process takes one piece apart, the server decodes the next
COPIES = 2

#: messages handed over at a time (a run for the catch-up's survey)
CHUNK_MESSAGES = 4096

#: what a message fetched and not yet taken costs beyond its data (its bytes object, its LSN, two list
#: slots), for ``queued_bytes``
MESSAGE_COST = 100

#: the fewest chunks fetched ahead, whatever ``queued_bytes`` says
FEWEST_CHUNKS = 4

#: The share of ``apply.memory_budget_mb`` the messages fetched ahead may hold (``queued_bytes``): while
#: the server decodes the next piece (about a second a million changes), the catch-up works on them, so a
#: smaller share leaves it waiting (bench/RESULTS.md, 2026-12-07).
FETCHED_BUDGET_DIVISOR = 3

#: a piece's rows, one message each: its LSN (int8) and data (bytea)
_ROWS = ("COPY (SELECT (lsn - '0/0'::pg_lsn)::int8, data FROM {changes}) TO STDOUT (FORMAT binary)")

#: COPY's binary format: the signature, flags and header extension length, then rows; the end is -1
_SIGNATURE = b"PGCOPY\n\xff\r\n\x00"
_HEADER = struct.Struct(">11sii")
#: a row of two fields: their count, then the LSN (int8) and the message (bytea), each with its length
_ROW = struct.Struct(">hiqi")
_TRAILER = b"\xff\xff"

#: what the server holds of a piece before it spills to a temporary file, in each copy's session (the two
#: together hold what one copy did before there were two)
WORK_MEM = "128MB"


class SlotCopyUnavailable(Exception):
    """The slot could not be copied (no free slot, an invalidated slot, no privilege): the caller reads
    the walsender instead."""


def copy_slot_name(slot: str) -> str:
    """A temporary copy's name: the slot's and a random part, within PostgreSQL's 63 characters. Not the
    process's id alone: a catch-up retried at once after a lost connection could meet the copy of the
    attempt before, which the server drops only once that session's backend has ended."""
    suffix = f"_copy_{uuid.uuid4().hex[:12]}"
    return slot[:63 - len(suffix)] + suffix


def piece_size(k: int, behind: int) -> int:
    """The WAL piece ``k`` covers, when its copy decodes ``behind`` bytes before the piece's start again
    (from its ``restart_lsn``, without output): never less than that, so that what a piece costs the
    server beyond its own decoding stays about its size. Pure, for the tests."""
    ramp = min(FIRST_PIECE_BYTES << min(k, 16), STEADY_PIECE_BYTES)
    return min(LARGEST_PIECE_BYTES, max(ramp, behind))


def piece_end(start: int, size: int, target: int, page: int) -> int:
    """Where a piece of about ``size`` bytes from ``start`` ends: ``target`` if it reaches it, else in
    the middle of a WAL page of ``page`` bytes (``wal_block_size``), never in a page's header (see the
    module: a cut there could give the record after it to both pieces). Pure, for the tests."""
    end = (start + size) // page * page + page // 2
    if end <= start:
        end += page
    return min(end, target)


class _Copy:
    """One temporary copy of the slot, on a connection of its own (a get holds its session until its
    result is taken)."""

    def __init__(self, dsn: str, slot: str) -> None:
        self.name = copy_slot_name(slot)
        try:
            self.conn = psycopg.connect(dsn, autocommit=True)
        except psycopg.Error as e:
            raise SlotCopyUnavailable(f"cannot connect: {e}") from None
        try:
            row = self.conn.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s",
                                    (slot,)).fetchone()
            if row is not None and row[0] is not None:  # (its walsender refuses a second reader; so must this)
                raise SlotCopyUnavailable(f"slot {slot!r} is in use by the process with PID {row[0]}")
            pin_session(self.conn)
            self.conn.execute(sql.SQL("SET work_mem = {}").format(sql.Literal(WORK_MEM)))
            self.conn.execute("SELECT pg_copy_logical_replication_slot(%s, %s, true)", (slot, self.name))
            self.confirmed = self.restart = 0  # (at least: see ``look``)
            self.look()
            row = self.conn.execute("SELECT current_setting('wal_block_size')::int").fetchone()
        except psycopg.Error as e:
            self.conn.close()
            raise SlotCopyUnavailable(f"copying slot {slot!r} failed: {e.diag.message_primary or e}") from None
        except SlotCopyUnavailable:
            self.conn.close()
            raise
        assert row is not None  # (a setting every server has)
        self.page: int = row[0]

    def look(self) -> None:
        """Where the copy is: ``confirmed``, where its next get outputs from, and ``restart``, where its
        next get or advance starts to decode (no query may be in flight)."""
        row = self.conn.execute("SELECT (confirmed_flush_lsn - '0/0'::pg_lsn)::int8, "
                                "(restart_lsn - '0/0'::pg_lsn)::int8 FROM pg_replication_slots "
                                "WHERE slot_name = %s", (self.name,)).fetchone()
        if row is not None:
            self.confirmed, self.restart = row

    def drop(self) -> None:
        """Drop the copy (the server drops a temporary slot with its session anyway) and close."""
        try:
            if not self.conn.closed and self.conn.pgconn.transaction_status == pq.TransactionStatus.IDLE:
                self.conn.execute("SELECT pg_drop_replication_slot(%s)", (self.name,))
        except psycopg.Error as e:
            log.debug("dropping the temporary copy %s: %s", self.name, e)
        finally:
            self.conn.close()


class SlotCopyReader:
    """The messages of ``slot`` from its confirmed position up to ``target``, in order, as a catch-up's
    stream (applier.drivers.backlog.StreamRanges reads it as it reads a walsender): ``read_buffered``
    hands over what was fetched, and the stream ends when the copies have nothing more before ``target``.
    ``exhausted`` then says that every transaction committed before ``target`` was read."""

    def __init__(self, dsn: str, slot: str, options: Mapping[str, str], *, target: int,
                 queued_bytes: int = 64 << 20, copies: int = 0) -> None:
        """``queued_bytes``: about what the messages fetched and not yet taken may hold (a share of
        ``apply.memory_budget_mb``): the fetching thread waits past it while the catch-up is behind.
        ``copies``: how many copies read at once (``COPIES`` unless given); fewer when the server has no
        free slot for more."""
        self.slot = slot
        self.target = target
        # every piece's get asks with these (no streaming: see the module)
        self.flat_options = flat_options({k: v for k, v in options.items() if k != "streaming"})
        self.copies = [_Copy(dsn, slot)]
        first = self.copies[0]
        self.start = first.confirmed
        self.ends: list[int] = []  # of the pieces asked so far
        self._behind: list[int] = []  # what each piece's get decodes again (for the log)
        wanted = (copies or COPIES) if piece_end(self.start, piece_size(0, 0), target, first.page) < target else 1
        for _ in range(wanted - 1):
            try:
                self.copies.append(_Copy(dsn, slot))
            except SlotCopyUnavailable as e:  # (no free slot: one copy reads every piece in turn)
                log.info("reading the backlog with %d copies of slot %s, not more: %s", len(self.copies), slot, e)
                break
        self.messages = 0  # fetched
        self.pieces = 0  # fetched (each a get: a decoding session of its own)
        self.cpu_seconds = 0.0  # of the fetching thread (taking the rows apart), once it ended
        self.exhausted = False
        chunk_bytes = CHUNK_MESSAGES * (MESSAGE_COST + 64)  # (a guess of the data: the bound is loose)
        self._chunks: queue.Queue[tuple[list[int], list[bytes]] | BaseException | None] = \
            queue.Queue(maxsize=max(FEWEST_CHUNKS, queued_bytes // chunk_bytes))
        self._closing = threading.Event()
        self._ended = False
        self._lsns: list[int] = []  # the chunk being handed over, from ``_at``
        self._datas: list[bytes] = []
        self._at = 0
        self._thread = threading.Thread(target=self._fetch, name="applier-slot-copy", daemon=True)
        self._thread.start()

    # --- the fetching thread ----------------------------------------------------------------------

    def _fetch(self) -> None:
        try:
            ends = self.ends
            while not self._closing.is_set():
                # each copy decoding its next piece
                while len(ends) < self.pieces + len(self.copies) and (ends[-1] if ends else self.start) < self.target:
                    self._send(len(ends))
                if self.pieces == len(ends):
                    self.exhausted = True  # the last piece ended at the target
                    break
                self._receive(self.pieces)
                self.pieces += 1
        except BaseException as e:  # noqa: BLE001  # handed to the reading thread
            self._put(e)
        finally:
            self.cpu_seconds = time.thread_time()
            self._put(None)

    def _put(self, item: tuple[list[int], list[bytes]] | BaseException | None) -> None:
        while not self._closing.is_set():
            try:
                self._chunks.put(item, timeout=0.25)
                return
            except queue.Full:
                continue

    def _send(self, i: int) -> None:
        """Ask piece ``i`` of its copy, which ends where ``piece_size`` and ``piece_end`` say: the copy
        advanced to the piece's start first (unless it is there or past it: a record longer than a
        piece), then a get up to its end, as one query."""
        copy = self.copies[i % len(self.copies)]
        begin = self.ends[-1] if self.ends else self.start
        self.ends.append(piece_end(begin, piece_size(i, begin - copy.restart), self.target, copy.page))
        self._behind.append(begin - copy.restart)
        query = sql.SQL(_ROWS).format(changes=sql.SQL(
            "pg_logical_slot_get_binary_changes({}, {}::pg_lsn, NULL, VARIADIC {}::text[])").format(
            sql.Literal(copy.name), sql.Literal(format_lsn(self.ends[i])), sql.Literal(self.flat_options)))
        if begin > copy.confirmed:
            start = sql.Literal(format_lsn(begin))
            query = sql.SQL(
                "SELECT pg_replication_slot_advance(slot_name, {start}::pg_lsn) FROM pg_replication_slots "
                "WHERE slot_name = {name} AND confirmed_flush_lsn < {start}::pg_lsn; {get}").format(
                start=start, name=sql.Literal(copy.name), get=query)
        copy.conn.pgconn.send_query(query.as_bytes(copy.conn))

    def _receive(self, i: int) -> None:
        """Piece ``i``'s messages, handed over in chunks."""
        copy = self.copies[i % len(self.copies)]
        pgconn = copy.conn.pgconn
        wanted = time.monotonic()
        while True:  # (the advance's result first, when it was asked)
            res = self._result(copy)
            if res is None or res.status != pq.ExecStatus.TUPLES_OK:
                break
        if res is None or res.status != pq.ExecStatus.COPY_OUT:
            self._fail(copy, res)
        ready = time.monotonic()
        got = self._take(copy)
        res = pgconn.get_result()
        if res is None or res.status != pq.ExecStatus.COMMAND_OK:
            self._fail(copy, res)
        while pgconn.get_result() is not None:
            pass
        copy.look()
        self.messages += got
        begin = self.ends[i - 1] if i else self.start
        log.debug("piece %d of the backlog, %s to %s (%.1f MiB of WAL, copy %d, decoding from %.1f MiB before "
                  "it): waited %.2f s for the server, %d messages taken apart in %.2f s", i, format_lsn(begin),
                  format_lsn(self.ends[i]), (self.ends[i] - begin) / (1 << 20), i % len(self.copies),
                  self._behind[i] / (1 << 20), ready - wanted, got, time.monotonic() - ready)

    def _take(self, copy: _Copy) -> int:
        """The rows of the COPY on ``copy``, taken apart and handed over; returns how many. The server
        sends a row a message of the protocol, so each is taken on its own: a call, a header, a slice."""
        pgconn = copy.conn.pgconn
        get, unpack, row_size = pgconn.get_copy_data, _ROW.unpack_from, _ROW.size
        lsns: list[int] = []
        datas: list[bytes] = []
        add_lsn, add_data = lsns.append, datas.append
        got = 0
        n, data = self._copy_data(copy)
        if n < _HEADER.size or _HEADER.unpack_from(data, 0)[0] != _SIGNATURE:
            raise SourceError(f"reading the copy of slot {self.slot!r}: not COPY's binary format "
                              f"(starts {bytes(data[:11])!r})", slot=self.slot)
        at = _HEADER.size + _HEADER.unpack_from(data, 0)[2]
        while True:
            if at >= n:
                n, data = get(1)
                if n > row_size:  # (the common case: a whole row)
                    fields, _, lsn, size = unpack(data)
                    if fields == 2 and row_size + size == n:
                        at = n
                        add_lsn(lsn)
                        add_data(data[row_size:].tobytes())
                        if len(lsns) >= CHUNK_MESSAGES:
                            got += len(lsns)
                            self._put((lsns, datas))
                            lsns, datas = [], []
                            add_lsn, add_data = lsns.append, datas.append
                        continue
                at = 0
                if n == 0:
                    self._wait(copy)
                    continue
                if n < 0:
                    break
            if n - at < row_size:  # the end: a field count of -1 (two bytes)
                if bytes(data[at:n]) != _TRAILER:
                    raise SourceError(f"reading the copy of slot {self.slot!r}: {n - at} bytes of a row at byte "
                                      f"{at} of a message", slot=self.slot)
                at = n
                continue
            fields, _, lsn, size = unpack(data, at)
            start = at + row_size
            if fields != 2 or start + size > n:
                self._misfit(fields, at)
            add_lsn(lsn)
            add_data(bytes(data[start:start + size]))
            at = start + size
        if n != -1:
            raise stream_error(f"reading the copy of slot {self.slot!r} failed: "
                               + pgconn.error_message.decode("utf-8", "replace").strip(), None, True, slot=self.slot)
        if lsns:
            got += len(lsns)
            self._put((lsns, datas))
        return got

    def _copy_data(self, copy: _Copy) -> tuple[int, memoryview]:
        """The COPY's first message, waited for."""
        while True:
            n, data = copy.conn.pgconn.get_copy_data(1)
            if n != 0:
                if n < 0:
                    self._fail(copy, copy.conn.pgconn.get_result())
                return n, data
            self._wait(copy)

    def _misfit(self, fields: int, at: int) -> NoReturn:
        raise SourceError(f"reading the copy of slot {self.slot!r}: a row of {fields} fields at byte {at} of a "
                          "message, expected 2 (or a row longer than its message)", slot=self.slot)

    def _result(self, copy: _Copy) -> pq.abc.PGresult | None:
        """The next result of the query sent, waited for without holding the GIL (the server decodes
        the whole piece before it answers)."""
        return next_result(copy.conn.pgconn, lambda write: self._wait(copy, write=write))

    def _wait(self, copy: _Copy, *, write: bool = False) -> None:
        pgconn = copy.conn.pgconn
        while not wait_socket(pgconn, write=write, timeout=0.25):
            if self._closing.is_set():
                raise SourceError(f"reading the copy of slot {self.slot!r}: stopped", slot=self.slot)
        try:
            pgconn.consume_input()
        except psycopg.OperationalError as e:
            raise stream_error(f"reading the copy of slot {self.slot!r}: connection lost: {e}", None, True,
                               slot=self.slot) from None

    def _fail(self, copy: _Copy, res: pq.abc.PGresult | None) -> NoReturn:
        message = res.error_message.decode("utf-8", "replace").strip() if res is not None else "no result"
        state = res.error_field(pq.DiagnosticField.SQLSTATE) if res is not None else None
        while res is not None:
            res = copy.conn.pgconn.get_result()
        raise stream_error(f"reading the copy of slot {self.slot!r} failed: {message}",
                           state.decode() if state else None, copy.conn.pgconn.status == pq.ConnStatus.BAD,
                           slot=self.slot)

    # --- what the catch-up's reader calls (as on applier.sources.walsender.WalSenderStream) --------

    def read_buffered(self, lsns: list[int], datas: list[bytes], limit: int) -> PrimaryKeepalive | None:
        """What was fetched and not taken, appended to ``lsns`` and ``datas`` (a chunk, at most ``limit``
        messages of it): waits for it (the server may be decoding a piece), so nothing is appended only
        at the end."""
        if self._at >= len(self._lsns):
            chunk = self._next_chunk()
            if chunk is None:
                return None
            (self._lsns, self._datas), self._at = chunk, 0
        at, end = self._at, min(self._at + limit, len(self._lsns))
        lsns += self._lsns[at:end]
        datas += self._datas[at:end]
        self._at = end
        return None

    def _next_chunk(self) -> tuple[list[int], list[bytes]] | None:
        while not self._ended:
            try:
                item = self._chunks.get(timeout=0.25)
            except queue.Empty:
                if self._closing.is_set():
                    return None
                continue
            if item is None:
                self._ended = True
            elif isinstance(item, BaseException):
                self._ended = True
                raise item
            else:
                return item
        return None

    def read_message(self, timeout: float, *, gather: float = 0.0) -> tuple[int, bytes] | PrimaryKeepalive | None:
        """The next message, or None at the end (``timeout`` and ``gather`` are the walsender's)."""
        lsns: list[int] = []
        datas: list[bytes] = []
        self.read_buffered(lsns, datas, 1)
        return (lsns[0], datas[0]) if lsns else None

    @contextmanager
    def hot_reader(self) -> Iterator[None]:
        yield

    def keep_alive(self) -> None:
        """Nothing to answer: the server waits for the next query."""

    def reading_note(self) -> str:
        copies = "a copy" if len(self.copies) == 1 else f"{len(self.copies)} copies"
        return f"in {self.pieces} pieces from {copies} of the slot, {self.cpu_seconds:.1f} CPU-s taking them apart"

    def close(self) -> None:
        """Stop fetching, and drop the copies."""
        self._closing.set()
        self._thread.join()
        for copy in self.copies:
            copy.drop()
