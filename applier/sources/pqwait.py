"""Waiting on libpq directly, for the readers that take a query's answer off ``pgconn`` themselves
(``copy_out``, the slot copies' pieces) instead of through psycopg's generators: its per-message
Python is what they avoid. Waiting happens in ``poll``, which releases the GIL, so the threads that
read side by side, and the server, keep working."""

from __future__ import annotations

import select
from collections.abc import Callable

from psycopg import pq


def wait_socket(pgconn: pq.abc.PGconn, *, write: bool = False, timeout: float | None = None) -> bool:
    """Wait until the connection's socket is readable (or writable); False when ``timeout`` seconds
    passed first."""
    poller = select.poll()
    poller.register(pgconn.socket, select.POLLOUT if write else select.POLLIN)
    return bool(poller.poll(None if timeout is None else int(timeout * 1000)))


def next_result(pgconn: pq.abc.PGconn, wait: Callable[[bool], object]) -> pq.abc.PGresult | None:
    """The next result of the query sent: the query flushed to the server first (``wait(True)`` while
    the socket takes no more), then the answer waited for (``wait(False)``) until libpq holds a whole
    result. None: no more results."""
    while True:
        if pgconn.flush() != 0:
            wait(True)
            continue
        pgconn.consume_input()
        if not pgconn.is_busy():
            return pgconn.get_result()
        wait(False)
