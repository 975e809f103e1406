"""A long-running job (``mirror`` or ``capture`` following its slot) on a thread of the test, with the
test's workload on the main thread: the job's progress lines and its error are kept, waits have one
deadline and report both, and the job is stopped and joined however the test ends."""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from applier.sources.rawlog_writer import write_raw_log
from applier.sources.sql_slot import create_slot, peek, pgoutput_options


class Background:
    """``job(stop, progress)`` running on a daemon thread until ``stop`` is set."""

    def __init__(self, job: Callable[[threading.Event, Callable[[str], None]], object], *,
                 seconds: float = 120.0) -> None:
        self.stop = threading.Event()
        self.lines: list[str] = []  # the job's progress, for a failure to say where it was
        self.errors: list[BaseException] = []
        self.deadline = time.monotonic() + seconds
        self._job = job
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self._job(self.stop, lambda m: self.lines.append(f"{time.monotonic():.1f} {m}"))
        except BaseException as e:  # noqa: BLE001 - reported by wait_for and at the end
            self.errors.append(e)

    def wait_for(self, condition: Callable[[], object], what: str, *, every: float = 0.2) -> None:
        """Until ``condition()`` is true; fails at the deadline, or at once when the job failed."""
        while not condition():
            assert not self.errors, (what, self.errors, self.lines[-10:])
            assert time.monotonic() < self.deadline, (f"timed out waiting for {what}", self.lines[-10:])
            time.sleep(every)

    @contextmanager
    def running(self) -> Iterator[Background]:
        self._thread.start()
        try:
            yield self
        finally:
            self.stop.set()
            self._thread.join(60)
        assert not self.errors, (self.errors, self.lines[-10:])


def captured_log(pg, tmp_path: Path, create: str, statements: list[str], *, publication: str = "kp",
                 table: str = "k", slot: str = "s") -> Path:
    """``create`` run, ``table`` published and slotted, the statements run, the slot's messages stored
    as a raw log (what ``applier capture`` writes) at ``tmp_path/log.parquet``."""
    with pg.connect() as conn:
        conn.execute(create)
        conn.execute(f"CREATE PUBLICATION {publication} FOR TABLE {table}")
        create_slot(conn, slot)
        for statement in statements:
            conn.execute(statement)
        rows = [(m.lsn, m.xid, bytes(m.data)) for m in peek(conn, slot, pgoutput_options(publication))]
    log = tmp_path / "log.parquet"
    write_raw_log(log, rows)
    return log


def scrape_metrics(port: int) -> dict[str, float]:
    """A running job's /metrics as {'name{labels}': value}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {name: float(value) for name, value in
            (line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))}
